-- Move parked retries to the dead-letter stream with the operator's reason, atomically per
-- member: it is in the set or in the dead-letter stream, never both, never neither.
--
-- KEYS[1]  the delayed-retry set
-- KEYS[2]  the dead-letter stream
-- ARGV[1]  the reason
-- ARGV[2]  the stream and ARGV[3] the group the retries belong to (recorded with them)
-- ARGV[4]  the most fields one XADD from this script may carry
-- ARGV[5..13] field names: reason, origin stream, origin group, origin id, entry id, retry
--          count, delivery count, member, origin key (from the host's keys module)
-- ARGV[14] trim the dead-letter stream to about this many entries (MAXLEN ~), 0 for never
-- ARGV[15..] members
--
-- A member the park script wrote becomes a dead letter like the dispatcher's (its fields, then
-- the bookkeeping), so it can be requeued; anything else (or one with too many fields) is kept
-- raw under the member field, as the sweep does.
--
-- Reply: how many members were dead-lettered (members no longer in the set are skipped).
local F_REASON, F_STREAM, F_GROUP, F_ORIGIN, F_ENTRY = ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local F_RETRY, F_DELIVERIES, F_MEMBER, F_KEY = ARGV[10], ARGV[11], ARGV[12], ARGV[13]
local max_fields = tonumber(ARGV[4])
local function xadd(values)
  local args = {KEYS[2]}
  if tonumber(ARGV[14]) > 0 then
    args = {KEYS[2], 'MAXLEN', '~', ARGV[14]}
  end
  args[#args + 1] = '*'
  for _, v in ipairs(values) do
    args[#args + 1] = v
  end
  return redis.call('XADD', unpack(args))
end
local moved = 0
for i = 15, #ARGV do
  local member = ARGV[i]
  if redis.call('ZSCORE', KEYS[1], member) then
    local ok, parked = pcall(cmsgpack.unpack, member)
    if ok and type(parked) == 'table' and type(parked[1]) == 'string'
        and type(parked[3]) == 'table' and #parked[3] / 2 <= max_fields then
      local origin = parked[4]
      if type(origin) ~= 'string' then
        origin = parked[1]
      end
      local values = {}
      for _, v in ipairs(parked[3]) do
        values[#values + 1] = v
      end
      for _, v in ipairs({F_REASON, ARGV[1], F_STREAM, ARGV[2], F_GROUP, ARGV[3], F_ORIGIN, origin,
          F_ENTRY, parked[1], F_RETRY, tostring(parked[2]), F_DELIVERIES, '0'}) do
        values[#values + 1] = v
      end
      xadd(values)
    else
      xadd({F_MEMBER, member, F_REASON, ARGV[1], F_KEY, KEYS[1], F_STREAM, ARGV[2]})
    end
    redis.call('ZREM', KEYS[1], member)
    moved = moved + 1
  end
end
return moved
