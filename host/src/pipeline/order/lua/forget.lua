-- Give back the turns entries hold when the entries themselves are gone (deleted from the
-- stream while pending, a held dead letter deleted): each turn's key is found from the
-- subscription's `turns` (see lib/order.lua), and the key's next entries go in.
--
-- KEYS[1]  the subscription's key names, KEYS[2] its waiting keys
-- KEYS[3..4] unused here (the stream, the lane)
-- KEYS[5]  the delayed set, KEYS[6] the subscription's turns
-- ARGV[1]  the prefix of the keys' own keys (`<prefix>:run:<digest>`, `<prefix>:wait:<digest>`,
--          in the stream's hash slot like KEYS)
-- ARGV[2]  the most in flight per key, ARGV[3] the set's ttl (ms)
-- ARGV[4..] the origin ids
--
-- Reply: how many entries went in.
-- @include lib/order
local max, ttl = tonumber(ARGV[2]), tonumber(ARGV[3])
local now = order_now()
local went = 0
for i = 4, #ARGV do
  local k = {names = KEYS[1], waiting = KEYS[2], turns = KEYS[6]}
  went = went + order_forget(k, ARGV[i], max, KEYS[5], ttl, now, ARGV[1])
end
return went
