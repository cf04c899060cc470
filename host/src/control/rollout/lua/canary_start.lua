-- Start a canary: KEYS[1] is the subscription's flow hash, KEYS[2] its canary counts.
-- ARGV[1] the sealed record, ARGV[2] its id, ARGV[3] how long after a canary's end without a
-- verdict it counts as abandoned (ms), ARGV[4] the record the caller found there and could not
-- verify (empty: none): another writer's, which holds nothing back.
-- A canary whose record is Sluice's, has no verdict and has not been abandoned is kept: the
-- answer is {0, record}. Otherwise the new record replaces it: {1, ''}.
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
