-- An operator releases a key: every turn it holds is given back (whatever holds it: an entry
-- in flight, a parked retry, a dead letter held with `hold`) and its waiting entries go in
-- while it has free turns. What held a turn is not touched: a parked retry still comes back
-- and is handled (then as an entry that holds no turn, which takes one if free or waits).
-- The key's load goes down by the turns given back.
--
-- KEYS[1]  the subscription's key names, KEYS[2] its waiting keys, KEYS[3] the delayed set
-- KEYS[4]  the subscription's loads, KEYS[5] the key's `wait`, KEYS[6] the subscription's
--          turns (see lib/order.lua)
-- ARGV[1]  the key's digest, ARGV[2] the most in flight per key, ARGV[3] the set's ttl (ms)
-- ARGV[4]  the prefix of the keys' own keys
-- ARGV[5..] the origin ids the host found holding the key's turns (a scan of the turns: one
--          that settled since gives nothing back, one that took a turn since keeps it)
--
-- Reply: {turns given back, entries let in}.
-- @include lib/order
local kd = ARGV[1]
local k = order_state(ARGV[4], KEYS[1], KEYS[2], KEYS[6], KEYS[3], tonumber(ARGV[2]),
  tonumber(ARGV[3]))
local err = order_check(k, {kd})
if err then
  return err
end
local given = 0
for i = 5, #ARGV do
  local turn = redis.call('HGET', k.turns, ARGV[i])
  if turn and turn_key(turn) == kd then
    redis.call('HDEL', k.turns, ARGV[i])
    given = given + 1
  end
end
local load = (tonumber(redis.call('HGET', k.load, kd)) or 0) - given
local went = 0
if load > 0 then
  went, load = order_let_in(k, kd, load)
end
order_store_loads(k, {kd}, {[kd] = load})
return {given, went}
