-- budget_spent: what a user spent in each budget's window at the store's
-- clock (read only; tollgate-core/src/spend.rs, Spend::spent).
-- KEYS[1] spend, packed      {prefix}:bud:{user}  (spend_load in prelude.lua)
-- ARGV[1] now override (0: Redis TIME)
-- ARGV[2] little-endian doubles: n, then per budget: period (0 daily, 1
--   weekly, 2 monthly), unit (0 tokens, 1 micro-units), current window
--   start, end, next window start, end
-- Returns n little-endian doubles: the amount spent per budget.
local now = now_ms(ARGV[1])
local n = struct.unpack('<d', ARGV[2])
local q = {struct.unpack('<' .. string.rep('d', 1 + 6 * n), ARGV[2])}
local B = spend_lib()
local spend = B.load(KEYS[1])
local out = {}
for i = 0, n - 1 do
  local o = 2 + 6 * i
  local ws = B.window(now, q[o + 2], q[o + 3], q[o + 4], q[o + 5])
  out[#out + 1] = B.of(spend, q[o], ws, q[o + 1])
end
if n == 0 then return '' end
return struct.pack('<' .. string.rep('d', n), unpack(out))
