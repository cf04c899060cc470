-- Library: the dead-letter write both dead-letter scripts end with; each takes KEYS[1..4] and
-- ARGV[1..5] alike (see `pipeline/settle/lua/dead_letter.lua`).
--
-- XADD `fields` (name, value, ...) to the dead-letter stream, trimmed as ARGV[3] says; record
-- the history; acknowledge the entry last, unless its group is gone (`state` from
-- pending_state). Reply: {dead-letter id, 1 if acknowledged or 0 if the group was gone}.
-- @include lib/history
local function write_dead_letter(state, fields)
  local args = {KEYS[2]}
  if tonumber(ARGV[3]) > 0 then
    args = {KEYS[2], 'MAXLEN', '~', ARGV[3]}
  end
  args[#args + 1] = '*'
  for _, v in ipairs(fields) do
    args[#args + 1] = v
  end
  local id = redis.call('XADD', unpack(args))
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  remember(KEYS[3], KEYS[4], ARGV[4], string.format(',"at":%.0f,"dl":"%s"', now, id), now,
    now + tonumber(ARGV[5]))
  if state == 'group-gone' then
    return {id, 0}
  end
  redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
  return {id, 1}
end
