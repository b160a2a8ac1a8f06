-- take_one: take `cost` from one bucket, all or nothing (SPEC §2; no lease).
-- The bucket is a user's turn bucket (the key admit_turn uses, so both
-- share one budget) or a named bucket (the key space of take_many, which
-- RedisStore sends here when it takes from one bucket with no cooldown).
-- KEYS[1] bucket string (bucket_load in prelude.lua)   {prefix}:turn2:{user}
--         or {prefix}:k2:<name>
-- ARGV[1] eight little-endian doubles (struct 'd'; no text to parse), each
--   an integer within 2^53, so exact: now override (0: Redis TIME), amount,
--   period_ms, capacity scaled (capacity * period_ms), cost, max wait ms
--   (0 for take_one), exceeds (0/1: cost > capacity, computed exactly in
--   Rust), save refused (1: a refused bucket is saved refilled, a missing
--   one full at now, as take_many does; 0: only one that existed)
-- Returns three little-endian doubles (struct '<ddd': a string is far
-- cheaper for Redis to answer than a table): 1, wait_ms, level granted
-- | 2, retry_after_ms, level refused | 3, 0, level exceeds capacity; level
-- is the scaled level after the answer (only a grant takes anything).
local o, amount, period, cap, cost, max_wait, exceeds, save_refused =
  struct.unpack('<dddddddd', ARGV[1])
local now = now_ms(o)
local outcome, x, level = take_now(KEYS[1], now, amount, period, cap, cost * period, max_wait,
  exceeds, save_refused == 1)
return struct.pack('<ddd', outcome, x, level)
