-- Move one pending entry the host did not read whole (a field over max_entry_bytes) to the
-- dead-letter stream, copying its fields inside Redis, and acknowledge it, atomically: as
-- dead_letter.lua, but the fields never travel through the host.
--
-- KEYS[1]  the stream the entry was read from
-- KEYS[2]  the dead-letter stream
-- KEYS[3]  the subscription's histories, KEYS[4] their index (see lib/history.lua)
-- ARGV[1]  the consumer group
-- ARGV[2]  the entry id
-- ARGV[3]  trim the dead-letter stream to about this many entries (MAXLEN ~), 0 for never
-- ARGV[4]  the history note ('' for none), ARGV[5] how long it outlives the dead letter, ms
-- ARGV[6]  the most fields one XADD from a script carries; past it they go packed into one,
--          ARGV[7] (the packed field's name)
-- ARGV[8]  the stream's secret ('' for none: the dead letter goes unsealed)
-- ARGV[9], ARGV[10]  the seal's uses: a dead letter, one with its fields packed
-- ARGV[11] the subscription's stream, ARGV[12] the origin id (what the seal covers)
-- ARGV[13] the seal's field name, ARGV[14] the prefix of a producer's field named like the
--          host's own (keys::PRODUCER_PREFIX)
-- ARGV[15..] the bookkeeping to record after the fields: name, value, ...
--
-- A field of the entry named `sluice-*` or starting with ARGV[14] goes in under ARGV[14] in
-- front of its name, so the host's bookkeeping is the only `sluice-*`.
--
-- Reply: as dead_letter.lua's; also false when the entry was deleted from the stream while
-- pending (it is acknowledged then: nothing to copy, as a read of a deleted entry lets it go).
--
-- Crash: as dead_letter.lua's: pending or dead-lettered, never neither, never both; a call
-- made again after a lost reply answers false and writes nothing.
-- @include lib/pending
-- @include lib/seal
-- @include lib/dead_letter_write
local state, stop = pending_state(KEYS[1], ARGV[1], ARGV[2])
if not state then
  return stop
end
local found = redis.call('XRANGE', KEYS[1], ARGV[2], ARGV[2])
if not found[1] then
  -- Deleted while pending: nothing to copy (as a read of a deleted entry, it is let go).
  if state ~= 'group-gone' then
    redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
  end
  return false
end
local fields = found[1][2]
-- A producer's field named like the host's own goes in under another name (settle/mod.rs).
local prefix = ARGV[14]
for i = 1, #fields, 2 do
  local name = fields[i]
  if string.sub(name, 1, 7) == 'sluice-' or string.sub(name, 1, #prefix) == prefix then
    fields[i] = prefix .. name
  end
end
local written, use = fields, ARGV[9]
if #fields / 2 > tonumber(ARGV[6]) then
  written, use = {ARGV[7], cmsgpack.pack(fields)}, ARGV[10]
end
local args = {}
for _, v in ipairs(written) do
  args[#args + 1] = v
end
for i = 15, #ARGV do
  args[#args + 1] = ARGV[i]
end
if ARGV[8] ~= '' then
  args[#args + 1] = ARGV[13]
  args[#args + 1] = seal(ARGV[8], {use, ARGV[11], ARGV[1], ARGV[12], fields_digest(written)})
end
return write_dead_letter(state, args)
