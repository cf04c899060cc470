-- Park a pending entry in the delayed-retry set and acknowledge it, atomically: the entry is
-- either pending or parked, never neither (and never both).
--
-- KEYS[1]  the stream the entry was read from
-- KEYS[2]  the delayed-retry sorted set
-- KEYS[3]  the subscription's histories, KEYS[4] their index (see lib/history.lua)
-- ARGV[1]  the consumer group
-- ARGV[2]  the entry id (kept in the member, which makes members unique per entry)
-- ARGV[3]  the delay in milliseconds (the caller keeps it within what a score holds exactly)
-- ARGV[4]  the set's ttl in milliseconds, 0 for none
-- ARGV[5]  the retry count the entry will carry when it comes back (already raised by one)
-- ARGV[6]  the id of the entry the producer first added (kept through every park)
-- ARGV[7]  the subscription's stream (KEYS[1] may be its retry lane): with the group, the
--          member's owner, which every sweep checks
-- ARGV[8]  the history note (origin, cap and record: see lib/history.lua; '' for none)
-- ARGV[9]  how long the history outlives the due time, ms
-- ARGV[10..] the entry's fields: name, value, name, value, ... (any number: they are packed
--          into the member, never unpacked into one command)
--
-- The member is MessagePack {stream, group, entry id, retry count, {name, value, ...}, origin
-- id} (see lib/member.lua): the owner first, so a sweep tells its own members by their first
-- bytes.
--
-- Scores are due times in wall-clock epoch milliseconds taken from the Redis server's clock
-- (TIME), so hosts whose clocks drift still agree on what is due.
--
-- ttl: the set expires `ttl` after the latest due time in it (PEXPIREAT), never before
-- something in it is due; every park and every sweep moves that deadline. So a set expires only
-- when nothing swept it for `ttl` after its last retry was due.
--
-- The member is written before the XACK; if the ZADD fails (the set holds another type) the
-- script aborts and the entry stays pending. When the group no longer exists (NOGROUP: the
-- group or the stream was deleted) the entry is parked anyway (its retry must not be lost) and
-- there is nothing to acknowledge. A history key of another type is skipped.
--
-- Reply: {due_ms, now_ms, 1 if acknowledged or 0 if the group was gone, microseconds from the
-- server's clock now to the due time}, or false when the entry was no longer pending for the
-- group (another consumer settled it), in which case nothing is written. Any other failure
-- (KEYS[1] of another type, an id that is none) is an error reply, and nothing is written.
--
-- Crash: Redis keeps all of the script's writes or none. A host that dies before the call
-- leaves the entry pending: its consumer reads it again on restart, or another host claims it
-- once idle. After the call it is parked and acknowledged, and the sweep (any host's) brings it
-- back when due; a call made again after a lost reply answers false and writes nothing.
-- @include lib/pending
-- @include lib/history
local state, stop = pending_state(KEYS[1], ARGV[1], ARGV[2])
if not state then
  return stop
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local due = now + tonumber(ARGV[3])
-- From now to the due time in microseconds: "now" in milliseconds is up to 1 ms behind the
-- clock, and the host's timer would be that much late.
local wait_us = due * 1000 - (tonumber(time[1]) * 1000000 + tonumber(time[2]))
local fields = {}
for i = 10, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
local member = cmsgpack.pack({ARGV[7], ARGV[1], ARGV[2], tonumber(ARGV[5]), fields, ARGV[6]})
redis.call('ZADD', KEYS[2], due, member)
remember(KEYS[3], KEYS[4], ARGV[8], string.format(',"at":%.0f,"due":%.0f', now, due), now,
  due + tonumber(ARGV[9]))
local ttl = tonumber(ARGV[4])
if ttl > 0 then
  local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
  local latest = math.max(tonumber(last[2]), now)
  redis.call('PEXPIREAT', KEYS[2], latest + ttl)
end
if state == 'group-gone' then
  return {due, now, 0, wait_us}
end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
return {due, now, 1, wait_us}
