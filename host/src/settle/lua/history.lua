-- Shared by the scripts that settle one pending entry (delayed/lua/park.lua,
-- settle/lua/dead_letter.lua), which are loaded with this text in front of them: one record of
-- the entry's history (see history.rs).
--
-- key         the entry's history list (in the stream's hash slot)
-- record      the record as JSON, or '' for none (the entry's origin is no stream id)
-- extra       what only the script knows: the server's time, a due time, a dead letter's id
-- keep_until  epoch ms (server clock) the list lives at least until; never shortened
--
-- Best effort on purpose: a key of another type (another program's), a record that is not
-- JSON, are skipped and the settle goes on. The newest 32 records are kept.
local function remember(key, record, extra, keep_until)
  if record == '' then
    return
  end
  local ok, r = pcall(cjson.decode, record)
  if not ok or type(r) ~= 'table' then
    return
  end
  for k, v in pairs(extra) do
    r[k] = v
  end
  local pushed = redis.pcall('RPUSH', key, cjson.encode(r))
  if type(pushed) ~= 'number' then
    return
  end
  redis.pcall('LTRIM', key, -32, -1)
  local expires = redis.pcall('PEXPIRETIME', key)
  if type(expires) == 'number' and expires < keep_until then
    redis.pcall('PEXPIREAT', key, keep_until)
  end
end
