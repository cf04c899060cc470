-- A page of entries for an operator to look at, never an entry of any size: a name or value
-- past a bound keeps its first bytes and says how long it was, and once an entry's fields pass
-- another bound the rest are left out, counted in one last field. Users:
-- operate/dead_letters.rs (list_view, get_view), operate/entry.rs (one_entry).
--
-- KEYS[1]  the stream (a dead-letter stream, or the stream an entry is looked up in)
-- ARGV[1]  XRANGE or XREVRANGE
-- ARGV[2]  the first id (or - / +), ARGV[3] the last, as the command takes them
-- ARGV[4]  at most this many entries
-- ARGV[5]  the most bytes of a name or value shown
-- ARGV[6]  the bytes of an entry's fields shown before the rest are left out (each field
--          counts 64 bytes more; the host's own `sluice-*` fields, the first 64 of them, are
--          shown wherever they are)
--
-- Reply: the entries as the command answers them, {{id, {name, value, ...}}, ...}; a cut name
-- or value ends with `... [N bytes in all, cut to M for display]`, and the fields left out are
-- one last pair `(not shown)`, `K more fields, B bytes`. {} for a missing stream; an error
-- reply when the key holds another type or ARGV[2] or ARGV[3] is no stream id.
--
-- Crash: reads only; nothing to leave.
local rows = redis.call(ARGV[1], KEYS[1], ARGV[2], ARGV[3], 'COUNT', tonumber(ARGV[4]))
local cap, total = tonumber(ARGV[5]), tonumber(ARGV[6])
local function shown(s)
  if #s <= cap then
    return s
  end
  return string.sub(s, 1, cap) .. '... [' .. #s .. ' bytes in all, cut to ' .. cap .. ' for display]'
end
-- Each field counts 64 bytes more (as max_entry_bytes counts it: a million empty fields are no
-- small view), and the host's own `sluice-*` fields (a dead letter's reason, its origin) are
-- shown wherever they are (the first 64 of them: a producer can name its fields so too).
for _, row in ipairs(rows) do
  local fields = row[2]
  local out, bytes, left, left_bytes, owns = {}, 0, 0, 0, 0
  for i = 1, #fields - 1, 2 do
    local size = #fields[i] + #fields[i + 1]
    local own = owns < 64 and string.sub(fields[i], 1, 7) == 'sluice-'
    if own then
      owns = owns + 1
    end
    if bytes < total or own then
      out[#out + 1] = shown(fields[i])
      out[#out + 1] = shown(fields[i + 1])
      bytes = bytes + math.min(#fields[i], cap) + math.min(#fields[i + 1], cap) + 64
    else
      left, left_bytes = left + 1, left_bytes + size
    end
  end
  if left > 0 then
    out[#out + 1] = '(not shown)'
    out[#out + 1] = left .. ' more fields, ' .. left_bytes .. ' bytes'
  end
  row[2] = out
end
return rows
