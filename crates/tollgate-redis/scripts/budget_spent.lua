-- budget_spent: what a user spent in each budget's window at the store's
-- clock, and its top-ups (tollgate-core/src/spend.rs, Spend::now); with an
-- adjustment, first applies an operator's reset or top-up to one budget's
-- window (Spend::adjust). A top-up with a request id is applied only if
-- the id is not among the user's recent ones (TopUpIds::first).
-- KEYS[1] spend, packed      {prefix}:bud:{user}  (spend_load in prelude.lua)
-- KEYS[2] top-up ids, zset   {prefix}:topup:{user}  id -> when applied (ms)
-- ARGV[1] now override (0: Redis TIME)
-- ARGV[2] little-endian doubles: n, then per budget: period (0 daily, 1
--   weekly, 2 monthly), unit (0 tokens, 1 micro-units), current window
--   start, end, next window start, end; then the adjustment: kind (0 none,
--   1 reset, 2 top-up), the budget's index (0-based) and the top-up
-- ARGV[3] the top-up's request id ('' none)
-- Returns 2n little-endian doubles: spent and granted per budget.
local now = now_ms(ARGV[1])
local n = struct.unpack('<d', ARGV[2])
local q = {struct.unpack('<' .. string.rep('d', 4 + 6 * n), ARGV[2])}
local B = spend_lib()
local spend = B.load(KEYS[1])
local kind = q[2 + 6 * n]
if kind == 2 and ARGV[3] ~= '' then
  -- TOP_UP_ID_RETENTION_MS and MAX_TOP_UP_IDS in spend.rs.
  local keep, most = 86400000, 256
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - keep)
  if redis.call('ZSCORE', KEYS[2], ARGV[3]) then
    kind = 0
  else
    redis.call('ZADD', KEYS[2], now, ARGV[3])
    local c = redis.call('ZCARD', KEYS[2])
    if c > most then redis.call('ZREMRANGEBYRANK', KEYS[2], 0, c - most - 1) end
    local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
    redis.call('PEXPIRE', KEYS[2], math.max(keep, tonumber(last[2]) + keep - now))
  end
end
if kind ~= 0 then
  local o = 2 + 6 * q[3 + 6 * n]
  local p, u = q[o], q[o + 1]
  local ws, we = B.window(now, q[o + 2], q[o + 3], q[o + 4], q[o + 5])
  local b = p * 7
  local held = B.is(spend, p, ws, u)
  if kind == 1 then
    -- A new epoch: reservations charged before no longer move it.
    local e = 1
    if held then e = spend[b + 7] + 1 end
    spend[b + 1], spend[b + 2], spend[b + 3], spend[b + 4], spend[b + 5], spend[b + 6],
      spend[b + 7] = ws, we, u, 0, 0, 0, e
  else
    if not held then
      spend[b + 1], spend[b + 2], spend[b + 3], spend[b + 4], spend[b + 5], spend[b + 6],
        spend[b + 7] = ws, we, u, 0, 0, 0, 0
    end
    local g = spend[b + 5] + q[4 + 6 * n]
    if g > MAX_SCALED then g = MAX_SCALED end
    spend[b + 5] = g
  end
  B.save(KEYS[1], spend, now)
end
local out = {}
for i = 0, n - 1 do
  local o = 2 + 6 * i
  local ws = B.window(now, q[o + 2], q[o + 3], q[o + 4], q[o + 5])
  out[#out + 1] = B.of(spend, q[o], ws, q[o + 1])
  local g = 0
  if B.is(spend, q[o], ws, q[o + 1]) then g = spend[q[o] * 7 + 5] end
  out[#out + 1] = g
end
if n == 0 then return '' end
return struct.pack('<' .. string.rep('d', 2 * n), unpack(out))
