-- Claim keys for one subscription: each key is recorded as this subscription's unless another
-- subscription recorded it first.
--
-- KEYS[1..n]  the claim records (`sluice-claim:<key>`), one per key claimed
-- ARGV[2i-1]  who claims key i, as the host names it (JSON: the stream, and the group for keys
--             only one subscription may use)
-- ARGV[2i]    what key i is for them (e.g. "delayed-retry set"), kept with it
-- ARGV[2n+1], ARGV[2n+2]  the roles of a dead-letter stream and of a stream (the host's names)
--
-- A record is a hash: `owner` and `role`. A key is this subscription's when its record is
-- missing (it is written) or names the same owner for the same role. A stream is claimed by its
-- name alone (every group may read it), so a stream one subscription reads cannot be another's
-- delayed set, lane or dead-letter stream, and a set or lane cannot be read as a stream. One
-- use is let through: reading another subscription's dead-letter stream as a stream (a
-- subscription that handles dead letters); the claim stays the dead-letter stream's.
--
-- Reply: {} when every key is this subscription's, else {i, owner, role} of the first key that
-- another subscription claimed (i counting from 1).
for i, key in ipairs(KEYS) do
  local owner, role = ARGV[2 * i - 1], ARGV[2 * i]
  redis.call('HSETNX', key, 'owner', owner)
  redis.call('HSETNX', key, 'role', role)
  local their_owner = redis.call('HGET', key, 'owner')
  local their_role = redis.call('HGET', key, 'role')
  local reads_dead_letters = their_role == ARGV[2 * #KEYS + 1] and role == ARGV[2 * #KEYS + 2]
  if (their_owner ~= owner or their_role ~= role) and not reads_dead_letters then
    return {i, their_owner or '', their_role or ''}
  end
end
return {}
