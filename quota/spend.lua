-- spend.lua: the spend windows of spend.go, for admit.lua and release.lua
-- (each script is gcra.lua, this file, then its own).
--
-- A window is a UTC calendar day or month of Redis's clock, named by its
-- id (YYYYMMDD or YYYYMM, an integer). A key name's windows are the fields
-- d:<YYYYMMDD> and m:<YYYYMM> of one hash, a declared key
-- (<prefix>{<name>}:spend); a field is a window's total (spent + reserved,
-- nano-USD), kept until GRACE past the window's end so a request admitted
-- in it can still settle there. The hash expires GRACE past the end of its
-- latest window, so an idle key's hash goes.

local GRACE = 86400000000 -- µs: spend.go's spendGrace, a day
local DAY = 86400000000   -- µs

-- days_from_civil is the number of days from 1970-01-01 to y-m-d
-- (proleptic Gregorian; Howard Hinnant's algorithm).
local function days_from_civil(y, m, d)
  if m <= 2 then
    y = y - 1
  end
  local era = idiv(y, 400)
  local yoe = y - era * 400
  local mp = (m + 9) % 12
  local doy = idiv(153 * mp + 2, 5) + d - 1
  local doe = yoe * 365 + idiv(yoe, 4) - idiv(yoe, 100) + doy
  return era * 146097 + doe - 719468
end

-- civil_from_days is days_from_civil's inverse: y, m, d.
local function civil_from_days(z)
  z = z + 719468
  local era = idiv(z, 146097)
  local doe = z - era * 146097
  local yoe = idiv(doe - idiv(doe, 1460) + idiv(doe, 36524) - idiv(doe, 146096), 365)
  local y = yoe + era * 400
  local doy = doe - (365 * yoe + idiv(yoe, 4) - idiv(yoe, 100))
  local mp = idiv(5 * doy + 2, 153)
  local d = doy - idiv(153 * mp + 2, 5) + 1
  local m = mp + 3
  if mp >= 10 then
    m = mp - 9
  end
  if m <= 2 then
    y = y + 1
  end
  return y, m, d
end

-- month_end is the µs at which month y-m ends.
local function month_end(y, m)
  if m == 12 then
    return days_from_civil(y + 1, 1, 1) * DAY
  end
  return days_from_civil(y, m + 1, 1) * DAY
end

-- windows is windowsAt: the day and month ids holding now (µs) and their
-- ends (µs).
local function windows(now)
  local days = idiv(now, DAY)
  local y, m, d = civil_from_days(days)
  return y * 10000 + m * 100 + d, y * 100 + m, (days + 1) * DAY, month_end(y, m)
end

-- day_end and month_id_end are the ends (µs) of the windows named by
-- valid ids (Go checked them).
local function day_end(id)
  local y, m, d = idiv(id, 10000), idiv(id, 100) % 100, id % 100
  return (days_from_civil(y, m, d) + 1) * DAY
end

local function month_id_end(id)
  return month_end(idiv(id, 100), id % 100)
end

-- spent is the total of the window field of hash key (0 when it has
-- none).
local function spent(key, field)
  local v = redis.call('HGET', key, field)
  if not v then
    return 0
  end
  return tonumber(v) or 0
end

-- put adds delta to the window field of hash key ending at wend, never
-- below 0, unless the window has gone (GRACE past its end) or there is
-- nothing to add to an absent total. It returns whether it wrote (then
-- tidy follows). Not HINCRBY: a settlement may be as large as 2^63, which
-- HINCRBY refuses; a total this large only refuses.
local function put(key, field, delta, wend, now)
  if delta == 0 or now >= wend + GRACE then
    return false
  end
  local v = redis.call('HGET', key, field)
  if not v and delta < 0 then
    return false
  end
  local t = (tonumber(v) or 0) + delta
  if t < 0 then
    t = 0
  end
  redis.call('HSET', key, field, num(t))
  return true
end

-- field_end is the end (µs) of the window a field names, or nil for a
-- field that names none.
local function field_end(f)
  local id = string.match(f, '^d:(%d%d%d%d%d%d%d%d)$')
  if id then
    return day_end(tonumber(id))
  end
  id = string.match(f, '^m:(%d%d%d%d%d%d)$')
  if id then
    return month_id_end(tonumber(id))
  end
  return nil
end

-- tidy drops the fields of hash key whose windows ended GRACE or more
-- before now (and any field naming no window), then sets the hash to
-- expire GRACE past the end of its latest window left. With Redis's clock
-- moving forward a hash holds at most 2 day and 2 month fields: the
-- current windows and the ones before them.
local function tidy(key, now)
  local fields = redis.call('HKEYS', key)
  local last = nil
  for _, f in ipairs(fields) do
    local e = field_end(f)
    if not e or now >= e + GRACE then
      redis.call('HDEL', key, f)
    elseif not last or e > last then
      last = e
    end
  end
  if last then
    redis.call('PEXPIREAT', key, num(idiv(last + GRACE, 1000)))
  end
end
