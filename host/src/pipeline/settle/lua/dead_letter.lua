-- Move one pending entry to the dead-letter stream and acknowledge it, atomically: the entry is
-- either pending or dead-lettered, never neither, and never both.
--
-- KEYS[1]  the stream the entry was read from
-- KEYS[2]  the dead-letter stream
-- KEYS[3]  the subscription's histories, KEYS[4] their index (see lib/history.lua)
-- ARGV[1]  the consumer group
-- ARGV[2]  the entry id
-- ARGV[3]  trim the dead-letter stream to about this many entries (MAXLEN ~), 0 for never
-- ARGV[4]  the history note (origin, cap and record: see lib/history.lua; '' for none)
-- ARGV[5]  how long the history outlives the dead letter, ms
-- ARGV[6..] field, value, field, value, ... to record (the entry's fields plus the reason and
--           origin bookkeeping; the caller packs them when there are too many for one XADD)
--
-- Order matters: the dead letter is written first and the entry acknowledged last, so a write
-- that fails (a key of the wrong type, anything else Redis refuses) aborts the script before
-- the XACK and the entry stays pending. Redis does not roll a script back, so nothing may be
-- acknowledged before the write has succeeded.
--
-- When the group no longer exists (NOGROUP: the stream or the group was deleted) the dead
-- letter is still written, since it may be the only copy of the entry left, and there is
-- nothing to acknowledge.
--
-- Reply: {dead-letter id, 1 if acknowledged or 0 if the group was gone}, or false when the
-- entry was no longer pending for the group (someone else settled it first), in which case
-- nothing is written. Any other failure is an error reply.
--
-- Crash: Redis keeps all of the script's writes or none. A host that dies before the call
-- leaves the entry pending: read again on restart, or claimed by another host once idle, and
-- settled again. After the call it is a dead letter and acknowledged; a call made again after
-- a lost reply answers false and writes nothing (no second dead letter).
-- @include lib/pending
-- @include lib/dead_letter_write
local state, stop = pending_state(KEYS[1], ARGV[1], ARGV[2])
if not state then
  return stop
end
local fields = {}
for i = 6, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
return write_dead_letter(state, fields)
