-- End a running canary by an operator's word: KEYS[1] is the flow hash. ARGV[1] is the verdict
-- to record (JSON), ARGV[2] the id it must be for. Written only while the canary ARGV[2] runs
-- without a verdict: 1 when written, 0 otherwise.
local running = redis.call('HGET', KEYS[1], 'canary')
if not running or not string.find(running, ARGV[2], 1, true) then
  return 0
end
local verdict = redis.call('HGET', KEYS[1], 'canary-verdict')
if verdict and string.find(verdict, ARGV[2], 1, true) then
  return 0
end
redis.call('HSET', KEYS[1], 'canary-verdict', ARGV[1])
return 1
