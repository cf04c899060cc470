-- Schedule an entry for later: it waits in the subscription's delayed set as a member the
-- sweep moves to the group at its due time, like a parked retry, but with retry count 0 (it
-- comes as a first attempt) and an id of its own that is also its origin.
--
-- KEYS[1]  the subscription's delayed set
-- ARGV[1]  the options: one MessagePack map (`schedule` in control/operate/schedule.rs):
--          stream, group (the subscription: the member names its owner), seq (a random
--          decimal of 19 or 20 digits), at_ms (epoch ms, 0 for none) or in_ms (from now),
--          max_ahead_ms, max_past_ms, ttl_ms (the set's, 0 for none)
-- ARGV[2..] the entry's fields, name, value, ...
--
-- Times are the Redis server's (TIME): `in_ms` counts from its now, and `at_ms` is compared
-- with it, so no host's or producer's clock moves a due time. A time in the past is due now,
-- unless it is more than max_past_ms ago (an error: a clock or a unit mistake); one more than
-- max_ahead_ms ahead is an error.
--
-- The id is `<now ms>-<seq>`: shaped like a stream id (so the entry has a history and a
-- journal like any), with a sequence number no stream reaches (at least 10^18), unique by its
-- random part; ZADD NX never replaces a member.
--
-- Reply: {id, due ms, now ms}; an error naming the problem (a set of another type, a time out
-- of bounds, an unreadable options map).
--
-- With a ttl the set expires ttl after its latest due time, as the park script keeps it.
local ok, o = pcall(cmsgpack.unpack, ARGV[1])
if not ok or type(o) ~= 'table' then
  return redis.error_reply('schedule: ARGV[1] is not the options map')
end
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'none' and t ~= 'zset' then
  return redis.error_reply('WRONGTYPE schedule: ' .. KEYS[1] .. ' is a ' .. t
    .. ', not the delayed-retry set (a sorted set)')
end
if not string.match(o.seq, '^%d+$') or #o.seq < 19 or #o.seq > 20 then
  return redis.error_reply('schedule: the sequence number is not 19 or 20 digits')
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local due
if o.at_ms > 0 then
  if o.at_ms < now - o.max_past_ms then
    return redis.error_reply(string.format(
      'schedule: the time is %.0f ms in the past by the Redis server\'s clock (more than %.0f ms: a clock or unit mistake?)',
      now - o.at_ms, o.max_past_ms))
  end
  due = math.max(o.at_ms, now)
else
  due = now + o.in_ms
end
if due > now + o.max_ahead_ms then
  return redis.error_reply(string.format(
    'schedule: the time is %.0f s ahead, more than the %.0f s an entry may wait',
    (due - now) / 1000, o.max_ahead_ms / 1000))
end
local fields = {}
for i = 2, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
local id = string.format('%.0f', now) .. '-' .. o.seq
local member = cmsgpack.pack({o.stream, o.group, id, 0, fields, id})
redis.call('ZADD', KEYS[1], 'NX', due, member)
if o.ttl_ms > 0 then
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  local latest = math.max(tonumber(last[2]), now)
  redis.call('PEXPIREAT', KEYS[1], latest + o.ttl_ms)
end
return {id, due, now}
