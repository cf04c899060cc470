-- Move parked retries to the dead-letter stream with the operator's reason, atomically per
-- member: it is in the set or in the dead-letter stream, never both, never neither.
--
-- KEYS[1]  the delayed-retry set
-- KEYS[2]  the dead-letter stream
-- KEYS[3]  the stream's secret (may not exist: then nothing is sealed)
-- ARGV[1]  the options: one MessagePack map of named fields (`dead_letter_now` in
--          control/operate/parked.rs writes it):
--          reason              the operator's reason
--          stream, group       the subscription the retries belong to (recorded with them)
--          max_fields          the most fields one XADD from this script may carry
--          fields              the field names (the host's keys module): reason, origin_stream,
--                              origin_group, origin_id, entry_id, retry_count, delivery_count,
--                              member, origin_key, mark, packed_fields
--          dead_letter_maxlen  trim the dead-letter stream to about this many entries
--                              (MAXLEN ~), 0 for never (decimal text: a Lua number
--                              would print 10^14 as "1e+14", which XADD refuses)
--          seals               the seals' uses: dead_letter, member, dead_letter_packed
-- ARGV[2..] members
--
-- A member the park script wrote for this subscription (or an earlier release's, which names
-- no owner) becomes a dead letter like the dispatcher's (its fields, packed past what one XADD
-- carries, then the bookkeeping and the seal), so it can be requeued with its origin id;
-- anything else (unreadable, or parked by another subscription) is kept raw under the member
-- field, as the sweep does.
--
-- Reply: how many members were dead-lettered (members no longer in the set are skipped). An
-- error reply when ARGV[1] is not the options map, or when Redis refuses an XADD (the
-- dead-letter stream holds another type; a member that reads as this subscription's but whose
-- fields are no strings, or an odd number of them): the members before it are dead letters
-- already, that one and those after it stay parked.
--
-- Crash: Redis keeps all of the script's writes or none. An operator's request that dies
-- before the call leaves the retries parked; after it, they are dead letters, and a call made
-- again skips them (no longer in the set): nothing is dead-lettered twice.
-- @include lib/seal
-- @include lib/member
local ok, o = pcall(cmsgpack.unpack, ARGV[1])
if not ok or type(o) ~= 'table' or type(o.fields) ~= 'table' or type(o.seals) ~= 'table' then
  return redis.error_reply('dead_letter_now: ARGV[1] is not the options map')
end
local names, uses = o.fields, o.seals
local F_REASON, F_STREAM, F_GROUP = names.reason, names.origin_stream, names.origin_group
local F_ORIGIN, F_ENTRY, F_RETRY = names.origin_id, names.entry_id, names.retry_count
local F_DELIVERIES, F_MEMBER, F_KEY = names.delivery_count, names.member, names.origin_key
local F_MARK, F_PACKED = names.mark, names.packed_fields
local SEAL_DEAD_LETTER, SEAL_MEMBER = uses.dead_letter, uses.member
local SEAL_DEAD_LETTER_PACKED = uses.dead_letter_packed
local stream, group, reason = o.stream, o.group, o.reason
local max_fields = tonumber(o.max_fields)
local secret = redis.call('GET', KEYS[3])
local function xadd(values)
  local args = {KEYS[2]}
  if tonumber(o.dead_letter_maxlen) > 0 then
    args = {KEYS[2], 'MAXLEN', '~', o.dead_letter_maxlen}
  end
  args[#args + 1] = '*'
  for _, v in ipairs(values) do
    args[#args + 1] = v
  end
  return redis.call('XADD', unpack(args))
end
local moved = 0
for i = 2, #ARGV do
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
      for _, v in ipairs({F_REASON, reason, F_STREAM, stream, F_GROUP, group, F_ORIGIN, origin,
          F_ENTRY, id, F_RETRY, tostring(retry), F_DELIVERIES, '0'}) do
        values[#values + 1] = v
      end
      if secret then
        values[#values + 1] = F_MARK
        values[#values + 1] = seal(secret, {use, stream, group, origin, fields_digest(own)})
      end
      xadd(values)
    else
      local raw = {F_MEMBER, member, F_REASON, reason, F_KEY, KEYS[1], F_STREAM, stream}
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
