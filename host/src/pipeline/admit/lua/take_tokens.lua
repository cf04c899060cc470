-- Take up to ARGV[3] tokens from a subscription's shared token bucket (KEYS[1], a hash:
-- t = tokens left, at = when they were counted, ms by this server's clock).
-- ARGV[1]: tokens a second; ARGV[2]: the bucket's size (burst); ARGV[3]: tokens wanted;
-- ARGV[4]: the fewest worth a read (nothing is granted below it, so hosts waiting on a
-- tight budget read in batches, not an entry at a time).
-- Returns {granted, wait_ms}: wait_ms, when nothing was granted, is how long until the
-- fewest worth a read are there.
-- What another writer may have left in the hash is bounded: tokens are clamped to
-- [0, burst], non-numbers make a full bucket, and a time in the future (a clock that went
-- back on a failover, a hostile value) counts as now, so refilling never waits for it.
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
