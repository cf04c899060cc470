-- Make parked retries due now, so the next sweep (any host's, within its `block`) moves them
-- back onto the stream. Members no longer in the set (swept, deleted) are skipped.
--
-- KEYS[1]  the delayed-retry set
-- ARGV[1]  0: the members in ARGV[2..]; n > 0: up to n members that are not yet due
-- ARGV[2..] members
--
-- "Now" is the Redis server's clock, as for parking and sweeping.
--
-- Reply: how many members were made due. An error reply when the key holds another type.
--
-- Crash: Redis keeps all of the script's writes or none. An operator's request that dies before
-- the call leaves the retries as they were; after it, they are due, and a call made again is
-- harmless (a member made due again is just due; with n > 0 it takes the next n not yet due,
-- as the caller's loop does until 0).
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local members = {}
if tonumber(ARGV[1]) > 0 then
  members = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'LIMIT', 0, tonumber(ARGV[1]))
else
  for i = 2, #ARGV do
    members[#members + 1] = ARGV[i]
  end
end
local moved = 0
for _, member in ipairs(members) do
  if redis.call('ZSCORE', KEYS[1], member) then
    redis.call('ZADD', KEYS[1], 'XX', now, member)
    moved = moved + 1
  end
end
return moved
