-- TokenStore::acquire_with_tokens: the request slot and the token
-- reservation, decided and recorded together in one atomic step.
-- KEYS[1]: the tenant's hit window (sorted set); KEYS[2]: its token ledger
-- (sorted set: score = the reservation's stamp, member = the entry's stored
-- form "at:seq:tokens:lease_end", lease_end empty once settled).
-- ARGV: now (µs, or '' for the server's TIME), window (µs), limit,
--       ttl (µs), ttl (ms, rounded up), max_ahead (µs), tokens, token limit,
--       lease (µs).
-- Returns {1, remaining, tokens_used, at, seq, clamped, healed} when admitted,
-- {0, by, requests_used, tokens_used, retry_after_us, at, clamped, healed}
-- when refused, by being 1 requests, 2 tokens, 3 both, 4 too large.
-- The decisions are decide::window::decide's and decide::tokens::decide_tokens',
-- combined as decide::tokens::combine combines them, line for line.
local w, l = KEYS[1], KEYS[2]
local healed = heal_window(w)
if not window_readable(l) then
  redis.call('DEL', l)
  healed = 1
end
local store_now = server_now()
local window = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local ttl_us, ttl_ms = tonumber(ARGV[4]), tonumber(ARGV[5])
local ask, token_limit, lease = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local now, clamped = slot_stamp(ARGV[1], store_now, window, tonumber(ARGV[6]))
local since = now - window
if since < 0 then
  since = 0
end

-- The slot, as decide::window::decide.
local count = redis.call('ZCOUNT', w, int(since), MAX_SCORE)
local slot_ok = count < limit
local wait_for_slot = 0
if not slot_ok then
  wait_for_slot = slot_wait(w, since, now, window, count, limit)
end

-- The ledger: prune as hits are pruned, then decide_tokens.
redis.call('ZREMRANGEBYSCORE', l, '-inf', '(' .. int(store_now - ttl_us))
local tokens_state = 0 -- 0 fits, 1 refused, 2 too large
local used, token_wait, seq = 0, 0, 0
if ask > token_limit then
  tokens_state = 2
else
  local frees = {}
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', l, int(since), '+inf')) do
    local a, q, t, e = string.match(member, '^([^:]*):([^:]*):([^:]*):([^:]*)$')
    local at, tokens = stored_number(a), stored_number(t)
    local lease_end = nil
    local sound = at ~= nil and stored_number(q) ~= nil and tokens ~= nil
    if sound and e ~= '' then
      lease_end = stored_number(e)
      sound = lease_end ~= nil
    end
    if not sound then
      redis.call('ZREM', l, member)
      healed = 1
    else
      if at == now then
        seq = seq + 1
      end
      local counted = tokens
      if lease_end and lease_end < now then
        counted = 0
      end
      if counted > 0 then
        used = used + counted
        local free_at = at + window + 1
        if lease_end and lease_end + 1 < free_at then
          free_at = lease_end + 1
        end
        frees[#frees + 1] = {free_at, counted}
      end
    end
  end
  if used + ask > token_limit then
    tokens_state = 1
    table.sort(frees, function(x, y)
      if x[1] ~= y[1] then
        return x[1] < y[1]
      end
      return x[2] < y[2]
    end)
    local left = used
    token_wait = window
    for _, f in ipairs(frees) do
      left = left - f[2]
      if left + ask <= token_limit then
        token_wait = f[1] - now
        if token_wait < 1 then
          token_wait = 1
        end
        break
      end
    end
  end
end
-- seq counts every sound entry at `now`, including those before `since`
-- (none: since <= now) — and entries at `now` are always in range.

if slot_ok and tokens_state == 0 then
  record(w, now, ttl_us, ttl_ms, store_now)
  local member = int(now) .. ':' .. int(seq) .. ':' .. int(ask) .. ':' .. int(now + lease)
  redis.call('ZADD', l, int(now), member)
  if redis.call('PTTL', l) < ttl_ms then
    redis.call('PEXPIRE', l, int(ttl_ms))
  end
  return {1, limit - count - 1, used, now, seq, clamped, healed}
end
if redis.call('PTTL', w) == -1 then
  redis.call('PEXPIRE', w, ARGV[5])
end
if tokens_state == 2 then
  return {0, 4, count, 0, window, now, clamped, healed}
end
if not slot_ok and tokens_state == 0 then
  return {0, 1, count, used, wait_for_slot, now, clamped, healed}
end
if slot_ok then
  return {0, 2, count, used, token_wait, now, clamped, healed}
end
local wait = wait_for_slot
if token_wait > wait then
  wait = token_wait
end
return {0, 3, count, used, wait, now, clamped, healed}
