-- Put one dead letter back onto its subscription's stream and remove it from the dead-letter
-- stream, atomically: a crash at any instant leaves it in exactly one of the two places.
--
-- KEYS[1]  the stream
-- KEYS[2]  the dead-letter stream
-- KEYS[3]  the stream's secret (may not exist)
-- ARGV[1]  the dead letter's id
-- ARGV[2]  the origin id to keep ('' when unknown)
-- ARGV[3..6] the bookkeeping field names, in order: retry count, origin id, due time, mark
-- ARGV[7..] the fields to add: name, value, ... (the entry's own fields and the requeue record)
--
-- With a secret and an origin id, the copy ends with the sweep's trusted bookkeeping: retry
-- count 0, the origin id, "due" now, and the mark over them, so the handler sees the producer's
-- origin id again and a fresh attempt count. Without them it is a plain new entry.
--
-- The dead letter is checked first (another operator or host may have requeued or deleted it:
-- nothing is written then), added second, deleted last: if the XADD fails the script stops
-- before the XDEL and the dead letter stays.
--
-- Reply: the new entry's id, or false when the dead letter was no longer there.
if #redis.call('XRANGE', KEYS[2], ARGV[1], ARGV[1]) == 0 then
  return false
end
local args = {KEYS[1], '*'}
for i = 7, #ARGV do
  args[#args + 1] = ARGV[i]
end
local secret = redis.call('GET', KEYS[3])
if secret and ARGV[2] ~= '' then
  local time = redis.call('TIME')
  local now = string.format('%.0f', tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000))
  local message = #KEYS[1] .. ':' .. KEYS[1] .. ':' .. ARGV[2] .. ':0:' .. now
  local mark = redis.sha1hex(secret .. redis.sha1hex(secret .. message))
  for _, v in ipairs({ARGV[3], '0', ARGV[4], ARGV[2], ARGV[5], now, ARGV[6], mark}) do
    args[#args + 1] = v
  end
end
local id = redis.call('XADD', unpack(args))
redis.call('XDEL', KEYS[2], ARGV[1])
return id
