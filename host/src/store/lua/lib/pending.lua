-- Library: whether the entry a settle script is about to settle is still pending.
--
-- Whether entry `id` is still pending for `group` on `stream`, asked before anything is
-- written. Returns 'pending', or 'group-gone' on NOGROUP (the stream or the group was
-- deleted); or, as a second value, the script's reply when it must stop here: false when the
-- entry is no longer pending (another consumer acknowledged it), Redis's error for any other
-- failure.
local function pending_state(stream, group, id)
  local pending = redis.pcall('XPENDING', stream, group, id, id, 1)
  if type(pending) == 'table' and pending.err then
    if string.find(pending.err, 'NOGROUP', 1, true) then
      return 'group-gone'
    end
    return nil, pending
  end
  if #pending == 0 then
    return nil, false
  end
  return 'pending'
end

