-- Read a deduplicating subscription's new stream entries and settle each one against the
-- group's dedupe record in the same atomic step: XREADGROUP (never blocking) delivers them in
-- id order; an entry whose key's first entry was read within the window (another entry id) is
-- a duplicate, acknowledged here and never sent to the host's handler; the others run, and an
-- entry with a key nobody holds becomes its key's first entry. Because delivery and the record
-- are one step, two hosts reading two entries of one key cannot both take it.
--
-- KEYS[1]  the record: a hash, key digest -> the first entry's id
-- KEYS[2]  its index: a sorted set, key digest -> when it is forgotten (epoch ms)
-- KEYS[3]  the stream, KEYS[4] the retry lane (for its last-delivered id only)
-- KEYS[5]  the counts: a hash (duplicates, forgotten_early), group-wide
-- KEYS[6]  the subscription's histories, KEYS[7] their index (see lib/history.lua)
-- ARGV[1]  the options: one MessagePack map (`read_options` in pipeline/dedupe/mod.rs): group,
--          consumer, count, field, pointer (see lib/entry_key.lua), max_key_bytes,
--          max_entry_bytes, field_overhead, window_ms, max_keys, history_cap (0: none),
--          history_keep_ms
--
-- An entry that names its origin (`sluice-origin-id`: a requeued dead letter) is the same
-- entry as that origin: a key's first entry requeued runs again. (A producer who forges the
-- field only lets its own duplicate run: the host trusts the origin for nothing else
-- without its seal.)
--
-- A key is named by the first 32 hex digits of its SHA-1 (128 bits: the record never holds a
-- key's bytes, whatever their length). An entry without a key, or with one over
-- max_key_bytes, runs, counted. An entry over max_entry_bytes comes back without its fields
-- (the host dead-letters it) and takes no key.
--
-- Reply: {last delivered ids or {}, missing, too_long, {duplicate id, its first id, ...},
-- forgotten early, entries...}; each entry {id, {name, value, ...}, '', bytes over, field count}.
--
-- Bounds: per call at most count entries; the forgotten keys a call removes are at most
-- 2 * count + 16 (past their time) plus what max_keys forces out (at most the keys it added);
-- both keys expire with the last key's window.
--
-- Crash: Redis keeps all of the script's writes or none. After it, every entry read either
-- runs (pending: read again by its consumer, or claimed) or was acknowledged as a duplicate
-- with its record; a key is taken only with its entry delivered.
-- @include lib/entry_key
-- @include lib/history
local ok, o = pcall(cmsgpack.unpack, ARGV[1])
if not ok or type(o) ~= 'table' then
  return redis.error_reply('dedupe read: ARGV[1] is not the options map')
end
for i, want in ipairs({'hash', 'zset', 'stream', 'stream', 'hash'}) do
  local t = redis.call('TYPE', KEYS[i])['ok']
  if t ~= 'none' and t ~= want then
    return redis.error_reply('WRONGTYPE dedupe: ' .. KEYS[i] .. ' is a ' .. t .. ', not the '
      .. want .. ' dedupe keeps there (another program\'s key?)')
  end
end
local read = redis.pcall('XREADGROUP', 'GROUP', o.group, o.consumer, 'COUNT', o.count,
  'STREAMS', KEYS[3], '>')
if type(read) == 'table' and read.err then
  return read
end

-- The group's last-delivered id on `key` ('' when it has none).
local function delivered(key)
  local groups = redis.pcall('XINFO', 'GROUPS', key)
  if type(groups) ~= 'table' or groups.err then
    return ''
  end
  for _, flat in ipairs(groups) do
    local g = {}
    for i = 1, #flat, 2 do
      g[flat[i]] = flat[i + 1]
    end
    if g['name'] == o.group then
      return g['last-delivered-id']
    end
  end
  return ''
end

if not read then
  return {{delivered(KEYS[3]), delivered(KEYS[4])}, 0, 0, {}, 0}
end

-- `cmd key [arg] args...` in chunks of 500 args (Lua's unpack has a stack bound; 500 is even,
-- so pairs stay whole); the replies of every chunk, concatenated.
local function batch(cmd, key, args, arg)
  local all = {}
  for from = 1, #args, 500 do
    local chunk = {unpack(args, from, math.min(from + 499, #args))}
    local reply
    if arg then
      reply = redis.call(cmd, key, arg, unpack(chunk))
    else
      reply = redis.call(cmd, key, unpack(chunk))
    end
    if type(reply) == 'table' then
      for _, v in ipairs(reply) do
        all[#all + 1] = v
      end
    end
  end
  return all
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local tokens = entry_key_tokens(o.pointer)
local missing, too_long = 0, 0
local rows, kds, seen = {}, {}, {}
for _, entry in ipairs(read[1][2]) do
  local id, fields = entry[1], entry[2]
  local size = 0
  for i = 1, #fields, 2 do
    size = size + #fields[i] + #fields[i + 1] + o.field_overhead
  end
  if size > o.max_entry_bytes then
    rows[#rows + 1] = {id, {}, '', size, #fields / 2}
  else
    local key, why = entry_key(fields, o.field, tokens, o.max_key_bytes)
    -- A requeued dead letter names its origin: the key's first entry is not its duplicate.
    local origin = id
    for i = 1, #fields, 2 do
      if fields[i] == 'sluice-origin-id' then
        origin = fields[i + 1]
        break
      end
    end
    local kd = ''
    if key then
      kd = string.sub(redis.sha1hex(key), 1, 32)
      if not seen[kd] then
        seen[kd] = true
        kds[#kds + 1] = kd
      end
    elseif why == 'missing' then
      missing = missing + 1
    else
      too_long = too_long + 1
    end
    rows[#rows + 1] = {id, fields, kd, 0, #fields / 2, origin}
  end
end

-- Each key's first entry, if its window has not passed.
local first = {}
if #kds > 0 then
  local ids = batch('HMGET', KEYS[1], kds)
  local untils = batch('ZMSCORE', KEYS[2], kds)
  for i, kd in ipairs(kds) do
    if ids[i] and untils[i] and tonumber(untils[i]) > now then
      first[kd] = ids[i]
    end
  end
end

local out = {{}, missing, too_long, {}, 0}
local taken, dups, acks = {}, {}, {}
local forget_at = now + o.window_ms
for _, row in ipairs(rows) do
  local kd = row[3]
  local holder = kd ~= '' and first[kd]
  if holder and holder ~= row[1] and holder ~= row[6] then
    acks[#acks + 1] = row[1]
    dups[#dups + 1] = row[1]
    dups[#dups + 1] = holder
  else
    if kd ~= '' and not holder then
      first[kd] = row[1]
      taken[#taken + 1] = kd
    end
    out[#out + 1] = {row[1], row[2], '', row[4], row[5]}
  end
end

if #taken > 0 then
  local fields, scores = {}, {}
  for _, kd in ipairs(taken) do
    fields[#fields + 1] = kd
    fields[#fields + 1] = first[kd]
    scores[#scores + 1] = forget_at
    scores[#scores + 1] = kd
  end
  batch('HSET', KEYS[1], fields)
  batch('ZADD', KEYS[2], scores)
  redis.call('PEXPIREAT', KEYS[1], forget_at)
  redis.call('PEXPIREAT', KEYS[2], forget_at)
end
if #acks > 0 then
  batch('XACK', KEYS[3], acks, o.group)
  redis.call('HINCRBY', KEYS[5], 'duplicates', #acks)
  redis.call('PEXPIREAT', KEYS[5], now + o.history_keep_ms)
end

-- Keys past their window go, a few per call; past max_keys the oldest go early.
local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 2 * #rows + 16)
if #gone > 0 then
  batch('HDEL', KEYS[1], gone)
  batch('ZREM', KEYS[2], gone)
end
local over = redis.call('ZCARD', KEYS[2]) - o.max_keys
if over > 0 then
  local popped = redis.call('ZPOPMIN', KEYS[2], math.min(over, #taken + 16))
  local kds_out = {}
  for i = 1, #popped, 2 do
    kds_out[#kds_out + 1] = popped[i]
  end
  if #kds_out > 0 then
    batch('HDEL', KEYS[1], kds_out)
    redis.call('HINCRBY', KEYS[5], 'forgotten_early', #kds_out)
    redis.call('PEXPIREAT', KEYS[5], now + o.history_keep_ms)
  end
  out[5] = #kds_out
end

-- Each duplicate's history names its first entry.
if o.history_cap > 0 then
  local by = cjson.encode(o.consumer)
  for i = 1, #dups, 2 do
    local id, of = dups[i], dups[i + 1]
    local note = string.format('%s %d {"do":"duplicate","n":1,"by":%s,"why":"duplicate of %s","id":"%s","of":"%s"',
      id, o.history_cap, by, of, id, of)
    remember(KEYS[6], KEYS[7], note, string.format(',"at":%.0f', now), now, now + o.history_keep_ms)
  end
end
out[4] = dups
return out
