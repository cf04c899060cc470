-- Move parked retries to the dead-letter stream with the operator's reason, atomically per
-- member: it is in the set or in the dead-letter stream, never both, never neither.
--
-- KEYS[1]  the delayed-retry set
-- KEYS[2]  the dead-letter stream
-- KEYS[3]  the stream's secret (may not exist: then nothing is sealed)
-- ARGV[1]  the reason
-- ARGV[2]  the stream and ARGV[3] the group the retries belong to (recorded with them)
-- ARGV[4]  the most fields one XADD from this script may carry
-- ARGV[5..15] field names: reason, origin stream, origin group, origin id, entry id, retry
--          count, delivery count, member, origin key, mark, packed fields (the host's keys module)
-- ARGV[16] trim the dead-letter stream to about this many entries (MAXLEN ~), 0 for never
-- ARGV[17..19] the seals' uses: dead letter, member, dead letter with packed fields
-- ARGV[20..] members
--
-- A member the park script wrote for this subscription becomes a dead letter like the
-- dispatcher's (its fields, packed past what one XADD carries, then the bookkeeping and the
-- seal), so it can be requeued with its origin id; anything else (unreadable, or parked by
-- another subscription) is kept raw under the member field, as the sweep does.
--
-- Reply: how many members were dead-lettered (members no longer in the set are skipped).
local F_REASON, F_STREAM, F_GROUP, F_ORIGIN, F_ENTRY = ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local F_RETRY, F_DELIVERIES, F_MEMBER, F_KEY = ARGV[10], ARGV[11], ARGV[12], ARGV[13]
local F_MARK, F_PACKED = ARGV[14], ARGV[15]
local SEAL_DEAD_LETTER, SEAL_MEMBER, SEAL_DEAD_LETTER_PACKED = ARGV[17], ARGV[18], ARGV[19]
local stream, group = ARGV[2], ARGV[3]
local max_fields = tonumber(ARGV[4])
local secret = redis.call('GET', KEYS[3])
local function xadd(values)
  local args = {KEYS[2]}
  if tonumber(ARGV[16]) > 0 then
    args = {KEYS[2], 'MAXLEN', '~', ARGV[16]}
  end
  args[#args + 1] = '*'
  for _, v in ipairs(values) do
    args[#args + 1] = v
  end
  return redis.call('XADD', unpack(args))
end
local moved = 0
for i = 20, #ARGV do
  local member = ARGV[i]
  if redis.call('ZSCORE', KEYS[1], member) then
    local id, retry, fields, origin, owner_stream, owner_group = read_member(member)
    local ours = id ~= nil and (owner_stream == nil or (owner_stream == stream
      and owner_group == group))
    if ours then
      local own, use = fields, SEAL_DEAD_LETTER
      if #own / 2 > max_fields then
        own, use = {F_PACKED, cmsgpack.pack(own)}, SEAL_DEAD_LETTER_PACKED
      end
      local values = {}
      for _, v in ipairs(own) do
        values[#values + 1] = v
      end
      for _, v in ipairs({F_REASON, ARGV[1], F_STREAM, stream, F_GROUP, group, F_ORIGIN, origin,
          F_ENTRY, id, F_RETRY, tostring(retry), F_DELIVERIES, '0'}) do
        values[#values + 1] = v
      end
      if secret then
        values[#values + 1] = F_MARK
        values[#values + 1] = seal(secret, {use, stream, group, origin, fields_digest(own)})
      end
      xadd(values)
    else
      local raw = {F_MEMBER, member, F_REASON, ARGV[1], F_KEY, KEYS[1], F_STREAM, stream}
      if secret then
        for _, v in ipairs({F_GROUP, group, F_MARK,
            seal(secret, {SEAL_MEMBER, KEYS[1], stream, group, member})}) do
          raw[#raw + 1] = v
        end
      end
      xadd(raw)
    end
    redis.call('ZREM', KEYS[1], member)
    moved = moved + 1
  end
end
return moved
