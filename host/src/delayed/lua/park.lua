-- Park a pending entry in the delayed-retry set and acknowledge it, atomically: a crash at any
-- instant leaves the entry either pending or parked, never neither (and never both).
--
-- KEYS[1]  the stream the entry was read from
-- KEYS[2]  the delayed-retry sorted set
-- ARGV[1]  the consumer group
-- ARGV[2]  the entry id (kept in the member, which makes members unique per entry)
-- ARGV[3]  the delay in milliseconds
-- ARGV[4]  the set's ttl in milliseconds, 0 for none (each park refreshes it)
-- ARGV[5]  the retry count the entry will carry when it comes back (already raised by one)
-- ARGV[6..] the entry's fields: name, value, name, value, ...
--
-- Scores are due times in wall-clock epoch milliseconds taken from the Redis server's clock
-- (TIME), so hosts whose clocks drift still agree on what is due.
--
-- Reply: {due_ms, now_ms}, or false when the entry was no longer pending for the group
-- (another consumer settled it), in which case nothing is written.
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
if #pending == 0 then
  return false
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local due = now + tonumber(ARGV[3])
local fields = {}
for i = 6, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
local member = cmsgpack.pack({ARGV[2], tonumber(ARGV[5]), fields})
redis.call('ZADD', KEYS[2], due, member)
local ttl = tonumber(ARGV[4])
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[2], ttl)
end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
return {due, now}
