-- A subscription's pause record, at most ARGV[2] bytes of it (another writer to this Redis
-- may have left anything in the field): KEYS[1] the flow hash, ARGV[1] the field.
local record = redis.call('HGET', KEYS[1], ARGV[1])
if not record then
  return false
end
return string.sub(record, 1, tonumber(ARGV[2]))
