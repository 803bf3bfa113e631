-- BreakerStore::breaker_step: read the breaker's four keys, run one transition
-- of breaker::machine::step, write what it says, in one atomic step.
-- KEYS: state, failures, opened_at, half_open_calls (one hash tag, one slot).
-- ARGV: command ('allow' | 'success' | 'failure' | 'reset'), now (µs, or ''
--       for the server's TIME), failure_threshold, recovery_timeout (µs),
--       recovery_timeout (ms, rounded up), half_open_max_calls.
-- Returns strings: before, after, allowed ('1'/'0'), at (µs), the four writes
-- (see below), then the four raw values read, so the adapter can re-run
-- machine::step in Rust and refuse to report a decision the two disagree on.

local command = ARGV[1]
local now = now_from(ARGV[2])
local threshold = tonumber(ARGV[3])
local recovery_us = tonumber(ARGV[4])
local recovery_ms = tonumber(ARGV[5])
local max_probes = tonumber(ARGV[6])

-- BreakerSnapshot::decode, field by field.
local raw_state = redis.call('GET', KEYS[1])
local raw_failures = redis.call('GET', KEYS[2])
local raw_opened = redis.call('GET', KEYS[3])
local raw_probes = redis.call('GET', KEYS[4])

-- A u32 as Rust's parser reads it: optional '+', digits, at most 4294967295.
local function parse_u32(s)
  if not s then return nil end
  local digits = string.match(s, '^%+?(%d+)$')
  if not digits then return nil end
  digits = string.gsub(digits, '^0+', '')
  if digits == '' then return 0 end
  if #digits > 10 or (#digits == 10 and digits > '4294967295') then return nil end
  return tonumber(digits)
end

-- Timestamp::parse_secs: "<secs>[.<up to 6 digits>]" to µs.
local function parse_secs(s)
  if not s then return nil end
  local whole, frac = string.match(s, '^(%d+)%.(%d*)$')
  if not whole then
    whole = string.match(s, '^(%d+)$')
    frac = ''
  end
  if not whole or #frac > 6 then return nil end
  local micros = tonumber(frac .. string.rep('0', 6 - #frac))
  -- Like Timestamp::parse_secs, refuse what overflows u64 microseconds
  -- (18446744073709.551615 s); larger values that fit are far-future instants,
  -- and a double compares them correctly even where it rounds them.
  local digits = string.gsub(whole, '^0+', '')
  if #digits > 14 or (#digits == 14 and (digits > '18446744073709'
      or (digits == '18446744073709' and micros > 551615))) then
    return nil
  end
  return tonumber(whole) * 1000000 + micros
end

-- effective_state: missing and unreadable both read as closed.
local before = 'closed'
if raw_state == 'closed' or raw_state == 'open' or raw_state == 'half_open' then
  before = raw_state
end
local failures = parse_u32(raw_failures)
local opened_at = parse_secs(raw_opened)
local probes = parse_u32(raw_probes) or 0

-- Writes, one per key, as machine::Writes: 'keep', 'delete', or a value
-- ('create' or a count for the failure counter).
local w_state, w_failures, w_opened, w_probes = 'keep', 'keep', 'keep', 'keep'
local function clear_all()
  w_state, w_failures, w_opened, w_probes = 'delete', 'delete', 'delete', 'delete'
end

-- machine::recovery_due: no opened_at means recovery is due.
local function recovery_due()
  if not opened_at then return true end
  return now - opened_at >= recovery_us
end

local after, allowed = before, 1
if command == 'reset' then
  clear_all()
  after = 'closed'
elseif command == 'allow' then
  if before == 'open' then
    if recovery_due() then
      -- The transitioning call is itself the first probe.
      w_state, w_probes = 'half_open', '1'
      after = 'half_open'
    else
      allowed = 0
    end
  elseif before == 'half_open' then
    if probes < max_probes then
      w_probes = int(probes + 1)
    else
      allowed = 0
    end
  end
elseif command == 'success' then
  if before == 'closed' then
    if failures then w_failures = 'delete' end
  elseif before == 'half_open' then
    clear_all()
    after = 'closed'
  end
  -- Open: a late report changes nothing.
elseif command == 'failure' then
  if before == 'closed' then
    local count = 1
    if failures then count = math.min(failures + 1, 4294967295) end
    if count >= threshold then
      w_state, w_opened, w_failures, w_probes = 'open', int(now), 'delete', 'delete'
      after = 'open'
    elseif failures then
      w_failures = int(count)
    else
      w_failures = 'create'
    end
  elseif before == 'half_open' then
    w_state, w_opened, w_probes = 'open', int(now), 'delete'
    after = 'open'
  end
  -- Open: a late report never pushes the recovery out.
else
  return redis.error_reply('unknown breaker command ' .. tostring(command))
end

-- Carry the writes out. Values are stored without a TTL except the failure
-- counter, created with recovery_timeout and never refreshed.
if w_state == 'delete' then
  redis.call('DEL', KEYS[1])
elseif w_state ~= 'keep' then
  redis.call('SET', KEYS[1], w_state)
end
if w_failures == 'delete' then
  redis.call('DEL', KEYS[2])
elseif w_failures == 'create' then
  if recovery_ms > 0 then
    redis.call('SET', KEYS[2], '1', 'PX', int(recovery_ms))
  else
    redis.call('DEL', KEYS[2])
  end
elseif w_failures ~= 'keep' then
  redis.call('SET', KEYS[2], w_failures, 'KEEPTTL')
end
if w_opened == 'delete' then
  redis.call('DEL', KEYS[3])
elseif w_opened ~= 'keep' then
  -- Timestamp's Display form, which Timestamp::parse_secs reads back.
  local t = tonumber(w_opened)
  redis.call('SET', KEYS[3], string.format('%d.%06d', math.floor(t / 1000000), t % 1000000))
end
if w_probes == 'delete' then
  redis.call('DEL', KEYS[4])
elseif w_probes ~= 'keep' then
  redis.call('SET', KEYS[4], w_probes)
end

return {before, after, tostring(allowed), int(now), w_state, w_failures, w_opened, w_probes,
        raw_state, raw_failures, raw_opened, raw_probes}
