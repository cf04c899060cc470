-- Fire one tick of a cron schedule, once for every host of the group: the tick is claimed in
-- the schedule's record (its last tick fired) and its entry added to the subscription's
-- delayed set, due at the tick, in one atomic step. A tick at or before the last one fired is
-- refused, so however many hosts try a tick, one entry is written, and ticks go forward only.
--
-- KEYS[1]  the schedule's record: a string, the last tick fired (epoch ms)
-- KEYS[2]  the subscription's delayed set
-- ARGV[1]  the options: one MessagePack map (`fire` in control/schedules/mod.rs): tick_ms,
--          stream, group (the member's owner), id (the tick's entry id: the same on every
--          host), lead_ms (how far ahead of Redis's clock a tick may be fired), ttl_ms (the
--          set's, 0 for none), keep_ms (how long the record outlives its last tick)
-- ARGV[2..] the entry's fields, name, value, ...
--
-- The entry is a member like a scheduled entry's (control/operate/lua/schedule.lua): retry
-- count 0, the tick's id as its entry and origin id, due at max(tick, now): the sweep moves it
-- to the group at its time, exactly once.
--
-- Reply: {fired (1 or 0), Redis's now (epoch ms), the last tick fired before this call (0 for
-- none)}; fired is 0 when the tick was fired already, or is further ahead than lead_ms (a host
-- whose idea of Redis's time is off: it learns the time from this reply). An error when a key
-- holds another type.
local ok, o = pcall(cmsgpack.unpack, ARGV[1])
if not ok or type(o) ~= 'table' then
  return redis.error_reply('schedule fire: ARGV[1] is not the options map')
end
for i, want in ipairs({'string', 'zset'}) do
  local t = redis.call('TYPE', KEYS[i])['ok']
  if t ~= 'none' and t ~= want then
    return redis.error_reply('WRONGTYPE schedule fire: ' .. KEYS[i] .. ' is a ' .. t
      .. ', not the ' .. want .. ' a schedule keeps there')
  end
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local last = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if o.tick_ms <= last or o.tick_ms > now + o.lead_ms then
  return {0, now, last}
end
redis.call('SET', KEYS[1], string.format('%.0f', o.tick_ms), 'PX', o.keep_ms)
local fields = {}
for i = 2, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
local due = math.max(o.tick_ms, now)
redis.call('ZADD', KEYS[2], 'NX', due,
  cmsgpack.pack({o.stream, o.group, o.id, 0, fields, o.id}))
if o.ttl_ms > 0 then
  local top = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', KEYS[2], math.max(tonumber(top[2]), now) + o.ttl_ms)
end
return {1, now, last}
