-- Acknowledge a read's duplicates (entries whose dedupe key's first entry is another), count
-- them group-wide and record in each one's history which entry was the key's first.
--
-- KEYS[1]  the stream
-- KEYS[2]  the counts: a hash (duplicates), group-wide
-- KEYS[3]  the subscription's histories, KEYS[4] their index (see lib/history.lua)
-- ARGV[1]  the options: one MessagePack map (`judge` in pipeline/dedupe/mod.rs): group,
--          consumer, history_cap (0: none), history_keep_ms
-- ARGV[2..] per duplicate: its id, the id of its key's first entry
--
-- Only entries still pending are acknowledged and counted (another consumer may have settled
-- one meanwhile: then nothing is written for it), so a call run twice counts each once.
--
-- Reply: how many were acknowledged.
-- @include lib/history
local ok, o = pcall(cmsgpack.unpack, ARGV[1])
if not ok or type(o) ~= 'table' then
  return redis.error_reply('dedupe: ARGV[1] is not the options map')
end
if (#ARGV - 1) % 2 ~= 0 then
  return redis.error_reply('dedupe: the duplicates are not (id, first id) pairs')
end
local t = redis.call('TYPE', KEYS[2])['ok']
if t ~= 'none' and t ~= 'hash' then
  return redis.error_reply('WRONGTYPE dedupe: ' .. KEYS[2] .. ' is a ' .. t
    .. ', not the hash dedupe counts in (another program\'s key?)')
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local by = cjson.encode(o.consumer)
local acked = 0
for i = 2, #ARGV, 2 do
  local id, of = ARGV[i], ARGV[i + 1]
  if redis.call('XACK', KEYS[1], o.group, id) == 1 then
    acked = acked + 1
    if o.history_cap > 0 then
      local note = string.format(
        '%s %d {"do":"duplicate","n":1,"by":%s,"why":"duplicate of %s","id":"%s","of":"%s"',
        id, o.history_cap, by, of, id, of)
      remember(KEYS[3], KEYS[4], note, string.format(',"at":%.0f', now), now,
        now + o.history_keep_ms)
    end
  end
end
if acked > 0 then
  redis.call('HINCRBY', KEYS[2], 'duplicates', acked)
  redis.call('PEXPIREAT', KEYS[2], now + o.history_keep_ms)
end
return acked
