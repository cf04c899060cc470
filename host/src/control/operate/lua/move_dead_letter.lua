-- Move one dead letter from one dead-letter stream to another, atomically. What an upgrade
-- does with the dead letters an earlier release left in the stream's shared default
-- dead-letter stream (`<stream>.dead-letter`): each group's go to its own
-- (`<stream>.<group>.dead-letter`).
--
-- KEYS[1]  the dead-letter stream it is in
-- KEYS[2]  the dead-letter stream it goes to
-- ARGV[1]  its id in KEYS[1]
-- ARGV[2..] the fields to write (its own, resealed by the host when their origin is trusted)
--
-- Reply: the new id, or false when it was no longer there (another host moved it first). An
-- error reply when Redis refuses the XADD (KEYS[2] holds another type, no fields): the dead
-- letter stays where it was.
--
-- Crash: Redis keeps all of the script's writes or none: the dead letter is in exactly one of
-- the two streams. A host that dies before the call leaves it in KEYS[1] for the migration's
-- next pass; after it, a pass that comes to it again finds it gone (false) and moves nothing.
if #redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1]) == 0 then
  return false
end
local args = {KEYS[2], '*'}
for i = 2, #ARGV do
  args[#args + 1] = ARGV[i]
end
local id = redis.call('XADD', unpack(args))
redis.call('XDEL', KEYS[1], ARGV[1])
return id
