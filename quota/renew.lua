-- renew.lua: the leases this process holds for one key live another
-- time to live. A lease no longer there (expired, or Redis lost it) is not
-- added back: a Release may have removed it meanwhile.
-- KEYS: the leases sorted set. ARGV: the time to live in µs, the leases.
-- Returns the number of leases renewed.

local now = clock()
local ttl = tonumber(ARGV[1])
local score = num(now + ttl)
local renewed = 0
for i = 2, #ARGV do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    redis.call('ZADD', KEYS[1], 'XX', score, ARGV[i])
    renewed = renewed + 1
  end
end
redis.call('PEXPIRE', KEYS[1], num(cdiv(ttl, 1000)))
return renewed
