-- For each stream KEYS[i] last seen at id ARGV[i]: its last id now when an entry came after
-- ARGV[i] ('' when none did, or the key is no stream). Fields are never returned, and an
-- idle stream costs one lookup.
local out = {}
for i, key in ipairs(KEYS) do
  out[i] = ''
  local found = redis.pcall('XREAD', 'COUNT', 1, 'STREAMS', key, ARGV[i])
  if type(found) == 'table' and not found.err and found[1] then
    local last = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)
    if last[1] then
      out[i] = last[1][1]
    end
  end
end
return out
