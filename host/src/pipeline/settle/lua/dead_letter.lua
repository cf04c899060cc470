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
-- On an ordered subscription (KEYS[5..8] given): KEYS[5] the subscription's key names, KEYS[6]
-- its waiting keys, KEYS[7] the delayed set, KEYS[8] its turns (see lib/order.lua); the last
-- five ARGV are the origin id, the prefix of the keys' own keys, the most in flight per key,
-- the set's ttl (ms), and `release` or `hold`. Once the dead letter is written, the turn the
-- origin holds (found in the turns, whatever key the host made of the entry) is given back and
-- the key's next entries go in (`release`), or kept, marked `<digest>:dead:<ms>` (`hold`), until the
-- dead letter is requeued and settles, is deleted, or an operator releases the key.
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
-- @include lib/order
local state, stop = pending_state(KEYS[1], ARGV[1], ARGV[2])
if not state then
  return stop
end
local last, turn = #ARGV, nil
if #KEYS > 4 then
  turn = {origin = ARGV[last - 4], prefix = ARGV[last - 3], max = tonumber(ARGV[last - 2]),
    ttl = tonumber(ARGV[last - 1]), mode = ARGV[last]}
  last = last - 5
end
local fields = {}
for i = 6, last do
  fields[#fields + 1] = ARGV[i]
end
local k
if turn then
  -- Checked before the dead letter is written (see order_check in lib/order.lua).
  k = order_state(turn.prefix, KEYS[5], KEYS[6], KEYS[8], KEYS[7], turn.max, turn.ttl)
  local held = redis.call('HGET', k.turns, turn.origin)
  local err = order_check(k, held and {turn_key(held)} or {})
  if err then
    return err
  end
end
local reply = write_dead_letter(state, fields)
if turn then
  if turn.mode == 'hold' then
    local held = redis.call('HGET', k.turns, turn.origin)
    if held then
      redis.call('HSET', k.turns, turn.origin, turn_key(held) .. ':dead:' .. k.now)
    end
  else
    order_give_back(k, {turn.origin})
  end
end
return reply
