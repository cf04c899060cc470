-- Take tokens from a subscription's shared token bucket, refilled at the rate by this server's
-- clock; nothing below the fewest worth a read is granted, so hosts waiting on a tight budget
-- read in batches, not an entry at a time.
--
-- KEYS[1]  the bucket (a hash: t = tokens left, at = when they were counted, ms)
-- ARGV[1]  tokens a second (more than 0)
-- ARGV[2]  the bucket's size (burst)
-- ARGV[3]  tokens wanted
-- ARGV[4]  the fewest worth a read
--
-- What another writer may have left in the hash is bounded: tokens are clamped to
-- [0, burst], non-numbers make a full bucket, and a time in the future (a clock that went
-- back on a failover, a hostile value) counts as now, so refilling never waits for it. The
-- bucket expires once an idle one would be full again (burst / rate, plus a minute).
--
-- Reply: {granted, wait_ms}: wait_ms, when nothing was granted, is how long until the fewest
-- worth a read are there (0 otherwise). An error reply when the key holds another type.
--
-- Crash: Redis keeps all of the script's writes or none. A host that dies before the call
-- took nothing; one that dies after it loses the tokens it took (the bucket refills at the
-- rate: the group reads less for a moment, never more than the limit).
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + tonumber(clock[2]) / 1000
local rate = tonumber(ARGV[1]) / 1000
local burst = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local batch = tonumber(ARGV[4])
local state = redis.call('HMGET', KEYS[1], 't', 'at')
local tokens = tonumber(state[1])
local at = tonumber(state[2])
if tokens == nil or at == nil or tokens ~= tokens or at ~= at then
  tokens = burst
  at = now
end
if at > now then
  at = now
end
tokens = math.min(burst, math.max(0, tokens))
if now > at then
  tokens = math.min(burst, tokens + (now - at) * rate)
  at = now
end
local granted = 0
if tokens >= batch then
  granted = math.min(want, math.floor(tokens))
end
tokens = tokens - granted
redis.call('HSET', KEYS[1], 't', tostring(tokens), 'at', tostring(at))
-- An idle bucket is full again after burst / rate: then it may go.
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate) + 60000)
local wait = 0
if granted == 0 then
  wait = math.ceil((batch - tokens) / rate)
end
return {granted, wait}
