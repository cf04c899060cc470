-- Trim what every consumer group of a stream has acknowledged, older than `keep_acked`, in one
-- atomic step, by whichever host holds the stream's retention lease; and a subscription's dead
-- letters older than their `keep`, by whichever host holds the dead-letter stream's lease (one
-- per dead-letter stream: every group of a stream has its own).
--
-- KEYS[1]  the stream
-- KEYS[2]  the stream's lease (a string: the holder's name, with an expiry)
-- KEYS[3]  the stream's last run's record (a hash: at_ms, trimmed, threshold, length, blocked,
--          holder, dead_trimmed)
-- KEYS[4]  the dead-letter stream
-- KEYS[5]  the dead-letter stream's lease
-- ARGV[1]  this host's name for the lease
-- ARGV[2]  the lease's length in milliseconds
-- ARGV[3]  keep_acked in milliseconds
-- ARGV[4]  max_len, 0 for none
-- ARGV[5]  how long dead letters are kept, in milliseconds, 0 for ever
-- ARGV[6]  the most entries one run may trim
-- ARGV[7]  1 to trim the stream, 0 to trim only dead letters
--
-- What a group still needs: every entry it has not read (after its last-delivered id) and every
-- entry pending for it (from its oldest pending id). So nothing below the smallest, over all the
-- stream's groups (Sluice's or not), of min(oldest pending id, last-delivered id) is needed by
-- anyone, and only that is trimmed (XTRIM MINID: ids lower than the threshold go), and only
-- what is older than `keep_acked`. A stream without groups is never trimmed: nobody has read it.
-- `max_len` lets the run trim everything acknowledged, however young, while the stream is longer;
-- when even that leaves it longer, the run says so (blocked) and keeps the entries.
--
-- Ids are compared exactly (lib/ids.lua), never as Lua numbers.
--
-- Trimming is approximate (MINID ~): Redis drops whole nodes only, so it may keep a few more
-- entries than allowed, never fewer; LIMIT bounds the work of one run.
--
-- Reply: {held (1, or 0 when another host holds the stream's lease), trimmed, length after,
-- blocked (1/0), threshold id ('' when nothing could be trimmed), dead letters trimmed}. An
-- error reply when a key holds another type (what was trimmed before stays trimmed).
--
-- Crash: Redis keeps all of the script's writes or none, and trimming only drops what nobody
-- needs: a run cut short (a host that dies before the call, a Redis crash during it) leaves it
-- for the next run. A host that dies holding a lease holds it until it expires (ARGV[2]); no
-- other host trims that stream meanwhile.
-- @include lib/ids

-- Whether this host holds `lease` (taking it when it is free, renewing it when it is ours).
local function hold(lease)
  local holder = redis.call('GET', lease)
  if holder and holder ~= ARGV[1] then
    return false
  end
  redis.call('SET', lease, ARGV[1], 'PX', ARGV[2])
  return true
end

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

local dead_trimmed = 0
if tonumber(ARGV[5]) > 0 and hold(KEYS[5]) then
  local oldest = string.format('%.0f', math.max(0, now - tonumber(ARGV[5]))) .. '-0'
  dead_trimmed = redis.call('XTRIM', KEYS[4], 'MINID', '~', oldest, 'LIMIT', tonumber(ARGV[6]))
end

if not hold(KEYS[2]) then
  return {0, 0, 0, 0, '', dead_trimmed}
end

local length = redis.call('XLEN', KEYS[1])
local groups = {}
if length > 0 and ARGV[7] == '1' then
  groups = redis.call('XINFO', 'GROUPS', KEYS[1])
end
local needed = nil
for _, g in ipairs(groups) do
  local name, pending, last
  for i = 1, #g, 2 do
    if g[i] == 'name' then
      name = g[i + 1]
    elseif g[i] == 'pending' then
      pending = g[i + 1]
    elseif g[i] == 'last-delivered-id' then
      last = g[i + 1]
    end
  end
  local limit = last
  if pending > 0 then
    local oldest = redis.call('XPENDING', KEYS[1], name)[2]
    if id_less(oldest, limit) then
      limit = oldest
    end
  end
  if needed == nil or id_less(limit, needed) then
    needed = limit
  end
end

local trimmed, blocked, threshold = 0, 0, ''
if needed ~= nil then
  threshold = needed
  local aged = string.format('%.0f', math.max(0, now - tonumber(ARGV[3]))) .. '-0'
  local capped = tonumber(ARGV[4]) > 0 and length > tonumber(ARGV[4])
  if not capped and id_less(aged, threshold) then
    threshold = aged
  end
  trimmed = redis.call('XTRIM', KEYS[1], 'MINID', '~', threshold, 'LIMIT', tonumber(ARGV[6]))
  length = redis.call('XLEN', KEYS[1])
  if tonumber(ARGV[4]) > 0 and length > tonumber(ARGV[4]) then
    blocked = 1
  end
end
redis.call('HSET', KEYS[3], 'at_ms', now, 'trimmed', trimmed, 'threshold', threshold,
  'length', length, 'blocked', blocked, 'holder', ARGV[1], 'dead_trimmed', dead_trimmed)
return {1, trimmed, length, blocked, threshold, dead_trimmed}
