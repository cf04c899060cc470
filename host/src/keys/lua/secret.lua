-- A stream's secret, made by whichever host comes first, and until when marks of the earlier
-- release's form are trusted on the stream, set by the first host of this release.
--
-- KEYS[1]  the stream's secret (a string)
-- KEYS[2]  the stream's legacy-marks deadline (a string: epoch ms)
-- ARGV[1]  a new random secret, kept only if there is none
-- ARGV[2]  the grace in milliseconds: the deadline is the server's clock now plus this, kept
--          only if there is none
--
-- Reply: {secret, deadline}.
redis.call('SET', KEYS[1], ARGV[1], 'NX')
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('SET', KEYS[2], string.format('%.0f', now + tonumber(ARGV[2])), 'NX')
return {redis.call('GET', KEYS[1]), tonumber(redis.call('GET', KEYS[2]))}
