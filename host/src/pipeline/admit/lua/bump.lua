-- Tell every host that a flow hash changed: a note in the change log, then the epoch every
-- host polls (which hosts of the earlier release read alone) raised, so a host that sees the
-- epoch move finds the note.
--
-- KEYS[1]  the change log (a capped stream, each entry naming one flow hash in field `k`)
-- KEYS[2]  the epoch (a counter); both keys share a hash slot
-- ARGV[1]  the flow hash that changed
-- ARGV[2]  the log's length (MAXLEN ~)
--
-- An epoch that is no number (or no string at all), or at its maximum (another writer's
-- doing), is set to `reset-<server time>` instead: any new value makes hosts look.
--
-- Reply: 1; an error reply when the log holds another type (then the epoch is not raised).
--
-- Crash: Redis keeps all of the script's writes or none. The flow hash was written before the
-- call: a host that dies before it (or a call that fails) leaves the change unannounced, and
-- every host reads each flow hash again within admit::FULL_REFRESH in any case. After it,
-- nothing is left to do.
redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', 'k', ARGV[1])
local raised = redis.pcall('INCR', KEYS[2])
if type(raised) ~= 'number' then
  -- Not a number, or at its maximum (another writer's doing): any new value makes hosts look.
  local t = redis.call('TIME')
  redis.call('SET', KEYS[2], 'reset-' .. t[1] .. t[2])
end
return 1
