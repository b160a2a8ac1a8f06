-- take_one: take `cost` from one bucket now or take nothing (SPEC §2 with
-- max_wait 0; no lease). The bucket is a user's turn bucket (the key
-- admit_turn uses, so both share one budget) or a named bucket (the key
-- space of take_many).
-- KEYS[1] bucket hash   {prefix}:turn:{user} or {prefix}:k:<name>
-- ARGV[1] now override (0: Redis TIME)   ARGV[2] amount   ARGV[3] period_ms
-- ARGV[4] capacity scaled (capacity * period_ms)   ARGV[5] cost
-- ARGV[6] exceeds (0/1: cost > capacity, computed exactly in Rust)
-- Returns {1, 0, level} granted | {2, retry_after_ms, level} refused
--       | {3, 0, level} exceeds capacity; level is the scaled level after
--         the answer (only a grant takes anything).
local now = now_ms(ARGV[1])
local amount, period, cap = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local cost, exceeds = tonumber(ARGV[5]), tonumber(ARGV[6])

local level, ts, existed, old_period = bucket_load(KEYS[1], now, cap, period)
level, ts = refill(level, ts, now, amount, cap, old_period, period)
local outcome, x, after = take(level, cost * period, 0, amount, exceeds)
if outcome == 1 then
  bucket_save(KEYS[1], after, ts, now, amount, cap, period)
  return {1, 0, after}
end
-- Refused: take nothing; keep only the refilled level of an existing bucket.
if existed then bucket_save(KEYS[1], level, ts, now, amount, cap, period) end
return {outcome, x, level}
