-- Move one pending entry to the dead-letter stream and acknowledge it, atomically: a crash at
-- any instant leaves the entry either pending or dead-lettered, never neither, and never both.
--
-- KEYS[1]  the stream the entry was read from
-- KEYS[2]  the dead-letter stream
-- ARGV[1]  the consumer group
-- ARGV[2]  the entry id
-- ARGV[3..] field, value, field, value, ... to record (the entry's fields plus the reason and
--           origin bookkeeping)
--
-- Reply: the new dead-letter entry id, or false when the entry was no longer pending for the
-- group (someone else settled it first), in which case nothing is written.
local acked = redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
if acked == 0 then
  return false
end
local fields = {}
for i = 3, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
return redis.call('XADD', KEYS[2], '*', unpack(fields))
