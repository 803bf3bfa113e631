-- KeyValue::increment with the TTL applied on creation only, in one step (a
-- client dying between INCR and PEXPIRE would leave a counter that never
-- decays).
-- KEYS[1]: the value's key.
-- ARGV[1]: the TTL in ms ('' for none; '0' means the counter is dead at birth).
-- Returns {'ok', value} | {'not_integer'} | {'overflow'}; a failed increment
-- changes nothing.
local k = KEYS[1]
local current = redis.call('GET', k)
if not current then
  if ARGV[1] == '' then
    redis.call('SET', k, '1')
  elseif tonumber(ARGV[1]) > 0 then
    redis.call('SET', k, '1', 'PX', ARGV[1])
  end
  return {'ok', '1'}
end
-- Accept exactly what Rust's i64 parser accepts (an optional sign, decimal
-- digits, leading zeros), then hand INCR the canonical spelling it wants.
local sign, digits = string.match(current, '^([+-]?)(%d+)$')
if not digits then
  return {'not_integer'}
end
digits = string.gsub(digits, '^0+', '')
if digits == '' then
  digits = '0'
  sign = ''
end
if sign == '+' then
  sign = ''
end
local max = '9223372036854775807'
if sign == '-' then
  max = '9223372036854775808'
end
if #digits > #max or (#digits == #max and digits > max) then
  return {'not_integer'}
end
if sign == '' and digits == max then
  return {'overflow'}
end
local canonical = sign .. digits
if canonical ~= current then
  redis.call('SET', k, canonical, 'KEEPTTL')
end
redis.call('INCR', k)
-- Read the result back as a string: a Lua number would round above 2^53.
return {'ok', redis.call('GET', k)}
