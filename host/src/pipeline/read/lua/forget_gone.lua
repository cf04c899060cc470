-- Delete a consumer of a group that is gone: only if it holds no pending entry and has been
-- idle for at least ARGV[3] ms, checked and done in one step, so an entry it read meanwhile is
-- never dropped with it (XGROUP DELCONSUMER drops a consumer's pending entries from the group).
--
-- KEYS[1]  the stream (or retry lane)
-- ARGV[1]  the group
-- ARGV[2]  the consumer
-- ARGV[3]  the least idle time, in ms
--
-- Reply: 1 if deleted, else 0 (it holds entries, was idle for less, is not there; or the
-- stream or group is missing, or the key holds another type).
--
-- Crash: Redis keeps all of the script's writes or none. A host that dies before the call
-- leaves the consumer in the group, for a later look to delete; after it, the consumer is gone
-- and a host of that name that comes back is made again by its next read.
local ok, consumers = pcall(redis.call, 'XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
if not ok then
  return 0
end
local least = tonumber(ARGV[3])
for _, fields in ipairs(consumers) do
  local name, pending, idle
  for i = 1, #fields, 2 do
    local key = fields[i]
    if key == 'name' then
      name = fields[i + 1]
    elseif key == 'pending' then
      pending = tonumber(fields[i + 1])
    elseif key == 'idle' then
      idle = tonumber(fields[i + 1])
    end
  end
  if name == ARGV[2] then
    if pending == 0 and idle ~= nil and idle >= least then
      redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
      return 1
    end
    return 0
  end
end
return 0
