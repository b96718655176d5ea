-- release.lua: one Release: the lease removed, the tokens settled
-- (rate.settle: never below zero, never above MAXDEBT).
-- KEYS: the tokens bucket, the leases sorted set.
-- ARGV: the lease ('' for none); the tokens to put in (> 0) or give back
-- (< 0); the tokens bucket's per, full, cell, tick (per 0: no settling).

if ARGV[1] ~= '' then
  redis.call('ZREM', KEYS[2], ARGV[1])
end
local delta, per = tonumber(ARGV[2]), tonumber(ARGV[3])
if per > 0 and delta ~= 0 then
  local full, cell, tick = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
  local now = clock()
  local d = debt_at(KEYS[1], per, full, tick, now) + delta * cell
  if d < 0 then
    d = 0
  elseif d > MAXDEBT then
    d = MAXDEBT
  end
  save(KEYS[1], d, now, per, full, tick)
end
return 0
