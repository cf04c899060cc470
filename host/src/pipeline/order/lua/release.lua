-- An operator releases a key: every turn it holds is given back (whatever holds it: an entry
-- in flight, a parked retry, a dead letter held with `hold`) and its waiting entries go in
-- while it has free turns. What held a turn is not touched: a parked retry still comes back
-- and is handled (then as an entry that holds no turn, which takes one if free or waits).
--
-- KEYS[1]  the subscription's key names, KEYS[2] its waiting keys, KEYS[3] the delayed set
-- KEYS[4]  the key's `run`, KEYS[5] its `wait`, KEYS[6] the subscription's turns (origin id -> key digest)
-- ARGV[1]  the key's digest, ARGV[2] the most in flight per key, ARGV[3] the set's ttl (ms)
--
-- Reply: {turns given back, entries let in}.
-- @include lib/order
local kd, max, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local holders = redis.call('HKEYS', KEYS[4])
redis.call('DEL', KEYS[4])
for _, origin in ipairs(holders) do
  if redis.call('HGET', KEYS[6], origin) == kd then
    redis.call('HDEL', KEYS[6], origin)
  end
end
local k = {run = KEYS[4], wait = KEYS[5], names = KEYS[1], waiting = KEYS[2], turns = KEYS[6]}
return {#holders, order_let_in(k, kd, max, KEYS[3], ttl, order_now())}
