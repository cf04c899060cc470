-- Ask an open or half-open circuit breaker for a probe delivery.
-- KEYS[1]: the subscription's flow hash (`breaker`); KEYS[2]: its flow journal (see
-- journal.lua). ARGV: probes, open for (ms), who.
-- Returns {'closed', 0, ''} (nothing to ask: read), {'wait', ms, state} (open, or every probe
-- of this half-open round taken: ask again after ms), {'probe', 0, state} (one probe taken;
-- the state says whether this call moved it to half-open).
-- A record that is not Sluice's counts as open from now (never as closed); a time more than
-- two days ahead is taken as now.
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
