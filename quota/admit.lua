-- admit.lua: one Admit (gcra.go's decide), all or nothing.
-- KEYS: the requests bucket, the tokens bucket, the leases sorted set,
-- the spend windows' hash.
-- ARGV: requests per, full, cell, tick (per 0: no limit); tokens per,
-- full, cell, tick; the tokens asked; the concurrent limit (0: none); the
-- lease; the lease's time to live in µs; the spend per day and per month
-- limits (0: none); the spend asked; a shift in µs added to Redis's clock
-- for the spend windows (0; tests move it).
-- Returns: allowed (1 or 0), refused (0 none, 1 requests, 2 tokens,
-- 3 concurrent, 4 spend), retry after (µs, unrounded; 0: never or
-- concurrency), requests remaining and reset (µs), tokens remaining and
-- reset (µs), in flight, the day and month spend totals, the day and month
-- window ids (0 without that limit).

local rper, rfull, rcell, rtick = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local tper, tfull, tcell, ttick = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local n = tonumber(ARGV[9])
if n < 0 then
  n = 0
end
local climit, lease, ttl = tonumber(ARGV[10]), ARGV[11], tonumber(ARGV[12])
local now = clock()
local sday, smonth, sn = tonumber(ARGV[13]), tonumber(ARGV[14]), tonumber(ARGV[15])
if sn < 0 then
  sn = 0
end

local rd, rq, rafter, rok = 0, 0, 0, true
if rper > 0 then
  rq = floorto(now, rtick)
  rd = debt_at(KEYS[1], rper, rfull, rtick, now)
  rafter = rd + rcell
  rok = rafter <= rfull
end
local td, tq, tafter, tok, toobig = 0, 0, 0, true, false
if tper > 0 then
  tq = floorto(now, ttick)
  td = debt_at(KEYS[2], tper, tfull, ttick, now)
  toobig = n * tcell > tfull -- n > limit: never
  tafter = td + n * tcell
  tok = tafter <= tfull
end
local inflight = 0
if climit > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', num(now)) -- expired leases
  inflight = redis.call('ZCARD', KEYS[3])
end

local dtot, mtot, did, mid, dend, mend, snow = 0, 0, 0, 0, 0, 0, 0
local srefused, snever, sretry = false, false, 0
if sday > 0 or smonth > 0 then
  snow = now + tonumber(ARGV[16])
  local d, m, de, me = windows(snow)
  if sday > 0 then
    did, dend = d, de
    dtot = spent(KEYS[4], 'd:' .. num(did))
    if sn > sday - dtot then
      srefused, snever, sretry = true, snever or sn > sday, math.max(sretry, dend - snow)
    end
  end
  if smonth > 0 then
    mid, mend = m, me
    mtot = spent(KEYS[4], 'm:' .. num(mid))
    if sn > smonth - mtot then
      srefused, snever, sretry = true, snever or sn > smonth, math.max(sretry, mend - snow)
    end
  end
end

local refused, retry = 0, 0
if not rok then
  refused, retry = 1, untilrepaid(rafter - rfull, rq, now, rper, rtick)
elseif toobig then
  refused = 2
elseif not tok then
  refused, retry = 2, untilrepaid(tafter - tfull, tq, now, tper, ttick)
elseif srefused then
  refused = 4
  if not snever then
    retry = sretry
  end
elseif climit > 0 and inflight >= climit then
  refused = 3
else
  if rper > 0 then
    rd = rafter
    save(KEYS[1], rd, now, rper, rfull, rtick)
  end
  if tper > 0 and n > 0 then
    td = tafter
    save(KEYS[2], td, now, tper, tfull, ttick)
  end
  if sn > 0 then
    -- The current windows: within the limits, so HINCRBY cannot overflow.
    if sday > 0 then
      dtot = redis.call('HINCRBY', KEYS[4], 'd:' .. num(did), num(sn))
    end
    if smonth > 0 then
      mtot = redis.call('HINCRBY', KEYS[4], 'm:' .. num(mid), num(sn))
    end
    tidy(KEYS[4], snow)
  end
  if climit > 0 then
    inflight = inflight + redis.call('ZADD', KEYS[3], num(now + ttl), lease)
    redis.call('PEXPIRE', KEYS[3], num(cdiv(ttl, 1000)))
  end
end

local ok = 0
if refused == 0 then
  ok = 1
end
return {ok, refused, retry,
  remaining(rd, rfull, rcell), untilrepaid(rd, rq, now, rper, rtick),
  remaining(td, tfull, tcell), untilrepaid(td, tq, now, tper, ttick),
  inflight, dtot, mtot, did, mid}
