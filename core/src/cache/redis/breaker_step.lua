-- BreakerStore::breaker_step: read the breaker's seven keys, run one
-- transition of decide::breaker::step, write what it says, in one atomic step.
-- KEYS: state, failures, opened_at, probes, cooldown_until, openings,
--       closed_at (one hash tag, one slot).
-- ARGV: command ('allow' | 'success' | 'failure' | 'release' | 'reset' |
--       'cooldown'), origin ('untracked' | 'call' | 'probe' | ''), probe
--       episode (µs or ''), probe seq (or ''), now (µs, or '' for the server's
--       TIME), failure_threshold, recovery_timeout (µs), recovery_timeout (ms,
--       rounded up), half_open_max_calls, probe_lease (µs), cooldown duration
--       (µs; '0' unless the command is 'cooldown'), max_recovery_timeout (µs).
-- Returns strings: before, after, permit ('-' | 'call' | 'probe:<ep>:<seq>' |
-- 'refused:<state>:<retry µs>:<reason>'), at (µs), expired probes, the seven
-- writes (see below), then the seven raw values read, so the adapter can re-run
-- machine::step in Rust and refuse to report a decision the two disagree on.

local command = ARGV[1]
local origin = ARGV[2]
local probe_episode = tonumber(ARGV[3])
local probe_seq = tonumber(ARGV[4])
local now = now_from(ARGV[5])
local threshold = tonumber(ARGV[6])
local recovery_us = tonumber(ARGV[7])
local recovery_ms = tonumber(ARGV[8])
local max_probes = tonumber(ARGV[9])
local lease_us = tonumber(ARGV[10])
local cooldown_us = tonumber(ARGV[11])
local max_recovery_us = tonumber(ARGV[12])

-- BreakerSnapshot::decode, field by field. A key a foreign writer gave
-- another type reads as a marker text that decodes as unreadable, here and
-- in Rust alike, and is replaced by the next write to it.
local raw_state = read_string(KEYS[1])
local raw_failures = read_string(KEYS[2])
local raw_opened = read_string(KEYS[3])
local raw_probes = read_string(KEYS[4])
local raw_cooldown = read_string(KEYS[5])
local raw_openings = read_string(KEYS[6])
local raw_closed_at = read_string(KEYS[7])

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

-- machine::ProbeLeases::decode: "<episode> <issued> <seq>:<expires> ...",
-- single spaces, 1 to 16 digits per number, at most 2^53, u32 counts, at most
-- MAX_HALF_OPEN_CALLS (1000) leases; anything else is nil.
local function stored_u32(s)
  local n = stored_number(s)
  if not n or n > 4294967295 then return nil end
  return n
