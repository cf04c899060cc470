-- The earliest score of each sorted set: a delayed set's next due time, which the polling
-- doorbell rings for when it changes.
--
-- KEYS[1..n]  the delayed-retry sets
-- ARGV        none
--
-- Reply: one value per key, in order: the earliest score as Redis writes it (a double, e.g.
-- '1700000000000'), '' for an empty or missing set. A key that holds another type fails the
-- whole call (WRONGTYPE), unlike tips.lua: the polling doorbell then goes down and starts again
-- after a backoff (its subscriptions read every `block` meanwhile).
--
-- Crash: reads only; nothing to leave.
local out = {}
for i, key in ipairs(KEYS) do
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  out[i] = first[2] or ''
end
return out
