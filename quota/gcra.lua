-- gcra.lua: the bucket math of gcra.go, step for step, for the Redis
-- store's scripts (each script is this file followed by its own).
--
-- Every value is an integer below 2^53, which a Lua number (a double)
-- holds exactly: times are µs (Redis TIME), debts are in the per-limit
-- units gcra.go's newRate computes (passed in as per, full, cell, tick).
-- Division is idiv, the floor of a/b corrected for the double's rounding.
-- A bucket is a string key, "d t p f k": its debt, its time (µs, a
-- multiple of k) and its units p (per), f (full), k (tick); one GET reads
-- it, one SET with PX writes it and its expiry.

local MAXDEBT = 4503599627370496 -- 2^52: gcra.go's maxDebt

local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local function cdiv(a, b)
  return idiv(a + b - 1, b)
end

local function floorto(t, tick)
  return idiv(t, tick) * tick
end

-- num formats an integer for a Redis command, never in exponent form.
local function num(x)
  return string.format('%.0f', x)
end

-- clock is Redis's time in µs.
local function clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- debt_at is bucket.debtAt (with bucket.rebase's write): the debt of the
-- bucket at key as of now, in the units per, full, tick.
local function debt_at(key, per, full, tick, now)
  local v = redis.call('GET', key)
  if not v then
    return 0
  end
  local d, t, p, f, k = string.match(v, '^(%d+) (%d+) (%d+) (%d+) (%d+)$')
  d, t, p, f, k = tonumber(d), tonumber(t), tonumber(p), tonumber(f), tonumber(k)
  if not k or d <= 0 or p == 0 then
    return 0
  end
  local q = floorto(now, k)
  if q < t then
    -- the clock went back: rebase
    redis.call('SET', key, num(d) .. ' ' .. num(q) .. ' ' .. num(p) .. ' ' .. num(f) .. ' ' .. num(k), 'KEEPTTL')
  elseif q > t then
    local el = idiv(q - t, k)
    if el * p >= d then
      return 0
    end
    d = d - el * p
  end
  if p ~= per or k ~= tick then
    d = math.ceil(d / f * full) -- rescale: the same IEEE steps as Go's
    if d > MAXDEBT then
      d = MAXDEBT
    elseif d < 0 then
      d = 0
    end
  end
  return d
end

-- save keeps debt d as of now's tick, expiring when it is repaid (the
-- bucket full again, as no key at all is).
local function save(key, d, now, per, full, tick)
  if d <= 0 then
    redis.call('DEL', key)
    return
  end
  local q = floorto(now, tick)
  redis.call('SET', key, num(d) .. ' ' .. num(q) .. ' ' .. num(per) .. ' ' .. num(full) .. ' ' .. num(tick),
    'PX', num(cdiv(q + cdiv(d, per) * tick - now, 1000) + 1))
end

-- remaining is rate.remaining.
local function remaining(d, full, cell)
  if cell == 0 or d >= full then
    return 0
  end
  return idiv(full - d, cell)
end

-- untilrepaid is rate.until: µs from now until debt d (as of q) is repaid.
local function untilrepaid(d, q, now, per, tick)
  if d <= 0 or per == 0 then
    return 0
  end
  local v = q + cdiv(d, per) * tick - now
  if v < 0 then
    return 0
  end
  return v
end

