-- Queue entries that must wait for their key's turn (take.lua said so) and acknowledge them,
-- atomically per entry: an entry is pending or queued, never neither. An entry whose key has a
-- free turn by now (the holder settled since take.lua ran) takes it instead and runs.
--
-- KEYS[1]  the subscription's key names, KEYS[2] its waiting keys (see lib/order.lua)
-- KEYS[3]  the stream, KEYS[4] the retry lane (the stream again when there is none)
-- KEYS[5]  unused here (the delayed set)
-- KEYS[6]  the subscription's turns (hash: origin id -> key digest)
-- KEYS[7..] each key's `run` and `wait`, in pairs
-- ARGV[1]  the consumer group
-- ARGV[2]  the most entries of one key in flight at once
-- ARGV[3..] per entry, seven values: its key's pair, the key's digest, the origin id, the
--          key's text, where it was read (1 the stream, 2 the lane), its id there, and its
--          delayed-set member (what comes back when its turn comes: see lib/member.lua)
--
-- Reply: per entry 1 (run now), 0 (queued and acknowledged) or -1 (no longer pending: someone
-- else settled it; nothing written). When the group is gone the entry is queued anyway (it may
-- be the only copy left) and there is nothing to acknowledge.
--
-- Crash: Redis keeps all of the script's writes or none; before it the entries are pending
-- (read again, or claimed once idle, and taken again), after it they wait in Redis.
-- @include lib/pending
-- @include lib/order
local group, max = ARGV[1], tonumber(ARGV[2])
local now = order_now()
local out = {}
for i = 3, #ARGV, 7 do
  local pair = tonumber(ARGV[i])
  local k = {run = KEYS[5 + 2 * pair], wait = KEYS[6 + 2 * pair], names = KEYS[1],
    waiting = KEYS[2], turns = KEYS[6]}
  local kd, origin, text = ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local source = KEYS[2 + tonumber(ARGV[i + 4])]
  local id, member = ARGV[i + 5], ARGV[i + 6]
  local state, stop = pending_state(source, group, id)
  if not state then
    if stop == false then
      out[#out + 1] = -1
    else
      return stop
    end
  elseif redis.call('HEXISTS', KEYS[6], origin) == 1
      or order_take(k, kd, origin, max, now) then
    out[#out + 1] = 1
  else
    order_queue(k, kd, text, member, now)
    if state == 'pending' then
      redis.call('XACK', source, group, id)
    end
    out[#out + 1] = 0
  end
end
return out
