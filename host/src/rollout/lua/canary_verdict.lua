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
local verdict = redis.call('HGET', KEYS[1], 'canary-verdict')
if verdict and string.find(verdict, ARGV[2], 1, true) and verdict ~= ARGV[3] then
  return 0
end
redis.call('HSET', KEYS[1], 'canary-verdict', ARGV[1])
redis.call('DEL', KEYS[2])
return 1
