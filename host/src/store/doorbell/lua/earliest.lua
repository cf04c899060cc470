-- The earliest score of each sorted set ('' for an empty or missing set): a delayed set's
-- next due time, which the polling doorbell rings for when it changes.
local out = {}
for i, key in ipairs(KEYS) do
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  out[i] = first[2] or ''
end
return out
