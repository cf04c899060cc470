-- Library: one record of an entry's history (see `entry/history.rs`).
--
-- hkey        the subscription's histories: a hash, one field per entry (its origin id), the
--             value its records joined by newlines (JSON escapes every newline in a string)
-- ikey        their index: a sorted set of origin ids by the time each history may go
-- note        '' for none (the history is off, or the entry's origin is no stream id), else
--             '<origin id> <most entries kept> <record>', the record as JSON without its
--             closing brace: this appends what only the script knows (`tail`: the server's
--             time, a due time, a dead letter's id) and the brace, with no JSON decoding
-- now         epoch ms, server clock
-- keep_until  epoch ms the entry's history lives at least until; never shortened
--
-- Bounds: the newest 32 records of an entry; at most the cap's entries per subscription (the
-- ones to go soonest leave first); a history past its time is removed, a few per call; both
-- keys expire with the last history. Best effort on purpose: a key of another type (another
-- program's) or a refused write (maxmemory) is skipped and the settle goes on.
local function remember(hkey, ikey, note, tail, now, keep_until)
  if note == '' then
    return
  end
  local origin, cap, head = string.match(note, '^(%S+) (%d+) (.*)$')
  cap = tonumber(cap)
  if not origin or not cap or cap < 1 then
    return
  end
  local record = head .. tail .. '}'
  local old = redis.pcall('HGET', hkey, origin)
  if type(old) == 'table' then
    return
  end
  local value = record
  if old then
    value = old .. '\n' .. record
    local _, newlines = string.gsub(value, '\n', '\n')
    for _ = 32, newlines do
      value = string.sub(value, string.find(value, '\n', 1, true) + 1)
    end
  end
  if type(redis.pcall('HSET', hkey, origin, value)) ~= 'number' then
    return
  end
  if type(redis.pcall('ZADD', ikey, 'GT', keep_until, origin)) ~= 'number' then
    return
  end
  -- A new member is added whatever GT says; an existing one keeps the later time.
  local gone = redis.pcall('ZRANGEBYSCORE', ikey, '-inf', now, 'LIMIT', 0, 8)
  if type(gone) == 'table' and not gone.err and #gone > 0 then
    redis.pcall('HDEL', hkey, unpack(gone))
    redis.pcall('ZREM', ikey, unpack(gone))
  end
  local over = redis.pcall('ZCARD', ikey)
  if type(over) == 'number' and over > cap then
    local popped = redis.pcall('ZPOPMIN', ikey, math.min(over - cap, 8))
    if type(popped) == 'table' and not popped.err then
      for i = 1, #popped, 2 do
        redis.pcall('HDEL', hkey, popped[i])
      end
    end
  end
  redis.pcall('PEXPIREAT', hkey, keep_until, 'GT')
  redis.pcall('PEXPIREAT', ikey, keep_until, 'GT')
  if redis.pcall('PTTL', hkey) == -1 then
    redis.pcall('PEXPIREAT', hkey, keep_until)
  end
  if redis.pcall('PTTL', ikey) == -1 then
    redis.pcall('PEXPIREAT', ikey, keep_until)
  end
end
