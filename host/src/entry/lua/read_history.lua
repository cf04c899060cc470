-- An entry's history (see entry/history.rs), bounded whatever another program left at the keys:
-- the newest records, each cut to a bound.
--
-- KEYS[1]  the subscription's histories (a hash: origin id -> records joined by newlines)
-- KEYS[2]  the earlier release's list for the entry, read when the hash has none for it
-- ARGV[1]  the entry's origin id
-- ARGV[2]  how many records, at most
-- ARGV[3]  the most bytes of each record returned
--
-- Only the value's last ARGV[2] * (ARGV[3] + 1) bytes are looked at (another writer's huge
-- value is not walked): with records longer than ARGV[3], the oldest one returned may be the
-- end of a record, which is no JSON and which the reader drops.
--
-- Reply: the records, oldest first, each cut to ARGV[3] bytes; {} when there are none or a key
-- holds another type.
--
-- Crash: reads only; nothing to leave.
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
