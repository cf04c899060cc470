-- Claim keys for one subscription: each key is recorded as this subscription's unless another
-- subscription recorded it first.
--
-- KEYS[1..n]  the claim records (`sluice-claim:<key>`), one per key claimed
-- ARGV[1]     this subscription, as the host names it (JSON: stream, group)
-- ARGV[2..n+1] what each key is for this subscription (e.g. "delayed-retry set"), kept with it
--
-- A record is a hash: `owner` (ARGV[1]) and `role`. A key is this subscription's when its record
-- is missing (it is written) or names the same owner.
--
-- Reply: {} when every key is this subscription's, else {i, owner, role} of the first key that
-- another subscription claimed (i counting from 1).
for i, key in ipairs(KEYS) do
  redis.call('HSETNX', key, 'owner', ARGV[1])
  redis.call('HSETNX', key, 'role', ARGV[i + 1])
  local owner = redis.call('HGET', key, 'owner')
  if owner ~= ARGV[1] then
    return {i, owner, redis.call('HGET', key, 'role') or ''}
  end
end
return {}
