-- Fields of a subscription's flow hash (KEYS[1]), each at most ARGV[1] bytes of it (another
-- writer to this Redis may have left anything there): ARGV[2..] name the fields; a missing
-- one is false.
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
