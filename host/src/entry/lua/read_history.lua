-- An entry's history (see history.rs), bounded whatever another program left at the keys: the
-- newest ARGV[2] records, each cut to ARGV[3] bytes. KEYS[1]: the subscription's histories
-- (a hash), ARGV[1] the entry's origin id; KEYS[2]: the earlier release's list for the entry,
-- read when the hash has none. A key of another type reads as none.
local max, cut = tonumber(ARGV[2]), tonumber(ARGV[3])
local records = {}
local value = redis.pcall('HGET', KEYS[1], ARGV[1])
if type(value) == 'string' then
  -- Only the tail can hold the newest records (another writer's huge value is not walked).
  value = string.sub(value, -max * (cut + 1))
  for record in string.gmatch(value, '[^\n]+') do
    records[#records + 1] = record
  end
else
  local listed = redis.pcall('LRANGE', KEYS[2], -max, -1)
  if type(listed) == 'table' and not listed.err then
    records = listed
  end
end
local out = {}
for i = math.max(1, #records - max + 1), #records do
  out[#out + 1] = string.sub(records[i], 1, cut)
end
return out
