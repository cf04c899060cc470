-- Ask an open or half-open circuit breaker for a probe delivery: the first host to ask once it
-- has been open long enough moves it to half-open with ARGV[1] permits; each call takes one.
--
-- KEYS[1]  the subscription's flow hash (`breaker`)
-- KEYS[2]  its flow journal (see lib/journal.lua)
-- ARGV[1]  probes a round has
-- ARGV[2]  how long it stays open, and how long a half-open round waits for its answers (ms)
-- ARGV[3]  who (this host)
--
-- A record that is not Sluice's (no JSON, or no open or half-open state) counts as open from
-- now, at every call, and is not written over: while it stays, the answer is to wait ARGV[2]
-- (never closed, never a probe, for any ARGV[2] above 0). A time more than two days ahead is
-- taken as now.
--
-- Reply: {'closed', 0, ''} (no breaker: read), {'wait', ms, record} (open, or every permit of
-- this half-open round taken: ask again after ms), {'probe', 0, record} (one permit taken; the
-- record's `moved` says whether this call moved it to half-open). An error reply when the flow
-- hash holds another type.
--
-- Crash: Redis keeps all of the script's writes or none. A host that dies holding a permit
-- (after the call, before its probe's answer) leaves the round short of one answer: once every
-- permit is taken and ARGV[2] has passed, the next call starts a new round. One that moved the
-- breaker to half-open and dies before its bump leaves the other hosts to see it when they
-- read the flow hash again.
-- @include lib/journal
local raw = redis.call('HGET', KEYS[1], 'breaker')
if not raw then
  return {'closed', 0, ''}
end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local probes = tonumber(ARGV[1])
local open_for = tonumber(ARGV[2])
local ok, b = pcall(cjson.decode, raw)
if not ok or type(b) ~= 'table' or (b.state ~= 'open' and b.state ~= 'half-open') then
  b = {state = 'open', since_ms = now, until_ms = now + open_for, by = 'an unknown writer'}
end
local until_ms = tonumber(b.until_ms) or now
if until_ms > now + 172800000 then
  until_ms = now
end
local moved = 0
if b.state == 'open' then
  if now < until_ms then
    return {'wait', until_ms - now, raw}
  end
  b.state = 'half-open'
  b.since_ms = now
  b.probes_left = probes
  b.until_ms = now + open_for
  b.by = ARGV[3]
  moved = 1
elseif (tonumber(b.probes_left) or 0) <= 0 then
  if now < until_ms then
    return {'wait', math.min(250, until_ms - now), raw}
  end
  -- Every probe of the round was taken and none answered in time (a host died with one):
  -- a new round.
  b.probes_left = probes
  b.until_ms = now + open_for
end
b.probes_left = (tonumber(b.probes_left) or probes) - 1
b.moved = moved
local state = cjson.encode(b)
redis.call('HSET', KEYS[1], 'breaker', state)
if moved == 1 then
  journal(KEYS[2], 'breaker-half-open', ARGV[3],
    string.format('open long enough: probing with %d deliveries', probes))
end
return {'probe', 0, state}