end
local function decode_leases(raw)
  if not raw then return nil end
  local tokens = {}
  local start = 1
  while true do
    local space = string.find(raw, ' ', start, true)
    if not space then
      tokens[#tokens + 1] = string.sub(raw, start)
      break
    end
    tokens[#tokens + 1] = string.sub(raw, start, space - 1)
    start = space + 1
  end
  if #tokens < 2 then return nil end
  local episode = stored_number(tokens[1])
  local issued = stored_u32(tokens[2])
  if not episode or not issued then return nil end
  if #tokens - 2 > 1000 then return nil end
  local live = {}
  for i = 3, #tokens do
    local colon = string.find(tokens[i], ':', 1, true)
    if not colon then return nil end
    local seq = stored_u32(string.sub(tokens[i], 1, colon - 1))
    local expires = stored_number(string.sub(tokens[i], colon + 1))
    if not seq or not expires then return nil end
    live[#live + 1] = {seq, expires}
  end
  return {episode = episode, issued = issued, live = live}
end
local function encode_leases(l)
  local parts = {int(l.episode), int(l.issued)}
  for _, lease in ipairs(l.live) do
    parts[#parts + 1] = int(lease[1]) .. ':' .. int(lease[2])
  end
  return table.concat(parts, ' ')
end
-- ProbeLeases::holds: the probe's episode, and a lease of its seq live at now.
local function holds(l)
  if not l or l.episode ~= probe_episode then return false end
  for _, lease in ipairs(l.live) do
    if lease[1] == probe_seq and lease[2] > now then return true end
  end
  return false
end

-- effective_state: missing and unreadable both read as closed.
local before = 'closed'
if raw_state == 'closed' or raw_state == 'open' or raw_state == 'half_open' then
  before = raw_state
end
local failures = parse_u32(raw_failures)
local opened_at = parse_secs(raw_opened)
local leases = decode_leases(raw_probes)
-- machine::decode_cooldown: stored_number, or nil.
local cooldown_until = stored_number(raw_cooldown)
-- machine::decode_openings: a stored u32, or nil.
local openings = stored_u32(raw_openings)

-- Writes, one per key, as machine::Writes: 'keep', 'delete', or a value
-- ('create' or a count for the failure counter, an encoded record for probes).
local w_state, w_failures, w_opened, w_probes, w_cooldown = 'keep', 'keep', 'keep', 'keep', 'keep'
local w_openings, w_closed_at = 'keep', 'keep'
local function clear_all()
  w_state, w_failures, w_opened, w_probes, w_openings = 'delete', 'delete', 'delete', 'delete', 'delete'
end
-- Opens the circuit now, its n-th consecutive opening.
local function open_now(n)
  w_state, w_opened, w_failures, w_probes = 'open', int(now), 'delete', 'delete'
  w_openings = int(n)
end

-- machine::open_period: recovery_timeout doubled per consecutive opening
-- after the first (at most 64 times; exact in a double, as a power of two),
-- capped at max_recovery_timeout.
local function open_period()
  if max_recovery_us <= recovery_us then return recovery_us end
  local doublings = (openings or 1) - 1
  if doublings < 0 then doublings = 0 end
  if doublings > 64 then doublings = 64 end
  local period = recovery_us * 2 ^ doublings
  if period > max_recovery_us then period = max_recovery_us end
  return period
end

-- machine::recovery_due: no opened_at means recovery is due.
local function recovery_due()
  if not opened_at then return true end
  return now - opened_at >= open_period()
end

local function first_probe()
  local l = {episode = now, issued = 1, live = {{1, now + lease_us}}}
  return encode_leases(l), 'probe:' .. int(now) .. ':1'
end

-- machine::decides_episode.
local function decides_episode()
  if origin == 'untracked' then return true end
  if origin == 'call' then return false end
  return holds(leases)
end

local after, permit, expired = before, '-', 0
if command == 'allow' and cooldown_until and cooldown_until > now then
  -- A cooldown refuses whatever the circuit would say, and changes nothing.
  permit = 'refused:' .. before .. ':' .. int(cooldown_until - now) .. ':cooldown'
elseif command == 'reset' then
  clear_all()
  w_cooldown = 'delete'
  w_closed_at = 'delete'
  after = 'closed'
elseif command == 'cooldown' then
  -- machine::cooldown_end: at most 2^53 µs; never shortens a stored cooldown.
  local till = math.min(now + cooldown_us, 9007199254740992)
  if till > now and (not cooldown_until or till > cooldown_until) then
    w_cooldown = int(till)
  end
elseif command == 'allow' then
  if before == 'closed' then
    permit = 'call'
  elseif before == 'open' then
    if recovery_due() then
      -- The transitioning call is itself the first probe.
      w_state = 'half_open'
      w_probes, permit = first_probe()
      after = 'half_open'
    else
      local elapsed = now - opened_at
      if elapsed < 0 then elapsed = 0 end
      local wait = open_period() - elapsed
      if wait < 0 then wait = 0 end
      permit = 'refused:open:' .. int(wait) .. ':circuit'
    end
  else
    if not leases then
      w_probes, permit = first_probe()
    else
      local kept = {}
      for _, lease in ipairs(leases.live) do
        if lease[2] > now then kept[#kept + 1] = lease end
      end
      expired = #leases.live - #kept
      if #kept < max_probes then
        local seq = math.min(leases.issued + 1, 4294967295)
        kept[#kept + 1] = {seq, now + lease_us}
        w_probes = encode_leases({episode = leases.episode, issued = seq, live = kept})
        permit = 'probe:' .. int(leases.episode) .. ':' .. int(seq)
      else
        local earliest = nil
        for _, lease in ipairs(kept) do
          if not earliest or lease[2] < earliest then earliest = lease[2] end
        end
        local wait = 0
        if earliest then wait = earliest - now end
        permit = 'refused:half_open:' .. int(wait) .. ':circuit'
      end
    end
  end
elseif command == 'success' or command == 'failure' then
  if before == 'closed' then
    if origin ~= 'probe' then
      if command == 'success' then
        if failures then w_failures = 'delete' end
      else
        local count = 1
        if failures then count = math.min(failures + 1, 4294967295) end
        if count >= threshold then
          open_now(1)
          after = 'open'
        elseif failures then
          w_failures = int(count)
        else
          w_failures = 'create'
        end
      end
    end
  elseif before == 'half_open' then
    if decides_episode() then
      if command == 'success' then
        clear_all()
        -- The close a slow start ramps from, in this step.
        w_closed_at = int(now)
        after = 'closed'
      else
        -- One more consecutive opening: the circuit never closed.
        open_now(math.min((openings or 1) + 1, 4294967295))
        after = 'open'
      end
    end
  end
  -- Open: a late report changes nothing, and never pushes the recovery out.
elseif command == 'release' then
  if before == 'half_open' and holds(leases) then
    local kept = {}
    for _, lease in ipairs(leases.live) do
      if lease[1] ~= probe_seq then kept[#kept + 1] = lease end
    end
    w_probes = encode_leases({episode = leases.episode, issued = leases.issued, live = kept})
  end
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
if w_cooldown == 'delete' then
  redis.call('DEL', KEYS[5])
elseif w_cooldown ~= 'keep' then
  -- It expires with the cooldown (whole milliseconds, rounded up), on the
  -- server's clock.
  local ttl_ms = math.floor((tonumber(w_cooldown) - now + 999) / 1000)
  redis.call('SET', KEYS[5], w_cooldown, 'PX', int(ttl_ms))
end

if w_openings == 'delete' then
  redis.call('DEL', KEYS[6])
elseif w_openings ~= 'keep' then
  redis.call('SET', KEYS[6], w_openings)
end

if w_closed_at == 'delete' then
  redis.call('DEL', KEYS[7])
elseif w_closed_at ~= 'keep' then
  redis.call('SET', KEYS[7], w_closed_at)
end

return {before, after, permit, int(now), tostring(expired), w_state, w_failures, w_opened, w_probes, w_cooldown,
        w_openings, w_closed_at, raw_state, raw_failures, raw_opened, raw_probes, raw_cooldown, raw_openings,
        raw_closed_at}
