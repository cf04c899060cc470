-- Put one dead letter back to its subscription's group and remove it from the dead-letter
-- stream, atomically: a crash at any instant leaves it in exactly one of the two places.
--
-- KEYS[1]  where it goes: the group's retry lane, or (retry_lane = false, or no delayed set)
--          the stream
-- KEYS[2]  the dead-letter stream
-- KEYS[3]  the stream's secret (may not exist)
-- ARGV[1]  the dead letter's id
-- ARGV[2]  the origin id to keep ('' when it cannot be trusted: the copy is its own origin)
-- ARGV[3]  the subscription's stream, ARGV[4] its group (what the seal covers)
-- ARGV[5]  'lane' or 'tail': the form of the copy
-- ARGV[6..12] field names, in order: retry count, origin id, due time, origin group, mark,
--          parked, packed fields (from the host's keys module)
-- ARGV[13..15] the seals' uses: lane, tail, tail with packed fields
-- ARGV[16] the most fields one XADD from this script may carry
-- ARGV[17..] the fields to add: name, value, ... (the entry's own fields and the requeue record)
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
-- Reply: the new entry's id, or false when the dead letter was no longer there.
local F_RETRY, F_ORIGIN, F_DUE, F_GROUP = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local F_MARK, F_PARKED, F_PACKED = ARGV[10], ARGV[11], ARGV[12]
local SEAL_LANE, SEAL_TAIL, SEAL_TAIL_PACKED = ARGV[13], ARGV[14], ARGV[15]
local stream, group, origin = ARGV[3], ARGV[4], ARGV[2]
if #redis.call('XRANGE', KEYS[2], ARGV[1], ARGV[1]) == 0 then
  return false
end
local fields = {}
for i = 17, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
local secret = redis.call('GET', KEYS[3])
local time = redis.call('TIME')
local now = string.format('%.0f', tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000))
local id
if ARGV[5] == 'lane' then
  if not secret then
    return redis.error_reply('NOSECRET the stream has no secret to seal a lane copy with')
  end
  local member = cmsgpack.pack({stream, group, ARGV[1], 0, fields, origin})
  local mark = seal(secret, {SEAL_LANE, stream, group, member, now})
  id = redis.call('XADD', KEYS[1], '*', F_PARKED, member, F_DUE, now, F_MARK, mark)
else
  local own, use = fields, SEAL_TAIL
  if #fields / 2 > tonumber(ARGV[16]) then
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
redis.call('XDEL', KEYS[2], ARGV[1])
return id
