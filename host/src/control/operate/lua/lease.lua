-- A bulk job's lease, kept or let go only by the job that holds it: a job whose lease lapsed
-- (a long pause) must not extend or end the lease of the job that took it next.
--
-- KEYS[1]  the lease (a string: the holder's job id)
-- ARGV[1]  the job id
-- ARGV[2]  'renew' (PEXPIRE by ARGV[3] ms) or 'release' (DEL)
-- ARGV[3]  the lease's length, ms (renew)
--
-- Reply: 1 when the job holds the lease (and it was renewed or let go), 0 when it does not.
--
-- Crash: one write or none.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if ARGV[2] == 'renew' then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
else
  redis.call('DEL', KEYS[1])
end
return 1
