-- A page of entries for an operator to look at, never an entry of any size: XRANGE or
-- XREVRANGE (ARGV[1]) of KEYS[1] from ARGV[2] to ARGV[3], at most ARGV[4] entries; a name or
-- value over ARGV[5] bytes keeps its first ARGV[5] bytes and says how long it was, and once an
-- entry's fields pass ARGV[6] bytes the rest are left out, counted in one last field.
-- Users: operate/dead_letters.rs (list_view, get_view), operate/entry.rs (one_entry).
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
