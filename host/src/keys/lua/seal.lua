-- Shared by the scripts that seal what the host writes (delayed/lua/sweep.lua,
-- operate/lua/requeue.lua, operate/lua/dead_letter_now.lua, operate/lua/move_dead_letter.lua),
-- which are loaded with this text in front of them. The host computes the same in Rust
-- (`keys::Secret::seal`, `keys::fields_digest`).

-- The seal of `parts` (a list of strings, the use first) with `secret`:
-- sha1(secret .. sha1(secret .. message)) in hex, the message being every part length-prefixed
-- (`<length>:<part>`).
local function seal(secret, parts)
  local message = {}
  for _, part in ipairs(parts) do
    message[#message + 1] = #part .. ':' .. part
  end
  return redis.sha1hex(secret .. redis.sha1hex(secret .. table.concat(message)))
end

-- The digest of a flat list of fields (name, value, name, value, ...) a seal covers: sha1 in hex
-- of every name and value length-prefixed.
local function fields_digest(flat)
  local message = {}
  for _, part in ipairs(flat) do
    message[#message + 1] = #part .. ':' .. part
  end
  return redis.sha1hex(table.concat(message))
end

