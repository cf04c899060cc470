-- Move the entries that are due from the delayed-retry set back onto the stream, atomically
-- per call: each due member is appended under a new id (*) with its retry count, origin id and
-- due time,
-- and removed from the set, so two hosts sweeping one set never both move an entry.
--
-- KEYS[1]  the stream
-- KEYS[2]  the delayed-retry sorted set
-- KEYS[3]  the dead-letter stream: a member this script cannot read (not written by
--          park.lua) goes there, raw, instead of blocking every sweep after it
-- ARGV[1]  the most entries to move in this pass
--
-- "Now" is the Redis server's clock (TIME), the same clock parking used.
--
-- Reply: {moved, next_due_ms or -1, now_ms, malformed}: how many entries were moved back, the
-- due time of the earliest entry left in the set (-1 if it is empty), the server's time, and
-- how many unreadable members were moved to the dead-letter stream.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local moved, malformed = 0, 0
for _, member in ipairs(due) do
  local ok, parked = pcall(cmsgpack.unpack, member)
  if ok and type(parked) == 'table' and type(parked[1]) == 'string'
      and type(parked[2]) == 'number' and type(parked[3]) == 'table' then
    local args = {KEYS[1], '*'}
    for _, v in ipairs(parked[3]) do
      args[#args + 1] = v
    end
    args[#args + 1] = 'sluice-retry-count'
    args[#args + 1] = tostring(parked[2])
    args[#args + 1] = 'sluice-origin-id'
    args[#args + 1] = parked[1]
    args[#args + 1] = 'sluice-due-ms'
    args[#args + 1] = redis.call('ZSCORE', KEYS[2], member)
    redis.call('XADD', unpack(args))
    moved = moved + 1
  else
    redis.call('XADD', KEYS[3], '*', 'sluice-member', member,
      'sluice-reason', 'unreadable delayed-retry set member', 'sluice-origin-key', KEYS[2])
    malformed = malformed + 1
  end
  redis.call('ZREM', KEYS[2], member)
end
local next_due = -1
local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
if #first == 2 then
  next_due = tonumber(first[2])
end
return {moved, next_due, now, malformed}
