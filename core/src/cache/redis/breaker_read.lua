-- BreakerStore::breaker_read: the seven raw values and the instant to judge
-- them at, in one round trip, changing nothing.
-- KEYS: state, failures, opened_at, probes, cooldown_until, openings,
--       closed_at.
-- ARGV[1]: now (µs, or '' for the server's TIME).
-- A key of another type reads as breaker_step reads it (read_string).
return {int(now_from(ARGV[1])), read_string(KEYS[1]), read_string(KEYS[2]), read_string(KEYS[3]),
        read_string(KEYS[4]), read_string(KEYS[5]), read_string(KEYS[6]), read_string(KEYS[7])}
