-- Which entries the host read itself may run now (its own pending entries, the lane's, those it
-- claimed: new stream entries are ordered as they are read, by read.lua), by their keys' turns
-- (see lib/order.lua): an entry that holds a turn already runs (found by its origin id), one whose key has a free turn and nothing waiting takes it and
-- runs, any other must wait (the host then queues it with hold.lua). Writes only the turns
-- taken; an entry that must wait is left as it is.
--
-- KEYS[1]  the subscription's key names (hash), KEYS[2] its waiting keys (sorted set)
-- KEYS[3..5] unused here (the stream, the lane, the delayed set: every order script but the
--          operator's takes the same first six keys)
-- KEYS[6]  the subscription's turns (hash: origin id -> key digest and time)
-- ARGV[1]  the most entries of one key in flight at once
-- ARGV[2]  the prefix of the keys' own keys (see lib/order.lua), in the stream's hash slot
-- ARGV[3..] per entry, two values: the key's digest, the entry's origin id
--
-- Reply: per entry, 1 (run) or 0 (must wait), in order. Entries of one key in one read are
-- taken in the read's order, so the first takes the turn and the others wait behind it.
-- @include lib/order
local k = order_state(ARGV[2], KEYS[1], KEYS[2], KEYS[6], KEYS[5], tonumber(ARGV[1]), 0)
local out = {}
for i = 3, #ARGV, 2 do
  -- A turn already held runs, whatever key the host made of the entry.
  out[#out + 1] = order_take(k, ARGV[i], ARGV[i + 1]) and 1 or 0
end
return out
