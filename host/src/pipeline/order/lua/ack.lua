-- Acknowledge settled entries of an ordered subscription and give back the turns they hold,
-- atomically: an entry acknowledged here passes its turn on in the same call, so a turn is
-- never lost between the two. Each entry Redis still had pending gives back the turn its origin
-- id holds (found in the subscription's `turns`, never in what the host makes of the entry:
-- the key is the one the read script took) and lets the next waiting entries of its key in
-- (lib/order.lua: to the delayed set, due now); one no longer pending (another host settled
-- it, and passed the turn on then) gives nothing back, and neither does one that held none.
--
-- KEYS[1]  the subscription's key names, KEYS[2] its waiting keys
-- KEYS[3]  the stream, KEYS[4] the retry lane (the stream again when there is none)
-- KEYS[5]  the delayed set, KEYS[6] the subscription's turns (origin id -> key digest and time)
-- ARGV[1]  the consumer group
-- ARGV[2]  the most entries of one key in flight at once
-- ARGV[3]  the delayed set's ttl, ms (0: none)
-- ARGV[4]  the prefix of the keys' own keys (`<prefix>:load`, `<prefix>:wait:<digest>`, in the
--          stream's hash slot like KEYS)
-- ARGV[5..] per entry, three values: its origin id, where it was read (1 the stream, 2 the
--          lane), its id there
--
-- Reply: {entries acknowledged, entries let in}.
-- @include lib/order
local group = ARGV[1]
local k = order_state(ARGV[4], KEYS[1], KEYS[2], KEYS[6], KEYS[5], tonumber(ARGV[2]),
  tonumber(ARGV[3]))
-- The keys the turns name, checked before the first write (see order_check).
local origins = {}
for i = 5, #ARGV, 3 do
  origins[#origins + 1] = ARGV[i]
end
-- Only a key with more than this call gives back can let entries in: its list is checked.
local kds, known, count = {}, {}, {}
for i, turn in ipairs(#origins > 0 and order_batch('HMGET', k.turns, origins) or {}) do
  if turn and not known[origins[i]] then
    local kd = turn_key(turn)
    if not count[kd] then
      kds[#kds + 1] = kd
      count[kd] = 0
    end
    count[kd] = count[kd] + 1
    known[origins[i]] = turn
  end
end
local loads = order_loads(k, kds)
local lists = {}
for kd, n in pairs(loads) do
  if n > count[kd] then
    lists[#lists + 1] = kd
  end
end
local err = order_check(k, lists)
if err then
  return err
end
local acked, settled = 0, {}
for i = 5, #ARGV, 3 do
  local source = KEYS[2 + tonumber(ARGV[i + 1])]
  local done = redis.call('XACK', source, group, ARGV[i + 2])
  acked = acked + done
  if done == 1 then
    settled[#settled + 1] = ARGV[i]
  end
end
return {acked, order_give_back(k, settled, {turns = known, loads = loads})}
