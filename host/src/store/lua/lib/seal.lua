-- Library: the seal over what the host writes, as the host computes it in Rust
-- (`keys::Secret::seal`, `keys::fields_digest`).
--
-- A list of strings is hashed as its MessagePack form (`cmsgpack.pack`: an array of str, every
-- length in it), which is unambiguous, and much cheaper in Lua than building the message by
-- hand.

-- The seal of `parts` (a list of strings, the use first) with `secret`:
-- sha1(secret .. sha1(secret .. pack(parts))) in hex.
local function seal(secret, parts)
  return redis.sha1hex(secret .. redis.sha1hex(secret .. cmsgpack.pack(parts)))
end

-- The digest of a flat list of fields (name, value, name, value, ...) a seal covers: sha1 in hex
-- of the list packed.
local function fields_digest(flat)
  return redis.sha1hex(cmsgpack.pack(flat))
end

