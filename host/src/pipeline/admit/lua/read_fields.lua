-- Fields of a subscription's flow hash, each cut to a bound: another writer to this Redis may
-- have left anything there.
--
-- KEYS[1]  the flow hash
-- ARGV[1]  the most bytes of each value returned
-- ARGV[2..] the fields' names (at least one)
--
-- Reply: one value per name, in order: its first ARGV[1] bytes, or false when it is missing
-- (or the hash is). An error reply when the key holds another type (WRONGTYPE) or no name is
-- given.
--
-- Crash: reads only; nothing to leave.
local names = {}
for i = 2, #ARGV do
  names[#names + 1] = ARGV[i]
end
local values = redis.call('HMGET', KEYS[1], unpack(names))
local max = tonumber(ARGV[1])
for i = 1, #values do
  if values[i] then
    values[i] = string.sub(values[i], 1, max)
  end
end
return values
