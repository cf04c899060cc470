-- Which entries the host read itself may run now (its own pending entries, the lane's, those it
-- claimed: new stream entries are ordered as they are read, by read.lua), by their keys' turns
-- (see lib/order.lua): an entry that holds a turn already runs (found by its origin id), one whose key has a free turn and nothing waiting takes it and
-- runs, any other must wait (the host then queues it with hold.lua). Writes only the turns
-- taken; an entry that must wait is left as it is.
--
-- KEYS[1]  the subscription's key names (hash), KEYS[2] its waiting keys (sorted set)
-- KEYS[3]  the stream, KEYS[4] the retry lane (the stream again when there is none)
-- KEYS[5]  unused here (the delayed set: every order script but the operator's takes the
--          same first six keys)
-- KEYS[6]  the subscription's turns (hash: origin id -> key digest and time)
-- ARGV[1]  the consumer group
-- ARGV[2]  the most entries of one key in flight at once
-- ARGV[3]  the prefix of the keys' own keys (see lib/order.lua), in the stream's hash slot
-- ARGV[4..] per entry, four values: the key's digest, the entry's origin id, where it was read
--          (1 the stream, 2 the lane), its id there
--
-- Reply: per entry, 1 (run), 0 (must wait) or -1 (no longer pending: another consumer settled
-- it; nothing written), in order. Entries of one key in one read are
-- taken in the read's order, so the first takes the turn and the others wait behind it.
-- @include lib/pending
-- @include lib/order
local k = order_state(ARGV[3], KEYS[1], KEYS[2], KEYS[6], KEYS[5], tonumber(ARGV[2]), 0)
local group = ARGV[1]
local err = order_check_argv(k, 4, 4)
if err then
  return err
end
local out = {}
for i = 4, #ARGV, 4 do
  local source = KEYS[2 + tonumber(ARGV[i + 2])]
  local state, stop = pending_state(source, group, ARGV[i + 3])
  if not state then
    if stop ~= false then
      return stop
    end
    -- Settled by another consumer meanwhile: a turn taken now would never be given back.
    out[#out + 1] = -1
  else
    -- A turn already held runs, whatever key the host made of the entry.
    out[#out + 1] = order_take(k, ARGV[i], ARGV[i + 1]) and 1 or 0
  end
end
return out
