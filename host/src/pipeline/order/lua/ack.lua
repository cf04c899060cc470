-- Acknowledge settled entries of an ordered subscription and give their keys' turns back,
-- atomically: an entry acknowledged here passes its turn on in the same call, so a turn is
-- never lost between the two. Each entry Redis still had pending gives its turn back and lets
-- the next waiting entries of its key in (lib/order.lua: to the delayed set, due now); one no
-- longer pending (another host settled it, and passed the turn on then) gives nothing back.
--
-- KEYS[1]  the subscription's key names, KEYS[2] its waiting keys
-- KEYS[3]  the stream, KEYS[4] the retry lane (the stream again when there is none)
-- KEYS[5]  the delayed set
-- KEYS[6]  the subscription's turns (hash: origin id -> key digest)
-- KEYS[7..] each key's `run` and `wait`, in pairs
-- ARGV[1]  the consumer group
-- ARGV[2]  the most entries of one key in flight at once
-- ARGV[3]  the delayed set's ttl, ms (0: none)
-- ARGV[4..] per entry, five values: its key's pair (0: the entry has no key), the key's
--          digest, the origin id, where it was read (1 the stream, 2 the lane), its id there
--
-- Reply: {entries acknowledged, entries let in}.
-- @include lib/order
local group, max, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now = order_now()
local acked, went = 0, 0
for i = 4, #ARGV, 5 do
  local pair = tonumber(ARGV[i])
  local source = KEYS[2 + tonumber(ARGV[i + 3])]
  local done = redis.call('XACK', source, group, ARGV[i + 4])
  acked = acked + done
  if done == 1 and pair > 0 then
    local k = {run = KEYS[5 + 2 * pair], wait = KEYS[6 + 2 * pair], names = KEYS[1],
      waiting = KEYS[2], turns = KEYS[6]}
    went = went + order_release(k, ARGV[i + 1], ARGV[i + 2], max, KEYS[5], ttl, now)
  end
end
return {acked, went}
