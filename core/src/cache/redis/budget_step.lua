-- BudgetStore::budget_step: read the bucket, decide, write it back, in one
-- atomic step.
-- KEYS[1]: the bucket (a string "balance:stamp").
-- ARGV: now (µs, or '' for the server's TIME), command ('deposit' |
--       'withdraw'), deposit, refill per µs, max balance (millionths of a
--       retry), ttl (ms), max_ahead (µs).
-- Returns {granted, balance, stamp, at, healed}.
-- The decision is decide::budget::step's, line for line; a caller's stamp is
-- clamped as decide::budget::clamp_budget_stamp clamps it.
local k = KEYS[1]
local store_now = server_now()
local now = store_now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
  local ceiling = store_now + tonumber(ARGV[7])
  if now > ceiling then
    now = ceiling
  end
end
local deposit = tonumber(ARGV[3])
local rate = tonumber(ARGV[4])
local cap = tonumber(ARGV[5])


local balance, stamp, healed = 0, now, 0
local raw = read_string(k)
if raw then
  local b, s = string.match(raw, '^([^:]*):([^:]*)$')
  local nb, ns = stored_number(b), stored_number(s)
  if nb and ns then
    balance, stamp = nb, ns
    if balance > cap then
      balance = cap
    end
  else
    healed = 1
  end
end

local room = cap - balance
local elapsed = now - stamp
if elapsed < 0 then
  elapsed = 0
end
if elapsed > room then
  elapsed = room
end
local refill = elapsed * rate
if refill > room then
  refill = room
end
balance = balance + refill
if now > stamp then
  stamp = now
end
local granted = 1
if ARGV[2] == 'deposit' then
  balance = balance + deposit
  if balance > cap then
    balance = cap
  end
elseif balance >= 1000000 then
  balance = balance - 1000000
else
  granted = 0
end
redis.call('SET', k, int(balance) .. ':' .. int(stamp), 'PX', ARGV[6])
return {granted, int(balance), int(stamp), int(now), healed}
