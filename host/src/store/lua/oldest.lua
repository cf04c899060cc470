-- The id of a stream's oldest entry, never its fields: an entry of any size (one
-- dead-lettered for being over max_entry_bytes stays in its stream) would otherwise be read
-- whole at every scrape of /metrics.
--
-- KEYS[1]  the stream
-- ARGV     none
--
-- Reply: the oldest entry's id, or nil (false) when the stream is empty or missing; an error
-- reply (WRONGTYPE) when the key holds another type.
--
-- Crash: reads only; nothing to leave.
local e = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
if e[1] then
  return e[1][1]
end
return false
