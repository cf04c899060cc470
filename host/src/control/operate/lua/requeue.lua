-- Put one dead letter back to its subscription's group and remove it from the dead-letter
-- stream, atomically: it is in exactly one of the two places.
--
-- KEYS[1]  where it goes: the group's retry lane, or (retry_lane = false, or no delayed set)
--          the stream
-- KEYS[2]  the dead-letter stream
-- KEYS[3]  the stream's secret (may not exist)
-- ARGV[1]  the options: one MessagePack map of named fields (`requeue` in
--          control/operate/dead_letters.rs writes it):
--          id              the dead letter's id
--          origin          the origin id to keep ('' when it cannot be trusted: the copy is
--                          its own origin)
--          stream, group   the subscription (what the seal covers)
--          mode            'lane' or 'tail': the form of the copy
--          fields          the field names (the host's keys module): retry_count, origin_id,
--                          due_ms, origin_group, mark, parked, packed_fields
--          seals           the seals' uses: lane, tail, tail_packed
--          max_fields      the most fields one XADD from this script may carry
-- ARGV[2..] the fields to add: name, value, ... (the entry's own fields and the requeue record)
--
-- Into the lane: the copy is what the sweep writes there, a member (the stream and group, the
-- dead letter's id, retry count 0, the fields, the origin id or ''), "due" now, and the seal over
-- them. Onto the stream with a secret: the fields, then the tail bookkeeping (retry count 0, the
-- origin id or '', "due" now, the group) and its seal, so the handler sees the producer's origin
-- id again and a fresh attempt count, and the stream's other Sluice groups leave it to this one.
-- Without a secret: a plain new entry.
-- Fields past what one XADD carries go packed into one value.
--
-- The dead letter is checked first (another operator or host may have requeued or deleted it:
-- nothing is written then), added second, deleted last: if the XADD fails the script stops
-- before the XDEL and the dead letter stays.
--
-- Reply: the new entry's id, or false when the dead letter was no longer there. An error reply
-- when ARGV[1] is not the options map; NOSECRET for a lane copy when the stream has no secret
-- (the caller makes it and calls again); Redis's error when it refuses the XADD (KEYS[1] holds
-- another type, no fields onto the stream without a secret): the dead letter stays.
--
-- Crash: Redis keeps all of the script's writes or none. An operator's request that dies
-- before the call leaves the dead letter where it was; after it, the copy is with the group,
-- and a requeue of the same id made again answers false: nothing is requeued twice.
-- @include lib/seal
local ok, o = pcall(cmsgpack.unpack, ARGV[1])
if not ok or type(o) ~= 'table' or type(o.fields) ~= 'table' or type(o.seals) ~= 'table' then
  return redis.error_reply('requeue: ARGV[1] is not the options map')
end
local names, uses = o.fields, o.seals
local F_RETRY, F_ORIGIN, F_DUE = names.retry_count, names.origin_id, names.due_ms
local F_GROUP, F_MARK = names.origin_group, names.mark
local F_PARKED, F_PACKED = names.parked, names.packed_fields
local SEAL_LANE, SEAL_TAIL, SEAL_TAIL_PACKED = uses.lane, uses.tail, uses.tail_packed
local stream, group, origin, dead_id = o.stream, o.group, o.origin, o.id
if #redis.call('XRANGE', KEYS[2], dead_id, dead_id) == 0 then
  return false
end
local fields = {}
for i = 2, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
local secret = redis.call('GET', KEYS[3])
local time = redis.call('TIME')
local now = string.format('%.0f', tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000))
local id
if o.mode == 'lane' then
  if not secret then
    return redis.error_reply('NOSECRET the stream has no secret to seal a lane copy with')
  end
  local member = cmsgpack.pack({stream, group, dead_id, 0, fields, origin})
  local mark = seal(secret, {SEAL_LANE, stream, group, member, now})
  id = redis.call('XADD', KEYS[1], '*', F_PARKED, member, F_DUE, now, F_MARK, mark)
else
  local own, use = fields, SEAL_TAIL
  if #fields / 2 > tonumber(o.max_fields) then
    own, use = {F_PACKED, cmsgpack.pack(fields)}, SEAL_TAIL_PACKED
  end
  local args = {KEYS[1], '*'}
  for _, v in ipairs(own) do
    args[#args + 1] = v
  end
  if secret then
    local mark = seal(secret, {use, stream, group, origin, '0', now, fields_digest(own)})
    for _, v in ipairs({F_RETRY, '0', F_ORIGIN, origin, F_DUE, now, F_GROUP, group, F_MARK, mark}) do
      args[#args + 1] = v
    end
  end
  id = redis.call('XADD', unpack(args))
end
redis.call('XDEL', KEYS[2], dead_id)
return id
