-- Claim keys for one subscription: each key is recorded as this subscription's unless another
-- subscription holds it.
--
-- KEYS[1..n]  the claim records (`sluice-claim:<key>`), one per key claimed
-- ARGV[2i-1]  who claims key i, as the host names it (JSON: the stream, and the group for keys
--             only one subscription may use)
-- ARGV[2i]    what key i is for them (e.g. "delayed-retry set"), kept with it
-- ARGV[2n+1], ARGV[2n+2]  the roles of a dead-letter stream and of a stream (the host's names)
-- ARGV[2n+3]  how long a claim lasts unless renewed (ms): a subscription that is gone for that
--             long no longer holds its keys
-- ARGV[2n+4]  ',i,j,' the keys this subscription may read as a stream though they are another's
--             dead-letter stream (the caller checked that each is under its owner's default
--             name); '' for none
--
-- A record is a hash: `owner` and `role`, expiring with its lease. A key is this
-- subscription's when its record is missing (it is written) or names the same owner for the
-- same role; either way its lease starts again. A stream is claimed by its name alone (every
-- group may read it), so a stream one subscription reads cannot be another's delayed set, lane
-- or dead-letter stream, and a set, lane or dead-letter stream cannot be read as a stream; one
-- use is let through, when the caller says so: reading a dead-letter stream under its owner's
-- default name (a subscription that handles dead letters). A dead-letter stream under any other
-- name (say, another subscription's stream's name, claimed first) is never read as a stream.
-- Keys are looked at in order: those before a conflict are claimed (or renewed), those after
-- it are not looked at.
--
-- Reply: {} when every key is this subscription's, else {i, owner, role} of the first key that
-- another subscription holds (i counting from 1). An error reply when a record holds another
-- type.
--
-- Crash: Redis keeps all of the script's writes or none. Claims come before a subscription
-- reads: a host that dies before the call has read nothing; after it, its claims hold for their
-- lease (renewed while the subscription runs) and lapse if every host of it is gone for that
-- long. Claiming again is harmless: the same owner renews its own.
local n = #KEYS
local dl_role, stream_role = ARGV[2 * n + 1], ARGV[2 * n + 2]
local lease, readable = tonumber(ARGV[2 * n + 3]), ARGV[2 * n + 4]
for i, key in ipairs(KEYS) do
  local owner, role = ARGV[2 * i - 1], ARGV[2 * i]
  redis.call('HSETNX', key, 'owner', owner)
  redis.call('HSETNX', key, 'role', role)
  local their_owner = redis.call('HGET', key, 'owner')
  local their_role = redis.call('HGET', key, 'role')
  if their_owner == owner and their_role == role then
    redis.call('PEXPIRE', key, lease)
  else
    local reads_dead_letters = their_role == dl_role and role == stream_role
      and string.find(readable, ',' .. i .. ',', 1, true)
    if not reads_dead_letters then
      return {i, their_owner or '', their_role or ''}
    end
  end
end
return {}
