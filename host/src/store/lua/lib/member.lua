-- Library: reading the members of a delayed-retry set, as the host reads them in Rust
-- (`entry/member.rs`).
--
-- A member is MessagePack: {stream, group, entry id, retry count, {name, value, ...}, origin id}
-- as this release's park script writes it (the origin may be '': the entry is its own), or
-- {entry id, retry count, {name, value, ...}[, origin id]} as earlier releases did (no owner).

-- The member's entry id, retry count, fields, origin id, and the stream and group it belongs to
-- (nil, nil for an earlier release's); nil when it is not a member Sluice wrote.
local function read_member(member)
  local ok, m = pcall(cmsgpack.unpack, member)
  if not ok or type(m) ~= 'table' then
    return nil
  end
  local id, retry, fields, origin, owner_stream, owner_group
  if #m == 6 and type(m[1]) == 'string' and type(m[2]) == 'string' then
    owner_stream, owner_group, id, retry, fields, origin = m[1], m[2], m[3], m[4], m[5], m[6]
  else
    id, retry, fields, origin = m[1], m[2], m[3], m[4]
  end
  if type(id) ~= 'string' or type(retry) ~= 'number' or type(fields) ~= 'table' then
    return nil
  end
  if type(origin) ~= 'string' or origin == '' then
    origin = id
  end
  return id, retry, fields, origin, owner_stream, owner_group
end

-- The bytes every member this release's park script writes for `stream` and `group` begins
-- with (a six-item array, then the two names): a member that begins so is this subscription's,
-- told without unpacking it.
local function member_prefix(stream, group)
  return string.char(0x96) .. cmsgpack.pack(stream) .. cmsgpack.pack(group)
end

