-- TokenStore::settle_tokens: set one reservation to the tokens actually used
-- and end its lease.
-- KEYS[1]: the token ledger. ARGV: the reservation's stamp (µs), its seq,
-- the actual tokens. Returns 1 when the ledger held it, 0 otherwise.
local l = KEYS[1]
if not window_readable(l) then
  return 0
end
local prefix = ARGV[1] .. ':' .. ARGV[2] .. ':'
for _, member in ipairs(redis.call('ZRANGEBYSCORE', l, ARGV[1], ARGV[1])) do
  if string.sub(member, 1, #prefix) == prefix then
    redis.call('ZREM', l, member)
    redis.call('ZADD', l, ARGV[1], prefix .. ARGV[3] .. ':')
    return 1
  end
end
return 0
