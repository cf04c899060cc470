-- Start a canary: record it in the subscription's flow hash and start its counts, unless
-- another canary runs.
--
-- KEYS[1]  the subscription's flow hash (`canary`: the record, `canary-verdict`: its verdict)
-- KEYS[2]  the canary's counts (a hash; `id` names the canary they count)
-- ARGV[1]  the sealed record
-- ARGV[2]  its id
-- ARGV[3]  how long after a canary's end without a verdict it counts as abandoned (ms)
-- ARGV[4]  the record the caller found there and could not verify (empty: none): another
--          writer's, which holds nothing back
--
-- A running canary is kept when its record is Sluice's (JSON whose `body` is JSON with an
-- `id`), no verdict names its id, and its end plus ARGV[3] has not passed. Otherwise the new
-- record replaces it, the verdict field goes, and the counts start again under the new id (a
-- counts key of another type is replaced too).
--
-- Reply: {0, the running record's first 4096 bytes} when a canary is kept, {1, ''} when the
-- new one was written. An error reply when the flow hash holds another type.
--
-- Crash: Redis keeps all of the script's writes or none. The candidate's bytes are stored
-- before the call, with an expiry: a caller that dies before it leaves them to expire, and no
-- canary. One that dies after it, before its journal entry and bump, leaves a running canary
-- that the hosts find when they read the flow hash again (within admit::FULL_REFRESH).
local running = redis.call('HGET', KEYS[1], 'canary')
if running and ARGV[4] ~= '' and running == ARGV[4] then
  running = nil
end
if running then
  local ok, outer = pcall(cjson.decode, running)
  local body = nil
  if ok and type(outer) == 'table' and type(outer.body) == 'string' then
    local ok2, decoded = pcall(cjson.decode, outer.body)
    if ok2 and type(decoded) == 'table' then
      body = decoded
    end
  end
  if body and type(body.id) == 'string' then
    local verdict = redis.call('HGET', KEYS[1], 'canary-verdict')
    local decided = false
    if verdict then
      -- Any verdict naming it (its seal is the hosts' to check): only a holder of the rollout
      -- key starts a canary, so a forged one lets nobody else replace it.
      decided = string.find(verdict, body.id, 1, true) ~= nil
    end
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    local ends = tonumber(body.ends_ms) or 0
    if not decided and now < ends + tonumber(ARGV[3]) then
      return {0, string.sub(running, 1, 4096)}
    end
  end
end
redis.call('HSET', KEYS[1], 'canary', ARGV[1])
redis.call('HDEL', KEYS[1], 'canary-verdict')
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[2], 'id', ARGV[2])
return {1, ''}
