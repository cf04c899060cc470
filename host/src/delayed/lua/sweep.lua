-- Move the entries that are due from the delayed-retry set back onto the stream, atomically
-- per call: each due member is appended under a new id (*) with its retry count and origin id,
-- and removed from the set, so two hosts sweeping one set never both move an entry.
--
-- KEYS[1]  the stream
-- KEYS[2]  the delayed-retry sorted set
-- ARGV[1]  the most entries to move in this pass
--
-- "Now" is the Redis server's clock (TIME), the same clock parking used.
--
-- Reply: {moved, next_due_ms or -1, now_ms}: how many entries were moved, the due time of the
-- earliest entry left in the set (-1 if it is empty), and the server's time.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
for _, member in ipairs(due) do
  local parked = cmsgpack.unpack(member)
  local args = {KEYS[1], '*'}
  for _, v in ipairs(parked[3]) do
    args[#args + 1] = v
  end
  args[#args + 1] = 'sluice-retry-count'
  args[#args + 1] = tostring(parked[2])
  args[#args + 1] = 'sluice-origin-id'
  args[#args + 1] = parked[1]
  redis.call('XADD', unpack(args))
  redis.call('ZREM', KEYS[2], member)
end
local next_due = -1
local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
if #first == 2 then
  next_due = tonumber(first[2])
end
return {#due, next_due, now}
