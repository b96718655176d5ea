-- release.lua: one Release: the lease removed, the tokens settled
-- (rate.settle: never below zero, never above MAXDEBT), the spend settled
-- (never below zero) in the windows the Ask reserved in.
-- KEYS: the tokens bucket, the leases sorted set, the spend windows' hash.
-- ARGV: the lease ('' for none); the tokens to put in (> 0) or give back
-- (< 0); the tokens bucket's per, full, cell, tick (per 0: no settling);
-- the spend to put in or give back (0: none); whether to settle the day
-- and the month window (1 or 0); the day and month window ids ('': the
-- current one); the spend clock's shift (µs).

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
local sdelta = tonumber(ARGV[7])
if sdelta ~= 0 then
  local snow = clock() + tonumber(ARGV[12])
  local did, mid, dend, mend = windows(snow)
  local wrote = false
  if ARGV[8] == '1' then
    if ARGV[10] ~= '' then
      did = tonumber(ARGV[10])
      dend = day_end(did)
    end
    wrote = put(KEYS[3], 'd:' .. num(did), sdelta, dend, snow)
  end
  if ARGV[9] == '1' then
    if ARGV[11] ~= '' then
      mid = tonumber(ARGV[11])
      mend = month_id_end(mid)
    end
    wrote = put(KEYS[3], 'm:' .. num(mid), sdelta, mend, snow) or wrote
  end
  if wrote then
    tidy(KEYS[3], snow)
  end
end
return 0
