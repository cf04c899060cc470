-- Library: the turns of ordered keys (see `pipeline/order/mod.rs`).
--
-- One key (by its digest `kd`) has two keys of its own: `run`, a hash of the origin ids that
-- hold one of its turns (value: the server time the turn was taken, ms, or `dead:<ms>` for a
-- dead letter that holds it), and `wait`, a list of the delayed-set members of its entries that
-- wait for a turn, oldest first. The subscription has `names` (a hash: digest -> the key's
-- text, while the key has entries waiting) and `waiting` (a sorted set: digest -> the server
-- time its list last became non-empty). `k` below is {run, wait, names, waiting}.
--
-- A key's state exists only while one of its entries is in flight, parked, dead-lettered with
-- `hold`, or waiting: an emptied hash or list is gone (Redis deletes it), and so is its name.
-- @include lib/member

local function order_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Whether an entry `origin` that holds no turn may run now: the key has a free turn and nothing
-- waits for it (then it takes it). The read's hot path: four calls.
local function order_take_new(k, kd, origin, max, now)
  if redis.call('LLEN', k.wait) == 0 and redis.call('HLEN', k.run) < max then
    redis.call('HSET', k.run, origin, now)
    redis.call('HSET', k.turns, origin, kd)
    return true
  end
  return false
end

-- Whether the entry `origin` may run now: it holds a turn already (a retry, a rescued or
-- released entry), or it takes a free one (see order_take_new).
local function order_take(k, kd, origin, max, now)
  if redis.call('HEXISTS', k.run, origin) == 1 then
    return true
  end
  return order_take_new(k, kd, origin, max, now)
end

-- Queue `member` behind the key's turns.
local function order_queue(k, kd, text, member, now)
  if redis.call('RPUSH', k.wait, member) == 1 then
    redis.call('ZADD', k.waiting, now, kd)
    redis.call('HSET', k.names, kd, text)
  end
end

-- Let the waiting entries of a key in while it has free turns: each goes to the delayed set
-- `set` due now (its sweep brings it back to the group) and takes its turn. A set that
-- expires keeps at least `ttl_ms` to live. Forgets the key's name once nothing waits. Returns
-- how many went.
local function order_let_in(k, kd, max, set, ttl_ms, now)
  local went = 0
  while redis.call('HLEN', k.run) < max do
    local member = redis.call('LPOP', k.wait)
    if not member then
      break
    end
    local _, _, _, origin = read_member(member)
    -- A member the hold script did not write (none other should be here) still goes: the
    -- sweep dead-letters what it cannot read.
    redis.call('HSET', k.run, origin or member, now)
    redis.call('HSET', k.turns, origin or member, kd)
    redis.call('ZADD', set, now, member)
    went = went + 1
  end
  if went > 0 and redis.call('LLEN', k.wait) == 0 then
    redis.call('ZREM', k.waiting, kd)
    redis.call('HDEL', k.names, kd)
  end
  if went > 0 and ttl_ms > 0 then
    local left = redis.call('PTTL', set)
    -- Only a set that expires: one without an expiry keeps none.
    if left >= 0 and left < ttl_ms then
      redis.call('PEXPIRE', set, ttl_ms)
    end
  end
  return went
end

-- Give back the turn `origin` holds on the key and let the next entries in. Returns how many
-- went (0 when `origin` held no turn: another host settled it first).
local function order_release(k, kd, origin, max, set, ttl_ms, now)
  if redis.call('HDEL', k.run, origin) == 0 then
    return 0
  end
  redis.call('HDEL', k.turns, origin)
  -- The hot path: nothing waits (one call).
  if redis.call('LLEN', k.wait) == 0 then
    return 0
  end
  return order_let_in(k, kd, max, set, ttl_ms, now)
end

-- Give back whatever turn `origin` holds, its key found from `turns` (the entry itself may be
-- gone). Returns how many entries went in (0 when it held none).
local function order_forget(k, origin, max, set, ttl_ms, now, prefix)
  local kd = redis.call('HGET', k.turns, origin)
  if not kd then
    return 0
  end
  k.run, k.wait = prefix .. ':run:' .. kd, prefix .. ':wait:' .. kd
  return order_release(k, kd, origin, max, set, ttl_ms, now)
end
