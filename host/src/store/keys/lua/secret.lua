-- A stream's secret, made by whichever host comes first, and which entries of a subscription's
-- keys were there before this release first used them (only those may carry the earlier
-- release's unsealed bookkeeping).
--
-- KEYS[1]  the stream's secret (a string)
-- KEYS[2]  the stream's legacy record (a hash: key name -> the last id it had when this release
--          first used it, or 0-0 when it did not exist)
-- KEYS[3..] the subscription's streams to record: its stream, retry lane, dead-letter streams
-- ARGV[1]  a new random secret, kept only if there is none
-- ARGV[2]  1 to make the secret when there is none, 0 to only read it (then nothing is recorded
--          when there is no secret)
--
-- Redis gives a stream's new entries ids above every id it ever had (XADD with an explicit id
-- lower than its last one is refused), so "at most the recorded id" means "written before",
-- whoever writes the stream afterwards. Ids are kept as Redis writes them (text, exact above
-- 2^53); a key that holds no stream records 0-0.
--
-- Reply: {secret or false, recorded id of KEYS[3], of KEYS[4], ...} ('0-0' for a key not
-- recorded). An error reply when the secret or the legacy record holds another type.
--
-- Crash: Redis keeps all of the script's writes or none. A host that dies before the call
-- leaves the secret to whichever host calls next; after it, the secret and the cutoffs are
-- there for good: the secret is never replaced (SET NX) and a key's cutoff is never written
-- again, so every host reads the same.
if ARGV[2] == '1' then
  redis.call('SET', KEYS[1], ARGV[1], 'NX')
end
local secret = redis.call('GET', KEYS[1])
local reply = {secret}
for i = 3, #KEYS do
  local key = KEYS[i]
  if secret and redis.call('HEXISTS', KEYS[2], key) == 0 then
    local last = '0-0'
    local info = redis.pcall('XINFO', 'STREAM', key)
    if type(info) == 'table' and not info.err then
      for j = 1, #info, 2 do
        if info[j] == 'last-generated-id' then
          last = info[j + 1]
        end
      end
    end
    redis.call('HSET', KEYS[2], key, last)
  end
  reply[#reply + 1] = redis.call('HGET', KEYS[2], key) or '0-0'
end
return reply
