-- A probe's answer to a half-open circuit breaker: success closes it (and empties the
-- window), failure opens it again for ARGV[2] ms.
--
-- KEYS[1]  the flow hash (`breaker`)
-- KEYS[2]  the window
-- KEYS[3]  the flow journal (see lib/journal.lua)
-- ARGV[1]  1 (success) or 0 (failure)
-- ARGV[2]  how long it stays open after a failure (ms)
-- ARGV[3]  why the probe failed
-- ARGV[4]  who (this host)
--
-- Reply: {'closed', ''}, {'reopened', record}, or {'ignored', ''} when it was not half-open
-- (another probe answered first, or the record is not Sluice's). An error reply when the flow
-- hash holds another type.
--
-- Crash: Redis keeps all of the script's writes or none. A host that dies before answering
-- leaves its permit unanswered: the round starts again once its time is up (see
-- breaker_probe.lua). One that dies after the call, before its bump, leaves the other hosts
-- to see the change when they read the flow hash again.
-- @include lib/journal
local raw = redis.call('HGET', KEYS[1], 'breaker')
if not raw then
  return {'ignored', ''}
end
local ok, b = pcall(cjson.decode, raw)
if not ok or type(b) ~= 'table' or b.state ~= 'half-open' then
  return {'ignored', ''}
end
if ARGV[1] == '1' then
  redis.call('HDEL', KEYS[1], 'breaker')
  redis.call('DEL', KEYS[2])
  journal(KEYS[3], 'breaker-closed', ARGV[4], 'a probe succeeded')
  return {'closed', ''}
end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local state = cjson.encode({
  state = 'open', since_ms = now, until_ms = now + tonumber(ARGV[2]),
  why = ARGV[3], by = ARGV[4],
})
redis.call('HSET', KEYS[1], 'breaker', state)
journal(KEYS[3], 'breaker-reopened', ARGV[4], 'a probe failed: ' .. ARGV[3])
return {'reopened', state}
