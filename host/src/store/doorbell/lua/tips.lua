-- The id of each stream's last entry, without its fields: where the polling doorbell reads on
-- from.
--
-- KEYS[1..n]  the streams
-- ARGV        none
--
-- Reply: one value per key, in order: the last entry's id, '' for an empty or missing stream,
-- '!' for a key that holds another type (left out of the doorbell's reads, which it would
-- fail as a whole).
--
-- Crash: reads only; nothing to leave.
local out = {}
for i, key in ipairs(KEYS) do
  local kind = redis.call('TYPE', key)['ok']
  if kind == 'stream' then
    local last = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)
    if last[1] then
      out[i] = last[1][1]
    else
      out[i] = ''
    end
  elseif kind == 'none' then
    out[i] = ''
  else
    out[i] = '!'
  end
end
return out
