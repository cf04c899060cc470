-- Decide a canary: write its sealed verdict, while the record it is for is the canary and no
-- other verdict for it is there; with it the candidate's bytes are deleted (nothing fetches
-- them after a verdict).
--
-- KEYS[1]  the subscription's flow hash (`canary`, `canary-verdict`)
-- KEYS[2]  the candidate's bytes
-- ARGV[1]  the sealed verdict
-- ARGV[2]  the id of the record it is for
-- ARGV[3]  the verdict field as the caller read it (empty: none), which it found not to verify
--
-- A verdict there is this record's when its `body` (JSON in JSON) names exactly its id; one
-- that does not (another writer's malformed value) is written over, as is ARGV[3].
--
-- Reply: 1 when written, 0 otherwise (the record is no longer the canary, or another verdict
-- for it came first). An error reply when the flow hash holds another type.
--
-- Crash: Redis keeps all of the script's writes or none. A caller that dies before the call
-- leaves the canary undecided: the next report judges it again. One that dies after it, before
-- its journal entry and bump, leaves the verdict for the hosts to find when they read the flow
-- hash again (within admit::FULL_REFRESH).
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
