-- Move the entries that are due from the delayed-retry set back onto the stream, atomically
-- per call: each due member is appended under a new id (*) with its bookkeeping, and removed
-- from the set, so two hosts sweeping one set never both move an entry.
--
-- KEYS[1]  where due entries go: the stream, or the subscription's retry lane
-- KEYS[2]  the delayed-retry sorted set
-- KEYS[3]  the dead-letter stream: a member that cannot go back onto the stream goes there
--          instead of blocking every sweep after it
-- ARGV[1]  the most entries to move in this pass
-- ARGV[2]  the stream's secret, which keys the mark over the bookkeeping
-- ARGV[3]  the set's ttl in milliseconds, 0 for none
-- ARGV[4]  the most fields one XADD from this script may carry
-- ARGV[5..12] the bookkeeping field names, in order: retry count, origin id, due time, mark,
--          member, reason, origin key, origin stream (from the host's keys module)
-- ARGV[13] trim the dead-letter stream to about this many entries (MAXLEN ~), 0 for never
-- ARGV[14] the subscription's stream: the name the mark covers and dead letters record as
--          their origin, whether KEYS[1] is that stream or its lane
--
-- A lane (KEYS[1] is not ARGV[14]) is the host's own stream, so the sweep keeps it short:
-- before adding to it, it trims every entry below the oldest one some group of the lane still
-- has pending or has not read yet (XTRIM MINID), i.e. only what every group has acknowledged.
--
-- A re-added entry carries the member's fields, then exactly four bookkeeping fields: retry
-- count, origin id (the entry the producer first added), due time (server clock, epoch ms), and
-- a mark, sha1(secret .. sha1(secret .. message)) in hex over the other three and the stream
-- name. The host trusts the bookkeeping only when the mark verifies, so a producer that writes
-- such fields itself changes nothing.
--
-- A member is dead-lettered, raw, with a reason, when it is not a member the park script wrote,
-- when it has more fields than one XADD can carry, or when Redis refuses the XADD. If even the
-- dead-letter write fails the member stays in the set and is counted as stuck.
--
-- "Now" is the Redis server's clock (TIME), the same clock parking used. With a ttl, the set's
-- expiry moves to `ttl` after its latest due time (or after now), as the park script does.
--
-- Reply: {moved, wait_us, now_ms, dead_lettered, stuck}: wait_us is how long after the pass
-- ended (server clock, microseconds) the earliest member left is due, 0 if it is due already,
-- -1 if the set is empty.
local F_RETRY, F_ORIGIN, F_DUE, F_MARK = ARGV[5], ARGV[6], ARGV[7], ARGV[8]
local F_MEMBER, F_REASON, F_ORIGIN_KEY, F_ORIGIN_STREAM = ARGV[9], ARGV[10], ARGV[11], ARGV[12]
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'WITHSCORES', 'LIMIT', 0,
  tonumber(ARGV[1]))
local secret = ARGV[2]
local max_fields = tonumber(ARGV[4])
local moved, dead, stuck = 0, 0, 0
local stream = ARGV[14]

-- Stream ids compare as two numbers, ms then sequence.
local function id_less(a, b)
  local ams, aseq = string.match(a, '^(%d+)-(%d+)$')
  local bms, bseq = string.match(b, '^(%d+)-(%d+)$')
  ams, bms = tonumber(ams), tonumber(bms)
  return ams < bms or (ams == bms and tonumber(aseq) < tonumber(bseq))
end

-- Drop the lane's entries that every group of the lane has read and acknowledged.
local function trim_lane()
  local groups = redis.pcall('XINFO', 'GROUPS', KEYS[1])
  if type(groups) ~= 'table' or groups.err or #groups == 0 then
    return
  end
  local floor
  for _, flat in ipairs(groups) do
    local group = {}
    for i = 1, #flat, 2 do
      group[flat[i]] = flat[i + 1]
    end
    -- Nothing pending: everything up to the last id read is acknowledged.
    local ms, seq = string.match(group['last-delivered-id'], '^(%d+)-(%d+)$')
    local keep = ms .. '-' .. string.format('%.0f', tonumber(seq) + 1)
    if tonumber(group['pending']) > 0 then
      keep = redis.call('XPENDING', KEYS[1], group['name'])[2]
    end
    if floor == nil or id_less(keep, floor) then
      floor = keep
    end
  end
  if floor then
    redis.call('XTRIM', KEYS[1], 'MINID', floor)
  end
end

if #due > 0 and KEYS[1] ~= stream then
  trim_lane()
end

local function dead_letter(member, reason)
  local args = {KEYS[3]}
  if tonumber(ARGV[13]) > 0 then
    args = {KEYS[3], 'MAXLEN', '~', ARGV[13]}
  end
  for _, v in ipairs({'*', F_MEMBER, member, F_REASON, reason, F_ORIGIN_KEY, KEYS[2],
      F_ORIGIN_STREAM, stream}) do
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

for i = 1, #due, 2 do
  local member, score = due[i], due[i + 1]
  local done
  local ok, parked = pcall(cmsgpack.unpack, member)
  if not (ok and type(parked) == 'table' and type(parked[1]) == 'string'
      and type(parked[2]) == 'number' and type(parked[3]) == 'table') then
    done = dead_letter(member, 'unreadable delayed-retry set member (not written by Sluice)')
  elseif #parked[3] / 2 > max_fields then
    done = dead_letter(member, 'cannot re-add a retry with ' .. (#parked[3] / 2) ..
      ' fields: one XADD from a script carries at most ' .. max_fields)
  else
    local origin = parked[4]
    if type(origin) ~= 'string' then
      origin = parked[1]
    end
    local retry = tostring(parked[2])
    local message = #stream .. ':' .. stream .. ':' .. origin .. ':' .. retry .. ':' .. score
    local mark = redis.sha1hex(secret .. redis.sha1hex(secret .. message))
    local args = {KEYS[1], '*'}
    for _, v in ipairs(parked[3]) do
      args[#args + 1] = v
    end
    args[#args + 1] = F_RETRY
    args[#args + 1] = retry
    args[#args + 1] = F_ORIGIN
    args[#args + 1] = origin
    args[#args + 1] = F_DUE
    args[#args + 1] = score
    args[#args + 1] = F_MARK
    args[#args + 1] = mark
    local added = redis.pcall('XADD', unpack(args))
    if type(added) == 'table' and added.err then
      done = dead_letter(member, 'cannot re-add the retry to the stream: ' .. added.err)
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
  local ttl = tonumber(ARGV[3])
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
return {moved, wait_us, now, dead, stuck}
