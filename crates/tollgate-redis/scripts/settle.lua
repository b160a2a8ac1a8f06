-- settle: close a reservation once, adjusting the token bucket by
-- actual - estimate (settle) or -estimate (refund) (SPEC §2).
-- KEYS[1] token bucket and usage, packed  {prefix}:tok2:{user} (tok_load in prelude.lua)
-- KEYS[2] invocation hash    {prefix}:inv:{user}:<invocation>
-- ARGV[1] seven little-endian doubles (struct 'd', each an integer within
--   2^53, so exact): now override (0: Redis TIME), amount, period_ms,
--   capacity scaled, call number, actual tokens (-1 for a refund),
--   reservation retention ms
-- Returns four little-endian doubles (struct '<dddd'): 1, balance, delta,
-- now applied | 2, balance, 0, 0 already closed | 0, 0, 0, 0 unknown.
local o, amount, period, cap, call, actual, retention = struct.unpack('<ddddddd', ARGV[1])
local now = now_ms(o)

local v = redis.call('HMGET', KEYS[2], 'c', 'e', 'o' .. call)
if not v[1] or tonumber(v[2]) <= now or call < 1 or call > tonumber(v[1]) then
  return struct.pack('<dddd', 0, 0, 0, 0)
end
local level, ts, _, old_period, um, uc, up = tok_load(KEYS[1], now, cap, period)
level, ts = refill(level, ts, now, amount, cap, old_period, period)
if not v[3] then return struct.pack('<dddd', 2, floor_div(level, period), 0, 0) end

local charged = tonumber(v[3])
redis.call('HDEL', KEYS[2], 'o' .. call)
redis.call('HSET', KEYS[2], 'e', now + retention)
redis.call('PEXPIRE', KEYS[2], retention)
local delta = -charged
if actual >= 0 then delta = actual - charged end
level = level - delta * period
if level > cap then level = cap end
if level < -MAX_SCALED then level = -MAX_SCALED end
um, uc, up = usage_roll(um, uc, up, now, delta)
tok_save(KEYS[1], level, ts, now, amount, cap, period, um, uc, up)
return struct.pack('<dddd', 1, floor_div(level, period), delta, now)
