-- Library: the turns of ordered keys (see `pipeline/order/mod.rs`).
--
-- A key is named by its digest `kd` (the SHA-1 of its bytes in hex, 40 characters). The
-- subscription's state, all in the stream's hash slot (`k` below holds the names):
--
-- - `turns`, a hash: origin id -> `<kd>:<ms>` for every entry that holds a turn (in flight,
--   parked, let in), `<kd>:dead:<ms>` for a dead letter that holds one (`hold`); ms is the
--   server time the turn was taken. An origin holds at most one turn.
-- - `load`, a hash: kd -> how many entries of the key hold a turn or wait for one. A key with
--   none has no field. Because it counts both, a new entry finds in one call whether it may
--   run (it is the only one) or must queue; and settling finds in the same call whether
--   anything waits behind it.
-- - `wait:<kd>` (`k.prefix .. ':wait:' .. kd`), a list of the delayed-set members of the key's
--   waiting entries, oldest first.
-- - `names` (kd -> the key's text) and `waiting` (a sorted set: kd -> the server time its list
--   last became non-empty), for the keys that have entries waiting: the operator's view.
--
-- Every script that writes them keeps `load[kd]` = (turns held on kd) + (entries in wait:kd).
-- Scripts batch: one HMGET/HSET/HDEL per call for `turns` and `load` whatever the number of
-- entries, so the hot path costs few Redis calls per entry (see docs/design/ordered-keys.md).
-- @include lib/member

