-- Queue entries that must wait for their key's turn (take.lua said so) and acknowledge them,
-- atomically per entry: an entry is pending or queued, never neither. An entry whose key has a
-- free turn by now (the holder settled since take.lua ran) takes it instead and runs.
--
-- KEYS[1]  the subscription's key names, KEYS[2] its waiting keys (see lib/order.lua)
-- KEYS[3]  the stream, KEYS[4] the retry lane (the stream again when there is none)
-- KEYS[5]  unused here (the delayed set)
-- KEYS[6]  the subscription's turns (hash: origin id -> key digest and time)
-- ARGV[1]  the consumer group
-- ARGV[2]  the most entries of one key in flight at once
-- ARGV[3]  the prefix of the keys' own keys (see lib/order.lua), in the stream's hash slot
-- ARGV[4..] per entry, six values: the key's digest, the origin id, the key's text, where it
--          was read (1 the stream, 2 the lane), its id there, and its delayed-set member
--          (what comes back when its turn comes: see lib/member.lua)
--
-- Reply: per entry 1 (run now), 0 (queued and acknowledged) or -1 (no longer pending: someone
-- else settled it; nothing written). When the group is gone the entry is queued anyway (it may
-- be the only copy left) and there is nothing to acknowledge.
--
-- Crash: Redis keeps all of the script's writes or none; before it the entries are pending
-- (read again, or claimed once idle, and taken again), after it they wait in Redis.
-- @include lib/pending
-- @include lib/order
local group = ARGV[1]
local k = order_state(ARGV[3], KEYS[1], KEYS[2], KEYS[6], KEYS[5], tonumber(ARGV[2]), 0)
local err = order_check_argv(k, 4, 6)
if err then
  return err
end
local out = {}
for i = 4, #ARGV, 6 do
  local kd, origin, text = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local source = KEYS[2 + tonumber(ARGV[i + 3])]
  local id, member = ARGV[i + 4], ARGV[i + 5]
  local state, stop = pending_state(source, group, id)
  if not state then
    if stop == false then
      out[#out + 1] = -1
    else
      return stop
    end
  elseif order_take(k, kd, origin) then
    out[#out + 1] = 1
  else
    order_queue(k, kd, text, {member}, k.now)
    redis.call('HINCRBY', k.load, kd, 1)
    if state == 'pending' then
      redis.call('XACK', source, group, id)
    end
    out[#out + 1] = 0
  end
end
return out
