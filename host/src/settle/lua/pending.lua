-- Shared by the scripts that settle one pending entry (settle/lua/dead_letter.lua,
-- delayed/lua/park.lua), which are loaded with this text in front of them.
--
-- Whether entry `id` is still pending for `group` on `stream`, asked before anything is
-- written: 'pending'; 'settled' when it is not (another consumer acknowledged it);
-- 'group-gone' on NOGROUP (the stream or the group was deleted); or 'error' and Redis's
-- message for any other failure.
local function pending_state(stream, group, id)
  local pending = redis.pcall('XPENDING', stream, group, id, id, 1)
  if type(pending) == 'table' and pending.err then
    if string.find(pending.err, 'NOGROUP', 1, true) then
      return 'group-gone'
    end
    return 'error', pending.err
  end
  if #pending == 0 then
    return 'settled'
  end
  return 'pending'
end

