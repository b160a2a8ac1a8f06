-- admit_turn: turn bucket and run lease, all or nothing (SPEC §3).
-- KEYS[1] turn bucket (packed string: bucket_load in prelude.lua)   {prefix}:turn2:{user}
-- KEYS[2] run lease zset     {prefix}:lease:{user}  (member invocation, score expiry)
-- KEYS[3] spend, packed      {prefix}:bud:{user}  (spend_load in prelude.lua)
-- ARGV[1] seven little-endian doubles (struct 'd', each an integer within
--   2^53, so exact; no text to parse): now override (0: Redis TIME),
--   amount, period_ms, capacity scaled (capacity * period_ms), lease ttl
--   ms, max runs, concurrency retry cap ms
-- ARGV[2] invocation id
-- ARGV[3] budgets whose exhaustion refuses the turn ('' for none),
--   little-endian doubles: n, then per budget: period (0 daily, 1 weekly,
--   2 monthly), unit, limit, current window start, end, next window start,
--   end. A spent one (its limit plus the window's top-ups) refuses before
--   anything else is looked at.
-- Returns four little-endian doubles (struct '<dddd': a string is far
-- cheaper for Redis to answer than a table):
--         1, lease_expires_at, refreshed (0/1), reclaimed
--      or 0, limit (1 turn_rate, 2 concurrency, 3 + period a budget),
--         retry_after_ms, reclaimed
local o, amount, period, cap, ttl, max_runs, retry_cap = struct.unpack('<ddddddd', ARGV[1])
local now = now_ms(o)
local inv = ARGV[2]

if ARGV[3] ~= '' then
  local n = struct.unpack('<d', ARGV[3])
  local b = {struct.unpack('<' .. string.rep('d', 1 + 7 * n), ARGV[3])}
  local B = spend_lib()
  local spend = B.load(KEYS[3])
  local code, hint = 0, 0
  for i = 0, n - 1 do
    local o = 2 + 7 * i
    local ws, we = B.window(now, b[o + 3], b[o + 4], b[o + 5], b[o + 6])
    if B.of(spend, b[o], ws, b[o + 1]) >= B.limit(spend, b[o], ws, b[o + 1], b[o + 2]) then
      local h = we - now
      if h < 1 then h = 1 end
      if code == 0 or h > hint then code, hint = ADMIT_BUDGET + b[o], h end
    end
  end
  if code ~= 0 then return struct.pack('<dddd', DENIED, code, hint, 0) end
end

local reclaimed = redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local exp = now + ttl
-- The set lives at least as long as its latest lease: a new set gets this
-- lease's TTL, an existing one is only ever extended (GT: every write
-- covered its own lease, so the TTL covers them all; a lease released or
-- reclaimed early may leave it longer than needed, never shorter).
local function lease_expire(fresh)
  if fresh then
    redis.call('PEXPIRE', KEYS[2], exp - now)
  else
    redis.call('PEXPIRE', KEYS[2], exp - now, 'GT')
  end
end
local held = tonumber(redis.call('ZSCORE', KEYS[2], inv))
if held then
  -- A live holder retrying: refresh (never shorten), charge nothing.
  if held > exp then exp = held end
  redis.call('ZADD', KEYS[2], exp, inv)
  lease_expire(false)
  return struct.pack('<dddd', GRANTED, exp, 1, reclaimed)
end

local level, ts, existed, old_period = bucket_load(KEYS[1], now, cap, period)
level, ts = refill(level, ts, now, amount, cap, old_period, period)
local outcome, hint, after = take(level, period, 0, amount, 0)
local turn_hint = nil
if outcome ~= TAKE_GRANTED then turn_hint = hint end

local lease_hint = nil
local runs = redis.call('ZCARD', KEYS[2])
if runs >= max_runs then
  local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  local h = tonumber(first[2]) - now
  if h > retry_cap then h = retry_cap end
  if h < 1 then h = 1 end
  lease_hint = h
end

if not turn_hint and not lease_hint then
  bucket_save(KEYS[1], after, ts, now, amount, cap, period)
  redis.call('ZADD', KEYS[2], exp, inv)
  lease_expire(runs == 0)
  return struct.pack('<dddd', GRANTED, exp, 0, reclaimed)
end
-- Denied: take nothing; keep only the refilled level of an existing bucket.
if existed then bucket_save(KEYS[1], level, ts, now, amount, cap, period) end
if turn_hint and (not lease_hint or turn_hint > lease_hint) then
  return struct.pack('<dddd', DENIED, ADMIT_TURN_RATE, turn_hint, reclaimed)
end
return struct.pack('<dddd', DENIED, ADMIT_CONCURRENCY, lease_hint, reclaimed)
