-- Shared by the scripts that settle one pending entry (delayed/lua/park.lua,
-- settle/lua/dead_letter.lua), which are loaded with this text in front of them: one record of
-- the entry's history (see history.rs).
--
-- key         the entry's history list (in the stream's hash slot)
-- head        the record as JSON without its closing brace, or '' for none (the entry's
--             origin is no stream id); this appends what only the script knows (`tail`: the
--             server's time, a due time, a dead letter's id) and the brace, with no JSON
--             decoding: a park pays two commands for its record
-- keep_until  epoch ms (server clock) the list lives at least until; never shortened
--
-- Best effort on purpose: a key of another type (another program's) is skipped and the
-- settle goes on. The newest 32 records are kept.
local function remember(key, head, tail, keep_until)
  if head == '' then
    return
  end
  local pushed = redis.pcall('RPUSH', key, head .. tail .. '}')
  if type(pushed) ~= 'number' then
    return
  end
  if pushed > 32 then
    redis.pcall('LTRIM', key, -32, -1)
  end
  if pushed == 1 then
    redis.pcall('PEXPIREAT', key, keep_until)
  else
    redis.pcall('PEXPIREAT', key, keep_until, 'GT')
  end
end
