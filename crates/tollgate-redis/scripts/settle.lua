-- settle: close a reservation once, adjusting the token bucket by
-- actual - estimate (settle) or -estimate (refund) (SPEC §2).
-- KEYS[1] token bucket hash  {prefix}:tok:{user}
-- KEYS[2] invocation hash    {prefix}:inv:{user}:<invocation>
--         (it also keeps the user's tokens per minute: see tok_load in prelude.lua)
-- ARGV[1] now override   ARGV[2] amount   ARGV[3] period_ms   ARGV[4] capacity scaled
-- ARGV[5] call number   ARGV[6] actual tokens, or -1 for a refund
-- ARGV[7] reservation retention ms
-- Returns {1, balance, delta, now} applied, {2, balance, 0} already closed, {0} unknown.
local now = now_ms(ARGV[1])
local amount, period, cap = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local call, actual, retention = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])

local v = redis.call('HMGET', KEYS[2], 'c', 'e', 'o' .. call)
if not v[1] or tonumber(v[2]) <= now then return {0} end
if call < 1 or call > tonumber(v[1]) then return {0} end
local level, ts, _, old_period, v_tok = tok_load(KEYS[1], now, cap, period)
level, ts = refill(level, ts, now, amount, cap, old_period, period)
if not v[3] then return {2, floor_div(level, period), 0} end

local charged = tonumber(v[3])
redis.call('HDEL', KEYS[2], 'o' .. call)
redis.call('HSET', KEYS[2], 'e', now + retention)
redis.call('PEXPIRE', KEYS[2], retention)
local delta = -charged
if actual >= 0 then delta = actual - charged end
level = level - delta * period
if level > cap then level = cap end
if level < -MAX_SCALED then level = -MAX_SCALED end
local um, uc, up = usage_of(v_tok)
um, uc, up = usage_roll(um, uc, up, now, delta)
tok_save(KEYS[1], level, ts, now, amount, cap, period, um, uc, up)
return {1, floor_div(level, period), delta, now}
