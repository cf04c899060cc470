-- The newest entries of a subscription's flow journal (see admit/journal.rs), each bounded
-- whatever another program wrote there.
--
-- KEYS[1]  the journal (a stream)
-- ARGV[1]  how many entries, newest first
-- ARGV[2]  the most bytes of each name and value returned
--
-- Reply: {{id, {name, value, ...}}, ...}, newest first, at most 16 names and values (8 fields)
-- of each entry, each cut to ARGV[2] bytes; {} when the key is missing or holds another type.
--
-- Crash: reads only; nothing to leave.
local entries = redis.pcall('XREVRANGE', KEYS[1], '+', '-', 'COUNT', tonumber(ARGV[1]))
if type(entries) ~= 'table' or entries.err then
  return {}
end
local max = tonumber(ARGV[2])
local out = {}
for i = 1, #entries do
  local fields = entries[i][2]
  local cut = {}
  for j = 1, math.min(#fields, 16) do
    cut[j] = string.sub(fields[j], 1, max)
  end
  out[i] = {entries[i][1], cut}
end
return out
