-- Whether an entry came to each stream after the id the doorbell last saw there, and if so the
-- stream's last id now. Fields are never returned, and an idle stream costs one lookup.
--
-- KEYS[1..n]  the streams
-- ARGV[1..n]  the id last seen on KEYS[i]
--
-- Reply: one value per key, in order: the stream's last id when an entry came after ARGV[i];
-- '' when none did, the key is missing or no stream, or ARGV[i] is no stream id.
--
-- Crash: reads only; nothing to leave.
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
