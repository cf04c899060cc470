-- Move the entries that are due from the delayed-retry set to where the subscription's group
-- reads them again, atomically per call: each due member is appended under a new id (*) with its
-- bookkeeping and a seal, and removed from the set, so two hosts sweeping one set never both move
-- an entry.
--
-- KEYS[1]  where due entries go: the subscription's retry lane (the default), or its stream
-- KEYS[2]  the delayed-retry set
-- KEYS[3]  the dead-letter stream: a member that cannot go back goes there instead of blocking
--          every sweep after it
-- ARGV[1]  the options: one MessagePack map of named fields (`sweep_options` in
--          pipeline/delayed/mod.rs writes it):
--          batch               the most entries to move in this pass
--          secret              the stream's secret, which keys the seals
--          ttl_ms              the set's ttl in milliseconds, 0 for none
--          max_fields          the most fields one XADD from this script may carry
--          fields              the bookkeeping field names (the host's keys module): retry_count,
--                              origin_id, due_ms, mark, member, reason, origin_key,
--                              origin_stream, origin_group, packed_fields, parked
--          dead_letter_maxlen  trim the dead-letter stream to about this many entries
--                              (MAXLEN ~), 0 for never (decimal text: a Lua number
--                              would print 10^14 as "1e+14", which XADD refuses)
--          stream              the subscription's stream: the name the seals cover and dead
--                              letters record as their origin, whether KEYS[1] is that stream or
--                              the lane
--          group               the subscription's group
--          past_other_groups   true to move due entries to the stream's tail even while other
--                              groups read the stream (other_groups_see_retries), false to hold
--                              them then
--          seals               the seals' uses (the host's keys module): lane, tail, member,
--                              tail_packed
--
-- Only members of this subscription move: a member names the stream and group that parked it
-- (its first bytes, see lib/member.lua), and one that names another subscription is
-- dead-lettered raw with a reason naming both (never delivered to this subscription's handler).
-- Members of earlier releases name no owner and are taken as this set's.
--
-- To the lane (KEYS[1] is not the option `stream`): the copy is three fields, the member itself
-- (which carries the entry's fields, however many, and its bookkeeping), the due time, and a
-- seal over the stream, the group, the member and the due time. Only this group reads the lane,
-- so no other group ever sees a retry. The lane is the host's own stream, so the sweep keeps it
-- short: before adding to it, it trims every entry below the oldest one some group of the lane
-- still has pending or has not read yet (XTRIM MINID), i.e. only what every group has
-- acknowledged.
--
-- To the stream's tail (the seed's design, on explicit opt-in): the copy is the member's fields,
-- then exactly five bookkeeping fields: retry count, origin id, due time (server clock, epoch ms),
-- the group that parked it, and a seal over the stream, that group, the origin id, the retry
-- count, the due time and the digest of the fields before them. An entry with more fields than
-- one XADD can carry goes with them packed into one value, under a seal of its own use (so a
-- producer's own field of that name is never taken for packed fields). While another group
-- reads the stream and past_other_groups is false, nothing moves: the pass answers which group
-- it saw (the host holds retries then, and says so), since that group would read every retry as
-- a new entry of its own.
--
-- The host trusts a copy's bookkeeping only when its seal verifies: a producer that writes such
-- fields itself, or copies a seal onto other fields, changes nothing.
--
-- A member is dead-lettered, raw, with a reason (and a seal over the set, stream, group and the
-- member) when it is not a member the park script wrote, when it belongs to another
-- subscription, or when Redis refuses the XADD (KEYS[1] of another type; fields that are no
-- strings). If even the dead-letter write fails the member stays in the set and is counted as
-- stuck.
--
-- "Now" is the Redis server's clock (TIME), the same clock parking used. With a ttl, the set's
-- expiry moves to `ttl` after its latest due time (or after now), as the park script does.
--
-- Reply: {moved, wait_us, now_ms, dead_lettered, stuck, held_by}: wait_us is how long after the
-- pass ended (server clock, microseconds) the earliest member left is due, 0 if it is due
-- already (a member held back or stuck is), -1 if the set is empty, at most 2^53; held_by is
-- the other group that held this pass's retries ('' if none did), or, with past_other_groups,
-- the other group the pass moved retries past. An error reply when ARGV[1] is not the options
-- map, when the set holds another type, or when the lane's trim fails: a lane group whose
-- last-delivered id is the last id there is (18446744073709551615-18446744073709551615, with
-- nothing pending) has no id after it, XTRIM refuses the one the script makes, and every pass
-- fails before moving anything while it stays so.
--
-- Crash: Redis keeps all of the script's writes or none: each due member is in the set or in
-- KEYS[1] (or the dead-letter stream), never both, never neither. A host that dies before the
-- call leaves what is due in the set for the next pass (any host's); one that dies after it
-- loses only the reply: the copies are in KEYS[1] for the group to read, and the next pass
-- learns the next due time again.
-- @include lib/ids
-- @include lib/seal
-- @include lib/member
local ok, o = pcall(cmsgpack.unpack, ARGV[1])
if not ok or type(o) ~= 'table' or type(o.fields) ~= 'table' or type(o.seals) ~= 'table' then
  return redis.error_reply('sweep: ARGV[1] is not the options map')
end
local names, uses = o.fields, o.seals
local F_RETRY, F_ORIGIN, F_DUE = names.retry_count, names.origin_id, names.due_ms
local F_MARK, F_MEMBER, F_REASON = names.mark, names.member, names.reason
local F_ORIGIN_KEY, F_ORIGIN_STREAM = names.origin_key, names.origin_stream
local F_ORIGIN_GROUP, F_PACKED, F_PARKED = names.origin_group, names.packed_fields, names.parked
local SEAL_LANE, SEAL_TAIL = uses.lane, uses.tail
local SEAL_MEMBER, SEAL_TAIL_PACKED = uses.member, uses.tail_packed
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'WITHSCORES', 'LIMIT', 0,
  tonumber(o.batch))
local secret = o.secret
local max_fields = tonumber(o.max_fields)
local moved, dead, stuck = 0, 0, 0
local stream, group = o.stream, o.group
local to_lane = KEYS[1] ~= stream
local held_by = ''

-- Drop the lane's entries that every group of the lane has read and acknowledged.
local function trim_lane()
  local groups = redis.pcall('XINFO', 'GROUPS', KEYS[1])
  if type(groups) ~= 'table' or groups.err or #groups == 0 then
    return
  end
  local floor
  for _, flat in ipairs(groups) do
    local g = {}
    for i = 1, #flat, 2 do
      g[flat[i]] = flat[i + 1]
    end
    -- Nothing pending: everything up to the last id read is acknowledged.
    local keep = id_after(g['last-delivered-id'])
    if tonumber(g['pending']) > 0 then
      keep = redis.call('XPENDING', KEYS[1], g['name'])[2]
    end
    if floor == nil or id_less(keep, floor) then
      floor = keep
    end
  end
  if floor then
    redis.call('XTRIM', KEYS[1], 'MINID', floor)
  end
end

-- The first group of the stream other than this one, or nil.
local function other_group()
  local groups = redis.pcall('XINFO', 'GROUPS', stream)
  if type(groups) ~= 'table' or groups.err then
    return nil
  end
  for _, flat in ipairs(groups) do
    for i = 1, #flat, 2 do
      if flat[i] == 'name' and flat[i + 1] ~= group then
        return flat[i + 1]
      end
    end
  end
  return nil
end

if #due > 0 and to_lane then
  trim_lane()
end
if #due > 0 and not to_lane then
  held_by = other_group() or ''
  if held_by ~= '' and o.past_other_groups ~= true then
    due = {}
  end
end

local function dead_letter(member, reason, owner_stream, owner_group)
  local args = {KEYS[3]}
  if tonumber(o.dead_letter_maxlen) > 0 then
    args = {KEYS[3], 'MAXLEN', '~', o.dead_letter_maxlen}
  end
  local mark = seal(secret, {SEAL_MEMBER, KEYS[2], owner_stream, owner_group, member})
  for _, v in ipairs({'*', F_MEMBER, member, F_REASON, reason, F_ORIGIN_KEY, KEYS[2],
      F_ORIGIN_STREAM, owner_stream, F_ORIGIN_GROUP, owner_group, F_MARK, mark}) do
    args[#args + 1] = v
  end
  local written = redis.pcall('XADD', unpack(args))
  if type(written) == 'table' and written.err then
    stuck = stuck + 1
    return false
  end
  dead = dead + 1
  return true
end

-- The copy at the stream's tail: the fields (packed past what one XADD carries), then the
-- bookkeeping and its seal.
local function tail_copy(fields, origin, retry, score)
  local args = {KEYS[1], '*'}
  local own, use = fields, SEAL_TAIL
  if #fields / 2 > max_fields then
    own, use = {F_PACKED, cmsgpack.pack(fields)}, SEAL_TAIL_PACKED
  end
  for _, v in ipairs(own) do
    args[#args + 1] = v
  end
  local mark = seal(secret, {use, stream, group, origin, retry, score, fields_digest(own)})
  for _, v in ipairs({F_RETRY, retry, F_ORIGIN, origin, F_DUE, score, F_ORIGIN_GROUP, group,
      F_MARK, mark}) do
    args[#args + 1] = v
  end
  return redis.pcall('XADD', unpack(args))
end

local own_prefix = member_prefix(stream, group)
for i = 1, #due, 2 do
  local member, score = due[i], due[i + 1]
  local done, added
  if to_lane and string.sub(member, 1, #own_prefix) == own_prefix then
    -- This subscription's own member: it moves as it is, sealed (the reader unpacks it).
    local mark = seal(secret, {SEAL_LANE, stream, group, member, score})
    added = redis.pcall('XADD', KEYS[1], '*', F_PARKED, member, F_DUE, score, F_MARK, mark)
  else
    local id, retry, fields, origin, owner_stream, owner_group = read_member(member)
    if not id then
      done = dead_letter(member, 'unreadable delayed-retry set member (not written by Sluice)',
        stream, group)
    elseif owner_stream ~= nil and (owner_stream ~= stream or owner_group ~= group) then
      done = dead_letter(member, 'parked by stream `' .. tostring(owner_stream) .. '` group `' ..
        tostring(owner_group) .. '`, not by this set\'s subscription (stream `' .. stream ..
        '` group `' .. group .. '`): not delivered to this subscription\'s handler', stream, group)
    elseif to_lane then
      -- An earlier release's member (no owner): this set's, moved as it is.
      local mark = seal(secret, {SEAL_LANE, stream, group, member, score})
      added = redis.pcall('XADD', KEYS[1], '*', F_PARKED, member, F_DUE, score, F_MARK, mark)
    else
      added = tail_copy(fields, origin, tostring(retry), score)
    end
  end
  if added ~= nil then
    if type(added) == 'table' and added.err then
      done = dead_letter(member, 'cannot re-add the retry: ' .. added.err, stream, group)
    else
      moved = moved + 1
      done = true
    end
  end
  if done then
    redis.call('ZREM', KEYS[2], member)
  end
end
local wait_us = -1
local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
if #first == 2 then
  local next_due = tonumber(first[2])
  local ttl = tonumber(o.ttl_ms)
  if ttl > 0 then
    local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
    redis.call('PEXPIREAT', KEYS[2], math.max(tonumber(last[2]), now) + ttl)
  end
  -- The wait is counted from the end of the pass, in microseconds: a pass of many entries takes
  -- a millisecond or more, and "now" at its start would make the host's timer that much late.
  local ended = redis.call('TIME')
  wait_us = next_due * 1000 - (tonumber(ended[1]) * 1000000 + tonumber(ended[2]))
  -- Kept within what the reply's integer holds whatever score a stranger wrote.
  wait_us = math.min(math.max(0, wait_us), 2 ^ 53)
end
return {moved, wait_us, now, dead, stuck, held_by}