-- The most arguments one batched call takes (Lua's unpack has a stack bound).
local ORDER_CHUNK = 500

local function order_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The types the scripts keep at their names.
local ORDER_TYPES = {turns = 'hash', load = 'hash', names = 'hash', waiting = 'zset', set = 'zset'}

-- An error reply when a name the scripts write holds another program's key of another type,
-- else nil. Every script asks before its first write: Redis keeps the writes a failing script
-- made, and a step left half-made could leave a count wrong or an entry in no list.
local function order_check(k, kds)
  local function bad(key, want)
    local t = redis.call('TYPE', key)['ok']
    if t ~= 'none' and t ~= want then
      return redis.error_reply('WRONGTYPE ordered keys: ' .. key .. ' is a ' .. t
        .. ', not the ' .. want .. ' the ordering keeps there (another program\'s key?)')
    end
  end
  for field, want in pairs(ORDER_TYPES) do
    if k[field] then
      local err = bad(k[field], want)
      if err then
        return err
      end
    end
  end
  for _, kd in ipairs(kds or {}) do
    local err = bad(k.prefix .. ':wait:' .. kd, 'list')
    if err then
      return err
    end
  end
  return nil
end

-- order_check on the digests at ARGV[from], ARGV[from + step], ... (one per entry).
local function order_check_argv(k, from, step)
  local kds = {}
  for i = from, #ARGV, step do
    kds[#kds + 1] = ARGV[i]
  end
  return order_check(k, kds)
end

-- The digest a `turns` value names.
local function turn_key(value)
  return string.sub(value, 1, 40)
end

-- `cmd key [arg] args...`, in chunks of `args`; the replies of every chunk, concatenated (for
-- HMGET).
local function order_batch(cmd, key, args, arg)
  local out = {}
  for from = 1, #args, ORDER_CHUNK do
    local to = math.min(from + ORDER_CHUNK - 1, #args)
    local reply
    if arg then
      reply = redis.call(cmd, key, arg, unpack(args, from, to))
    else
      reply = redis.call(cmd, key, unpack(args, from, to))
    end
    if type(reply) == 'table' then
      for _, v in ipairs(reply) do
        out[#out + 1] = v
      end
    end
  end
  return out
end

-- HSET `key` with the field/value pairs in `flat` (an even count), in chunks.
local function order_hset(key, flat)
  for from = 1, #flat, ORDER_CHUNK * 2 do
    local to = math.min(from + ORDER_CHUNK * 2 - 1, #flat)
    redis.call('HSET', key, unpack(flat, from, to))
  end
end

-- The load of each digest in `kds`, as numbers (0 for none).
local function order_loads(k, kds)
  local loads = {}
  if #kds == 0 then
    return loads
  end
  local values = order_batch('HMGET', k.load, kds)
  for i, kd in ipairs(kds) do
    loads[kd] = tonumber(values[i]) or 0
  end
  return loads
end

-- Write the loads of `kds` back (a load of 0 or less removes the field).
local function order_store_loads(k, kds, loads)
  local set, gone = {}, {}
  for _, kd in ipairs(kds) do
    local n = loads[kd]
    if n > 0 then
      set[#set + 1] = kd
      set[#set + 1] = n
    else
      gone[#gone + 1] = kd
    end
  end
  if #set > 0 then
    order_hset(k.load, set)
  end
  if #gone > 0 then
    order_batch('HDEL', k.load, gone)
  end
end

-- Queue `members` (of one key, in order) behind the key's turns; their loads are the caller's.
local function order_queue(k, kd, text, members, now)
  local wait = k.prefix .. ':wait:' .. kd
  local len = 0
  for from = 1, #members, ORDER_CHUNK do
    len = redis.call('RPUSH', wait, unpack(members, from, math.min(from + ORDER_CHUNK - 1, #members)))
  end
  if len == #members then
    redis.call('ZADD', k.waiting, now, kd)
    redis.call('HSET', k.names, kd, text)
  end
end

-- Whether an entry (holding no turn) of a key whose load is `load` before it may take a turn:
-- it is the only one, or the key has a free turn and nothing waits.
local function order_free(k, kd, load)
  if load == 0 then
    return true
  end
  return load < k.max and redis.call('LLEN', k.prefix .. ':wait:' .. kd) == 0
end

-- The names an order script works on: `prefix` that of the keys' own keys, the others the
-- subscription's (see above), `set` the delayed set, `max` the most in flight per key, `ttl`
-- the least time to live a set with an expiry keeps (ms, 0 for none).
local function order_state(prefix, names, waiting, turns, set, max, ttl)
  return {prefix = prefix, load = prefix .. ':load', names = names, waiting = waiting,
    turns = turns, set = set, max = max, ttl = ttl, now = order_now()}
end

-- Whether the entry `origin` of the key `kd` may run now: it holds a turn already (a retry, a
-- rescued or let-in entry, a requeued dead letter that held its key: no longer marked dead
-- while it runs), or it takes a free one (see order_free).
local function order_take(k, kd, origin)
  local held = redis.call('HGET', k.turns, origin)
  if held then
    if string.find(held, ':dead:', 1, true) then
      redis.call('HSET', k.turns, origin, turn_key(held) .. ':' .. k.now)
    end
    return true
  end
  local load = tonumber(redis.call('HGET', k.load, kd)) or 0
  if not order_free(k, kd, load) then
    return false
  end
  redis.call('HSET', k.load, kd, load + 1)
  redis.call('HSET', k.turns, origin, kd .. ':' .. k.now)
  return true
end

-- Let the waiting entries of the key `kd`, whose load is `load`, in while it has free turns:
-- each goes to the delayed set `k.set` due now (its sweep brings it back to the group) and
-- takes its turn. A set that expires keeps at least `k.ttl` ms to live. Forgets the key's
-- name once nothing waits. Returns how many went, and the key's load after.
local function order_let_in(k, kd, load)
  local wait = k.prefix .. ':wait:' .. kd
  local waiting = redis.call('LLEN', wait)
  local holders = load - waiting
  local went = 0
  while holders < k.max and waiting > 0 do
    -- Copied to the set before it leaves the list: a write refused midway leaves it in one.
    local member = redis.call('LINDEX', wait, 0)
    redis.call('ZADD', k.set, k.now, member)
    local _, _, _, origin = read_member(member)
    -- A member the hold script did not write (none other should be here) still goes: the
    -- sweep dead-letters what it cannot read.
    if redis.call('HSET', k.turns, origin or member, kd .. ':' .. k.now) == 0 then
      -- It held a turn already (counted twice): one fewer on the key.
      load = load - 1
    else
      holders = holders + 1
    end
    redis.call('LPOP', wait)
    waiting = waiting - 1
    went = went + 1
  end
  if went > 0 and waiting == 0 then
    redis.call('ZREM', k.waiting, kd)
    redis.call('HDEL', k.names, kd)
  end
  if went > 0 and k.ttl > 0 then
    local left = redis.call('PTTL', k.set)
    -- Only a set that expires: one without an expiry keeps none.
    if left >= 0 and left < k.ttl then
      redis.call('PEXPIRE', k.set, k.ttl)
    end
  end
  return went, load
end

-- Give back the turns the `origins` hold (found in `turns`: the entries themselves may be
-- gone; `known`, when given, is what the caller read first: `known.turns` what it found there
-- for each origin, `known.loads` the loads of their keys, already checked with order_check)
-- and let each key's next entries in. Returns how many entries went in (origins that held
-- none change nothing: another host settled them first).
local function order_give_back(k, origins, known)
  if #origins == 0 then
    return 0
  end
  local distinct, seen = {}, {}
  for _, origin in ipairs(origins) do
    if not seen[origin] then
      seen[origin] = true
      distinct[#distinct + 1] = origin
    end
  end
  local held = {}
  if known then
    for i, origin in ipairs(distinct) do
      held[i] = known.turns[origin]
    end
  else
    held = order_batch('HMGET', k.turns, distinct)
  end
  local gone, kds, released = {}, {}, {}
  for i, value in ipairs(distinct) do
    local turn = held[i]
    if turn then
      gone[#gone + 1] = value
      local kd = turn_key(turn)
      if not released[kd] then
        kds[#kds + 1] = kd
        released[kd] = 0
      end
      released[kd] = released[kd] + 1
    end
  end
  if #gone == 0 then
    return 0
  end
  if not known then
    local err = order_check(k, kds)
    if err then
      error(err)
    end
  end
  order_batch('HDEL', k.turns, gone)
  local loads = known and known.loads or order_loads(k, kds)
  local went = 0
  for _, kd in ipairs(kds) do
    local load = loads[kd] - released[kd]
    if load > 0 then
      -- Something holds or waits: the hot path of a key without waiters is one LLEN.
      local n
      n, load = order_let_in(k, kd, load)
      went = went + n
    end
    loads[kd] = load
  end
  order_store_loads(k, kds, loads)
  return went
end
