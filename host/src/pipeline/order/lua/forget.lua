-- Give back the turns entries hold when the entries themselves are gone (deleted from the
-- stream while pending, a held dead letter deleted): each turn's key is found from the
-- subscription's `turns` (see lib/order.lua), and the key's next entries go in.
--
-- KEYS[1]  the subscription's key names, KEYS[2] its waiting keys
-- KEYS[3..4] unused here (the stream, the lane)
-- KEYS[5]  the delayed set, KEYS[6] the subscription's turns
-- ARGV[1]  the prefix of the keys' own keys (`<prefix>:load`, `<prefix>:wait:<digest>`, in the
--          stream's hash slot like KEYS)
-- ARGV[2]  the most in flight per key, ARGV[3] the set's ttl (ms)
-- ARGV[4..] the origin ids
--
-- Reply: how many entries went in.
-- @include lib/order
local k = order_state(ARGV[1], KEYS[1], KEYS[2], KEYS[6], KEYS[5], tonumber(ARGV[2]),
  tonumber(ARGV[3]))
local origins = {}
for i = 4, #ARGV do
  origins[#origins + 1] = ARGV[i]
end
return order_give_back(k, origins)
