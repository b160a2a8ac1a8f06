-- settle: close a reservation once, adjusting the token bucket by
-- actual - estimate (settle) or -estimate (refund) (SPEC §2).
-- KEYS[1] token bucket and usage, packed  {prefix}:tok2:{user} (tok_load in prelude.lua)
-- KEYS[2] invocation hash    {prefix}:inv:{user}:<invocation>
-- KEYS[3] spend, packed      {prefix}:bud:{user}  (spend_load in prelude.lua)
-- ARGV[1] seven little-endian doubles (struct 'd', each an integer within
--   2^53, so exact): now override (0: Redis TIME), amount, period_ms,
--   capacity scaled, call number, actual tokens (-1 for a refund),
--   reservation retention ms
-- ARGV[2] the budgets now ('' for none: a budget record is dropped
--   unread), little-endian doubles: n, split given (0/1), input, output,
--   cached input tokens, then per budget: period, unit, limit, current
--   window start, end, next window start, end; then k, the number of alert
--   thresholds, and the k percents. The reservation's record b<call>
--   (reserve_tokens.lua) says what it charged where, at what price: each
--   budget still named moves by actual - charged in that window if the
--   store clock is still in it and it was not reset since (its epoch),
--   else the actual amount goes to the current window; a refund gives the
--   charge back in its window and epoch only
--   (tollgate-core/src/spend.rs, Spend::close).
-- Returns little-endian doubles: 1, balance, delta, now, crossed applied
-- ('<ddddd'; crossed: the alert thresholds the settle's charge crossed, bit
-- 8 * period + i) | 2, balance, 0, 0 already closed | 0, 0, 0, 0 unknown
-- ('<dddd').
local o, amount, period, cap, call, actual, retention = struct.unpack('<ddddddd', ARGV[1])
local now = now_ms(o)

local v = redis.call('HMGET', KEYS[2], 'c', 'e', 'o' .. call, 'b' .. call)
if not v[1] or tonumber(v[2]) <= now or call < 1 or call > tonumber(v[1]) then
  return struct.pack('<dddd', SETTLE_UNKNOWN, 0, 0, 0)
end
local level, ts, _, old_period, um, uc, up = tok_load(KEYS[1], now, cap, period)
level, ts = refill(level, ts, now, amount, cap, old_period, period)
if not v[3] then return struct.pack('<dddd', SETTLE_CLOSED, floor_div(level, period), 0, 0) end

local charged = tonumber(v[3])
redis.call('HDEL', KEYS[2], 'o' .. call, 'b' .. call)
redis.call('HSET', KEYS[2], 'e', now + retention)
redis.call('PEXPIRE', KEYS[2], retention)
local delta = -charged
if actual >= 0 then delta = actual - charged end
level = level - delta * period
if level > cap then level = cap end
if level < -MAX_SCALED then level = -MAX_SCALED end
um, uc, up = usage_roll(um, uc, up, now, delta)
tok_save(KEYS[1], level, ts, now, amount, cap, period, um, uc, up)
local crossed = 0
if v[4] and ARGV[2] ~= '' then
  local rn = struct.unpack('<d', v[4])
  -- 5 numbers per charge (period, unit, window start, epoch, charge); a
  -- record of the earlier layout has 4 (no epoch: 0).
  local per = 5
  if #v[4] == 8 * (4 + 4 * rn) then per = 4 end
  local r = {struct.unpack('<' .. string.rep('d', 4 + per * rn), v[4])}
  local qn = struct.unpack('<d', ARGV[2])
  local k = struct.unpack('<d', ARGV[2], 1 + 8 * (5 + 7 * qn))
  local q = {struct.unpack('<' .. string.rep('d', 6 + 7 * qn + k), ARGV[2])}
  local at = 7 + 7 * qn
  local pin, pout, pc = r[2], r[3], r[4]
  local split, si, so, sc = q[2], q[3], q[4], q[5]
  local B = spend_lib()
  local spend = B.load(KEYS[3])
  for j = 0, rn - 1 do
    local c = 5 + per * j
    local p, u, ws0, e0, charged_b = r[c], r[c + 1], r[c + 2], 0, r[c + 3]
    if per == 5 then e0, charged_b = r[c + 3], r[c + 4] end
    for i = 0, qn - 1 do
      local o = 6 + 7 * i
      if q[o] == p and q[o + 1] == u then
        local ws, we = B.window(now, q[o + 3], q[o + 4], q[o + 5], q[o + 6])
        -- The charged window, in the epoch charged (not reset since).
        local same = ws == ws0 and B.epoch(spend, p, ws, u) == e0
        if actual < 0 then
          if same then B.add(spend, p, ws, we, u, -charged_b) end
        else
          local real
          if u == 0 then
            real = actual
          elseif pin < 0 then
            real = MAX_SCALED
          elseif split == 1 then
            real = B.price_cost(si, pin, so, pout, sc, pc)
          else
            real = B.price_cost(actual, math.max(pin, pout), 0, 0, 0, 0)
          end
          if same then real = real - charged_b end
          local was = B.peak(spend, p, ws, u)
          B.add(spend, p, ws, we, u, real)
          crossed = crossed + B.crossed(p, was, B.peak(spend, p, ws, u),
            B.limit(spend, p, ws, u, q[o + 2]), q, at, k)
        end
        break
      end
    end
  end
  B.save(KEYS[3], spend, now)
end
return struct.pack('<ddddd', SETTLE_APPLIED, floor_div(level, period), delta, now, crossed)
