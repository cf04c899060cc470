-- Library: one entry of the subscription's flow journal (see `pipeline/admit/journal.rs`), a
-- stream capped at the newest 100 entries. Best effort: a key of another type (another
-- program's) is skipped, and the transition still happens.
local function journal(key, what, by, detail)
  redis.pcall('XADD', key, 'MAXLEN', 100, '*', 'what', what, 'by', by, 'detail', detail)
end
