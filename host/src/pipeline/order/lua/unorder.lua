-- A subscription that is no longer ordered (its `ordered_by` removed) lets go of what its
-- ordering left in Redis, so that nothing queued behind a key is stranded: every queued entry
-- goes to the delayed set due now (the sweep returns it to the group's lane), and the turns and
-- names go. At most ARGV[3] keys per call; the caller calls again while it answers more.
--
-- KEYS[1]  the key names, KEYS[2] the waiting keys, KEYS[3] the delayed set, KEYS[4] the turns
-- ARGV[1]  the prefix of the keys' own keys (`<prefix>:load`, `<prefix>:wait:<digest>`, in the
--          stream's hash slot like KEYS)
-- ARGV[2]  unused (kept for the order scripts' shape)
-- ARGV[3]  the most keys this call lets go
--
-- Reply: {entries moved to the set, keys left}.
-- @include lib/order
local now = order_now()
local moved = 0
local keys = redis.call('ZRANGE', KEYS[2], 0, tonumber(ARGV[3]) - 1)
local err = order_check({prefix = ARGV[1], load = ARGV[1] .. ':load', names = KEYS[1],
  waiting = KEYS[2], set = KEYS[3], turns = KEYS[4]}, keys)
if err then
  return err
end
for _, kd in ipairs(keys) do
  local went = 0
  local wait = ARGV[1] .. ':wait:' .. kd
  while true do
    local member = redis.call('LPOP', wait)
    if not member then
      break
    end
    redis.call('ZADD', KEYS[3], now, member)
    went = went + 1
  end
  moved = moved + went
  -- What stays counted is what holds (a call cut short, then ordered again, stays exact).
  if went > 0 and redis.call('HINCRBY', ARGV[1] .. ':load', kd, -went) <= 0 then
    redis.call('HDEL', ARGV[1] .. ':load', kd)
  end
  redis.call('ZREM', KEYS[2], kd)
  redis.call('HDEL', KEYS[1], kd)
end
local left = redis.call('ZCARD', KEYS[2])
if left == 0 then
  -- The turns and loads: their holders settle as unordered entries now.
  redis.call('DEL', KEYS[4], ARGV[1] .. ':load')
end
return {moved, left}
