-- A host adds what its canary attempts came to and judges the canary for the whole group.
--
-- KEYS[1]  the subscription's flow hash (`canary`: the record, `canary-verdict`: the verdict)
-- KEYS[2]  the canary's counts (a hash: `id`, and for the incumbent `i:` and the candidate `c:`
--          attempts, failures, dead_letters, retries, and `h:<bucket>` handler-time buckets)
-- ARGV[1]  the canary's id
-- ARGV[2]  when its window ends (epoch ms)
-- ARGV[3..5] the allowed increases of the failure, dead-letter and retry rates
-- ARGV[6]  p99 ratio
-- ARGV[7]  p99 slack (us)
-- ARGV[8]  the fewest attempts to judge
-- ARGV[9]  z during the window (judged at every report: a stricter bound)
-- ARGV[10] z at the window's end
-- ARGV[11] how long the counts are kept (ms)
-- ARGV[12] a verdict field the caller found not to verify (empty: none), read as no verdict
-- ARGV[13..] for the incumbent then the candidate: attempts, failures, dead letters, retries,
--          the number of time buckets, then (bucket, count) pairs
--
-- Counts for another canary id are dropped first. A count another writer left that is no
-- integer starts again from what is added; one that reads as no number counts as 0; a count
-- above the attempts counts as the attempts; a bucket outside 0..119 is left out.
--
-- Reply: {'gone'} (no such canary), {'verdict', field} (a verdict is there: the caller checks
-- its seal; nothing is counted), {'running'}, or {'judged', outcome, why, now} when the counts
-- decide it: the script holds no key, so the caller seals the verdict and writes it
-- (canary_verdict.lua). An error reply when a key holds another type.
--
-- Crash: Redis keeps all of the script's writes or none. A host that dies before the call
-- loses the attempts it had not reported (the canary is judged on the rest). One that dies
-- after a 'judged' reply, before writing the verdict, leaves no verdict: the next report (any
-- host's) judges again from the same counts.
local id = ARGV[1]
local record = redis.call('HGET', KEYS[1], 'canary')
if not record or not string.find(record, id, 1, true) then
  return {'gone'}
end
local verdict = redis.call('HGET', KEYS[1], 'canary-verdict')
if verdict and string.find(verdict, id, 1, true) and verdict ~= ARGV[12] then
  return {'verdict', verdict}
end
if redis.call('HGET', KEYS[2], 'id') ~= id then
  redis.call('DEL', KEYS[2])
  redis.call('HSET', KEYS[2], 'id', id)
end

local BUCKETS = 120
local names = {'attempts', 'failures', 'dead_letters', 'retries'}
-- Add n to a count; a field another writer left that is not an integer starts again from n
-- (HINCRBY would fail on it, and every report with it: the canary never judged).
local function add(field, n)
  if type(redis.pcall('HINCRBY', KEYS[2], field, n)) == 'table' then
    redis.call('HSET', KEYS[2], field, n)
  end
end
local i = 13
for _, role in ipairs({'i', 'c'}) do
  for _, name in ipairs(names) do
    local n = tonumber(ARGV[i]) or 0
    i = i + 1
    if n > 0 then
      add(role .. ':' .. name, n)
    end
  end
  local buckets = tonumber(ARGV[i]) or 0
  i = i + 1
  for _ = 1, buckets do
    local b = tonumber(ARGV[i])
    local n = tonumber(ARGV[i + 1]) or 0
    i = i + 2
    if b and b >= 0 and b < BUCKETS and n > 0 then
      add(role .. ':h:' .. b, n)
    end
  end
end
redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[11]))

-- What another writer may have left in the counts reads as nothing.
local function num(x)
  local n = tonumber(x)
  if not n or n ~= n or n < 0 or n == math.huge then
    return 0
  end
  return n
