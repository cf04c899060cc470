-- Read an ordered subscription's new stream entries and settle each one's place in its key's
-- order in the same atomic step: XREADGROUP (never blocking) delivers them in id order, and each
-- takes its key's turn (it runs), or is queued behind the turn and acknowledged, or has no key
-- and runs unordered. Because delivery and order are one step, entries of one key that
-- different hosts read are ordered by their ids whatever host gets them (see lib/order.lua).
--
-- KEYS[1]  the subscription's key names, KEYS[2] its waiting keys
-- KEYS[3]  the stream, KEYS[4] the retry lane
-- KEYS[5]  the delayed set (unused here), KEYS[6] the subscription's turns
-- ARGV[1]  the options: one MessagePack map (`read_options` in pipeline/order/mod.rs writes it):
--          group, consumer, count, max_in_flight (per key), prefix (of the keys' own keys),
--          field (the entry field that holds the key, or the payload), pointer (a JSON
--          pointer into that field's JSON, '' when the field is the key), max_key_bytes,
--          max_entry_bytes, field_overhead (what each field counts besides its bytes)
--
-- The key: the field's value, or the value at the pointer in its JSON: a string as its text,
-- an integer (below 2^53) as its decimal digits, a boolean as `true`/`false`; anything else
-- (missing, null, a fraction, an object, an array, no JSON) is no key. A key longer than
-- max_key_bytes is none either. An entry without a key runs unordered.
--
-- An entry over max_entry_bytes (its names, values and each field's overhead) is neither
-- ordered nor sent whole: it comes back without its fields, with its size, and the host
-- dead-letters it from Redis (it stays pending until then).
--
-- Reply: {last delivered ids or {}, missing, too_long, queued, entries...}: the ids (the
-- group's on the stream and on the lane, only when nothing was read: where a blocking wait
-- starts), how many had no key, a key too long, or were queued; then each entry that runs:
-- {id, {name, value, ...}, key digest ('' for none), bytes over (0, or the entry's size when
-- over max_entry_bytes), its field count}.
--
-- Cost: per entry its key (the payload's JSON decoded for a pointer) and the key's SHA-1; per
-- call one HMGET and one HSET of the keys' loads, one HSET of the turns taken, and for entries
-- that queue one RPUSH per key and one XACK (lib/order.lua).
--
-- Crash: Redis keeps all of the script's writes or none. After it, every entry it read either
-- holds its turn (pending: read again by its consumer, or claimed), waits in its key's list
-- (acknowledged), or runs unordered (pending).
-- @include lib/order
-- @include lib/entry_key
local ok, o = pcall(cmsgpack.unpack, ARGV[1])
if not ok or type(o) ~= 'table' then
  return redis.error_reply('order read: ARGV[1] is not the options map')
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
  return {{delivered(KEYS[3]), delivered(KEYS[4])}, 0, 0, 0}
end

local tokens = entry_key_tokens(o.pointer)

local k = order_state(o.prefix, KEYS[1], KEYS[2], KEYS[6], KEYS[5], o.max_in_flight, 0)
local missing, too_long = 0, 0
-- First the entries' keys (rows, in id order), then every key's load in one call.
local rows, kds, texts = {}, {}, {}
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
    if not key then
      if why == 'missing' then
        missing = missing + 1
      else
        too_long = too_long + 1
      end
      rows[#rows + 1] = {id, fields, '', 0, #fields / 2}
    else
      local kd = redis.sha1hex(key)
      if not texts[kd] then
        texts[kd] = key
        kds[#kds + 1] = kd
      end
      rows[#rows + 1] = {id, fields, kd, 0, #fields / 2}
    end
  end
end
local loads = order_loads(k, kds)
-- An entry the group delivers again (its group was set back, or made again while the turns
-- stayed) may hold its turn already: it runs, and counts once.
local ids = {}
for _, row in ipairs(rows) do
  if row[3] ~= '' then
    ids[#ids + 1] = row[1]
  end
end
local holding = {}
if #ids > 0 then
  for i, turn in ipairs(order_batch('HMGET', k.turns, ids)) do
    if turn then
      holding[ids[i]] = true
    end
  end
end
-- Each keyed entry runs (it takes a turn) or queues, in id order; a key that queued one in
-- this read queues the rest.
local out, taken, queued, acks, queues = {{}, 0, 0, 0}, {}, {}, {}, {}
local stamp = ':' .. k.now
for _, row in ipairs(rows) do
  local kd = row[3]
  if kd == '' or holding[row[1]] then
    out[#out + 1] = row
  else
    local load = loads[kd]
    loads[kd] = load + 1
    if not queued[kd] and order_free(k, kd, load) then
      taken[#taken + 1] = row[1]
      taken[#taken + 1] = kd .. stamp
      out[#out + 1] = row
    else
      if not queued[kd] then
        queued[kd] = {}
        queues[#queues + 1] = kd
      end
      local id = row[1]
      table.insert(queued[kd], cmsgpack.pack({KEYS[3], o.group, id, 0, row[2], id}))
      acks[#acks + 1] = id
    end
  end
end
-- Nothing is written before every name written is known to be of its type.
local err = order_check(k, queues)
if err then
  return err
end
if #taken > 0 then
  order_hset(k.turns, taken)
end
for _, kd in ipairs(queues) do
  order_queue(k, kd, texts[kd], queued[kd], k.now)
end
if #acks > 0 then
  order_batch('XACK', KEYS[3], acks, o.group)
end
order_store_loads(k, kds, loads)
out[2], out[3], out[4] = missing, too_long, #acks
return out
