-- Decide a canary: KEYS[1] is the subscription's flow hash, KEYS[2] the candidate's bytes.
-- ARGV[1] the sealed verdict, ARGV[2] the id of the record it is for, ARGV[3] the verdict
-- field as the caller read it (empty: none), which it found not to verify.
-- Written only while the record ARGV[2] is the canary and the field holds no verdict for it
-- other than ARGV[3]; with it the candidate's bytes are deleted (nothing fetches them after a
-- verdict). 1 when written, 0 otherwise.
local record = redis.call('HGET', KEYS[1], 'canary')
if not record or not string.find(record, ARGV[2], 1, true) then
  return 0
end
-- A verdict for this record: one whose body names exactly its id (another writer's
-- malformed value names none, and is written over).
local function names(value, id)
  local ok, outer = pcall(cjson.decode, value)
  if not ok or type(outer) ~= 'table' or type(outer.body) ~= 'string' then
    return false
  end
  local ok2, body = pcall(cjson.decode, outer.body)
  return ok2 and type(body) == 'table' and body.id == id
end
local verdict = redis.call('HGET', KEYS[1], 'canary-verdict')
if verdict and verdict ~= ARGV[3] and names(verdict, ARGV[2]) then
  return 0
end
redis.call('HSET', KEYS[1], 'canary-verdict', ARGV[1])
redis.call('DEL', KEYS[2])
return 1