end
local function totals(role)
  local fields = {}
  for _, name in ipairs(names) do
    fields[#fields + 1] = role .. ':' .. name
  end
  for b = 0, BUCKETS - 1 do
    fields[#fields + 1] = role .. ':h:' .. b
  end
  local v = redis.call('HMGET', KEYS[2], unpack(fields))
  -- A count above the attempts (another writer's) is as many as the attempts: no rate above 1.
  local n = num(v[1])
  local t = {n = n, failure = math.min(num(v[2]), n), ['dead-letter'] = math.min(num(v[3]), n),
    retry = math.min(num(v[4]), n), h = {}}
  local timed = 0
  for b = 0, BUCKETS - 1 do
    t.h[b] = num(v[5 + b])
    timed = timed + t.h[b]
  end
  t.timed = timed
  return t
end
-- The upper edge of the bucket that holds the 99th percentile (us); 0 without times.
local function p99(t)
  if t.timed == 0 then
    return 0
  end
  local want = math.ceil(t.timed * 0.99)
  local seen = 0
  for b = 0, BUCKETS - 1 do
    seen = seen + t.h[b]
    if seen >= want then
      return 2 ^ ((b + 1) / 4)
    end
  end
  return 2 ^ (BUCKETS / 4)
end
-- The Wilson score interval of k in n at z: its lower and upper bound.
local function wilson(k, n, z)
  if n == 0 then
    return 0, 1
  end
  local p = k / n
  local z2 = z * z
  local centre = p + z2 / (2 * n)
  local spread = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
  return (centre - spread) / (1 + z2 / n), (centre + spread) / (1 + z2 / n)
end
local function pct(k, n)
  if n == 0 then
    return 0
  end
  return 100 * k / n
end

local inc = totals('i')
local can = totals('c')
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ends = tonumber(ARGV[2])
local z_window, z_end = tonumber(ARGV[9]), tonumber(ARGV[10])
local min = tonumber(ARGV[8])
local checks = {{'failure', tonumber(ARGV[3])}, {'dead-letter', tonumber(ARGV[4])}, {'retry', tonumber(ARGV[5])}}

local function worse(name, k, margin)
  return string.format(
    "the candidate's %s rate is %.1f%% (%d of %d attempts), the incumbent's %.1f%% (%d of %d); at most %.1f points more is allowed",
    name, pct(k, can.n), can[name], can.n, pct(inc[name], inc.n), inc[name], inc.n, margin * 100)
end

-- Whether the candidate's rate of `name` is shown, at z, to be above the incumbent's plus
-- `margin`: the lowest rate the candidate's counts allow above the highest the incumbent's do.
-- Both versions' rates are samples; a candidate as good as the incumbent must not lose by
-- chance (at 5 % failures on 100 attempts, 7 happen one time in four).
local function shown_worse(name, margin, z)
  local low = wilson(can[name], can.n, z)
  local _, high = wilson(inc[name], inc.n, z)
  return low > high + margin
end

local outcome, why = nil, nil
-- During the window the counts are judged at every report (twice a second per host): each
-- look is a chance to be wrong, so the bound is stricter than at the end.
for _, check in ipairs(checks) do
  local name, margin = check[1], check[2]
  if shown_worse(name, margin, z_window) then
    outcome, why = 'rolled-back', worse(name, can[name], margin)
    break
  end
end
if not outcome and can.timed >= min and inc.timed >= min then
  local pc, pi = p99(can), p99(inc)
  local ratio, slack = tonumber(ARGV[6]), tonumber(ARGV[7])
  if pc > pi * ratio and pc > pi + slack then
    outcome = 'rolled-back'
    why = string.format(
      "the candidate's handler time p99 is about %.1f ms, the incumbent's about %.1f ms; at most %.2f times (and %.1f ms more) is allowed",
      pc / 1000, pi / 1000, ratio, slack / 1000)
  end
end
if not outcome and now >= ends then
  if can.n < min then
    outcome = 'rolled-back'
    why = string.format(
      'the window ended with %d attempts on the candidate, fewer than the %d needed to judge it (give it a longer window or a larger share; on a few test entries, as in sluice dev, lower it: canary = { min_deliveries = 5 } in sluice.toml)',
      can.n, min)
  else
    for _, check in ipairs(checks) do
      local name, margin = check[1], check[2]
      if shown_worse(name, margin, z_end) then
        outcome, why = 'rolled-back', worse(name, can[name], margin)
        break
      end
    end
    if not outcome then
      outcome = 'promoted'
      why = string.format(
        'the window passed within every threshold: %d attempts on the candidate (failures %.1f%%, dead letters %.1f%%, retries %.1f%%), %d on the incumbent (%.1f%%, %.1f%%, %.1f%%)',
        can.n, pct(can.failure, can.n), pct(can['dead-letter'], can.n), pct(can.retry, can.n),
        inc.n, pct(inc.failure, inc.n), pct(inc['dead-letter'], inc.n), pct(inc.retry, inc.n))
    end
  end
end
if outcome then
  return {'judged', outcome, why, tostring(now)}
end
return {'running'}
