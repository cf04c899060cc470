-- An entry's history (see history.rs), bounded whatever another program left at the key: the
-- newest ARGV[1] records, each cut to ARGV[2] bytes. A key of another type reads as none.
-- KEYS[1]: the history list.
local records = redis.pcall('LRANGE', KEYS[1], -tonumber(ARGV[1]), -1)
if type(records) ~= 'table' or records.err then
  return {}
end
local max = tonumber(ARGV[2])
for i = 1, #records do
  records[i] = string.sub(records[i], 1, max)
end
return records
