-- Which entries the host read itself may run now (its own pending entries, the lane's, those it
-- claimed: new stream entries are ordered as they are read, by read.lua), by their keys' turns
-- (see lib/order.lua): an entry that holds a turn already runs (found by its origin id), one whose key has a free turn and nothing waiting takes it and
-- runs, any other must wait (the host then queues it with hold.lua). Writes only the turns
-- taken; an entry that must wait is left as it is.
--
-- KEYS[1]  the subscription's key names (hash), KEYS[2] its waiting keys (sorted set)
-- KEYS[3..5] unused here (the stream, the lane, the delayed set: every order script but the
--          operator's takes the same first six keys)
-- KEYS[6]  the subscription's turns (hash: origin id -> key digest)
-- KEYS[7..] each key's `run` and `wait`, in pairs
-- ARGV[1]  the most entries of one key in flight at once
-- ARGV[2..] per entry, four values: its key's pair (1 for KEYS[7..8]), the key's digest, the
--          entry's origin id, the key's text
--
-- Reply: per entry, 1 (run) or 0 (must wait), in order. Entries of one key in one read are
-- taken in the read's order, so the first takes the turn and the others wait behind it.
-- @include lib/order
local max = tonumber(ARGV[1])
local now = order_now()
local out = {}
for i = 2, #ARGV, 4 do
  local pair = tonumber(ARGV[i])
  local k = {run = KEYS[5 + 2 * pair], wait = KEYS[6 + 2 * pair], names = KEYS[1],
    waiting = KEYS[2], turns = KEYS[6]}
  -- A turn already held runs, whatever key the host made of the entry.
  if redis.call('HEXISTS', KEYS[6], ARGV[i + 2]) == 1 then
    out[#out + 1] = 1
  else
    out[#out + 1] = order_take(k, ARGV[i + 1], ARGV[i + 2], max, now) and 1 or 0
  end
end
return out
