-- Tell every host that the flow hash ARGV[1] changed: KEYS[1] the change log (a capped stream,
-- each entry naming one flow hash), KEYS[2] the epoch every host polls (which hosts of the
-- earlier release read alone). Both keys share a hash slot. ARGV[2] the log's length (~).
-- The epoch is raised after the log entry, so a host that sees it move finds the entry.
redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', 'k', ARGV[1])
local raised = redis.pcall('INCR', KEYS[2])
if type(raised) ~= 'number' then
  -- Not a number, or at its maximum (another writer's doing): any new value makes hosts look.
  local t = redis.call('TIME')
  redis.call('SET', KEYS[2], 'reset-' .. t[1] .. t[2])
end
return 1
