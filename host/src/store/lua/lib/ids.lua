-- Library: comparing stream ids as text.
--
-- Stream ids are `<ms>-<seq>`, each part up to 2^64 - 1. A Lua number (a double) holds integers
-- exactly only up to 2^53, so ids are never turned into numbers: each part is compared as the
-- decimal text Redis writes (no leading zeros), first by length, then digit by digit.

-- Whether the decimal `a` is less than the decimal `b`.
local function decimal_less(a, b)
  if #a ~= #b then
    return #a < #b
  end
  return a < b
end

-- The decimal one more than `n`.
local function decimal_next(n)
  local digits = {}
  local carry = 1
  for i = #n, 1, -1 do
    local d = string.byte(n, i) - 48 + carry
    if d == 10 then
      d, carry = 0, 1
    else
      carry = 0
    end
    digits[i] = string.char(48 + d)
  end
  local out = table.concat(digits)
  if carry == 1 then
    out = '1' .. out
  end
  return out
end

-- The two parts of a stream id, as text.
local function id_parts(id)
  return string.match(id, '^(%d+)-(%d+)$')
end

-- Whether stream id `a` comes before stream id `b`.
local function id_less(a, b)
  local ams, aseq = id_parts(a)
  local bms, bseq = id_parts(b)
  if ams ~= bms then
    return decimal_less(ams, bms)
  end
  return decimal_less(aseq, bseq)
end

-- The smallest id after `id` (the sequence plus one; at the largest sequence, the next
-- millisecond's first id).
local function id_after(id)
  local ms, seq = id_parts(id)
  if seq == '18446744073709551615' then
    return decimal_next(ms) .. '-0'
  end
  return ms .. '-' .. decimal_next(seq)
end

