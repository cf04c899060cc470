-- Count a host's deliveries and failures into a subscription's circuit-breaker window, and
-- open the breaker when the window's failures reach the rate.
--
-- KEYS[1]  the window (a hash: 30 slots, each `t<i>` the slot's time bucket, `d<i>`
--          deliveries, `f<i>` failures)
-- KEYS[2]  the subscription's flow hash (`breaker`)
-- KEYS[3]  its flow journal (see lib/journal.lua)
-- ARGV[1]  deliveries, ARGV[2] failures
-- ARGV[3]  the window (ms)
-- ARGV[4]  the fewest deliveries to judge
-- ARGV[5]  the failure rate that opens it (0..1)
-- ARGV[6]  how long it stays open (ms)
-- ARGV[7]  who (this host, for the record and the journal)
--
-- Only the window's own 90 fields are read, whatever else the hash holds; a value there that
-- is no number counts as 0 in the sums, but a count that is no integer in the current slot
-- fails the call (HINCRBY) until the slot's time passes (its width, at least a second), and
-- the counts of those calls are lost. Opening deletes the window.
--
-- Reply: {'opened', record} when this call opened it, {'closed', ''} when it stays closed,
-- {'not-closed', ''} when it was open already (the counts are not kept: an open breaker's
-- stragglers say nothing new). An error reply when the window or the flow hash holds another
-- type (a journal of another type is skipped).
--
-- Crash: Redis keeps all of the script's writes or none. A host that dies before the call
-- loses the counts it had not added, which only delays an opening. One that opens the breaker
-- and dies before the bump that follows leaves the other hosts to find it when they read the
-- flow hash again (within admit::FULL_REFRESH).
-- @include lib/journal
if redis.call('HEXISTS', KEYS[2], 'breaker') == 1 then
  return {'not-closed', ''}
end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local d = math.max(0, tonumber(ARGV[1]) or 0)
local f = math.max(0, tonumber(ARGV[2]) or 0)
local window = tonumber(ARGV[3])
local min = tonumber(ARGV[4])
local rate = tonumber(ARGV[5])
local open_for = tonumber(ARGV[6])
local slots = 30
local width = math.max(1000, math.ceil(window / slots))
local bucket = math.floor(now / width)
local i = bucket % slots
if tonumber(redis.call('HGET', KEYS[1], 't' .. i)) ~= bucket then
  redis.call('HSET', KEYS[1], 't' .. i, bucket, 'd' .. i, 0, 'f' .. i, 0)
end
redis.call('HINCRBY', KEYS[1], 'd' .. i, d)
redis.call('HINCRBY', KEYS[1], 'f' .. i, f)
redis.call('PEXPIRE', KEYS[1], window + 60000)
local names = {}
for j = 0, slots - 1 do
  names[#names + 1] = 't' .. j
  names[#names + 1] = 'd' .. j
  names[#names + 1] = 'f' .. j
end
local values = redis.call('HMGET', KEYS[1], unpack(names))
local oldest = bucket - math.ceil(window / width) + 1
local sum_d, sum_f = 0, 0
for j = 0, slots - 1 do
  local t = tonumber(values[j * 3 + 1])
  if t and t >= oldest and t <= bucket then
    sum_d = sum_d + math.max(0, tonumber(values[j * 3 + 2]) or 0)
    sum_f = sum_f + math.max(0, tonumber(values[j * 3 + 3]) or 0)
  end
end
if sum_d >= min and sum_d > 0 and sum_f / sum_d >= rate then
  local state = cjson.encode({
    state = 'open', since_ms = now, until_ms = now + open_for,
    failed = sum_f, of = sum_d, by = ARGV[7],
  })
  redis.call('HSET', KEYS[2], 'breaker', state)
  redis.call('DEL', KEYS[1])
  journal(KEYS[3], 'breaker-opened', ARGV[7],
    string.format('%d of %d deliveries failed within the window', sum_f, sum_d))
  return {'opened', state}
end
return {'closed', ''}
