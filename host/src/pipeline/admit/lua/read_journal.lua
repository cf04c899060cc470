-- The newest ARGV[1] entries of a flow journal (see flow/journal.rs), newest first, each value
-- cut to ARGV[2] bytes whatever another program wrote there. A key of another type reads as
-- none. KEYS[1]: the journal.
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
