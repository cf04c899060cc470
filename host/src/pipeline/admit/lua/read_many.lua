-- The fields of many subscriptions' flow hashes in one call, each value cut to a bound: what a
-- quiet host's periodic re-read asks (one call per up to 200 hashes instead of one each).
-- Another writer to this Redis may have left anything there.
--
-- KEYS     the flow hashes (any number; only where keys need not share a slot: no cluster)
-- ARGV[1]  the most bytes of each value returned
-- ARGV[2..] the fields' names (at least one)
--
-- Reply: one array per key, in order, of one value per name: its first ARGV[1] bytes, or false
-- when it is missing (or the hash is); false instead of the array for a key of another type
-- (the other keys are still read).
--
-- Crash: reads only; nothing to leave.
local names = {}
for i = 2, #ARGV do
  names[#names + 1] = ARGV[i]
end
local max = tonumber(ARGV[1])
local out = {}
for k = 1, #KEYS do
  local values = redis.pcall('HMGET', KEYS[k], unpack(names))
  if type(values) == 'table' and values.err then
    out[k] = false
  else
    for i = 1, #values do
      if values[i] then
        values[i] = string.sub(values[i], 1, max)
      end
    end
    out[k] = values
  end
end
return out
