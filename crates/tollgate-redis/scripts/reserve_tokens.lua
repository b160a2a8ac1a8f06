-- reserve_tokens: count a model call against the run's cap and reserve its
-- estimated tokens (SPEC §2), in one step.
-- KEYS[1] token bucket and usage, packed  {prefix}:tok2:{user} (tok_load in prelude.lua)
-- KEYS[2] invocation hash    {prefix}:inv:{user}:<invocation>
--         {c = calls, e = logical expiry, o<n> = tokens charged by open reservation n}
-- KEYS[3] run index zset     {prefix}:invs:{user}  (member invocation, score expiry;
--         a dropped run's key is built from ARGV[3]: it is in the same slot)
-- KEYS[4] spend, packed      {prefix}:bud:{user}  (spend_load in prelude.lua)
-- ARGV[1] eleven little-endian doubles (struct 'd', each an integer within
--   2^53, so exact; no text to parse): now override (0: Redis TIME),
--   amount, period_ms, capacity scaled, estimate (tokens), max wait ms, max
--   llm calls, shadow (0/1), exceeds capacity (0/1, computed exactly by the
--   caller), reservation retention ms, most runs tracked per user: past it
--   the least recently active run's record is dropped
-- ARGV[2] the invocation id (escaped, as in KEYS[2])
-- ARGV[3] the prefix of invocation keys ({prefix}:inv:{user}:), for eviction
-- ARGV[4] the request id ('' for none): the invocation hash keeps
--         r<id> = "<call>:<ready_at>" for each granted reserve that named one
--         ("0:0": superseded by reconcile)
-- ARGV[5] the budgets ('' for none), little-endian doubles: n, the price
--         (input, output, cached input per million tokens; -1: none), then
--         per budget: period (0 daily, 1 weekly, 2 monthly), unit (0 tokens,
--         1 micro-units), limit, current window start, end, next window
--         start, end, this reserve's charge; then k, the number of alert
--         thresholds, and the k percents. A window's limit is the budget's
--         plus its top-ups. A grant charges each budget in the window the
--         store clock picks and keeps b<call> = n, the price, then per
--         budget period, unit, window start, the window's epoch (its
--         resets), charge in the invocation hash (zero charges and epochs
--         for a shadow reservation).
-- Returns little-endian doubles (a string is far cheaper for Redis to
-- answer than a table):
--         1, call, wait_ms, now, crossed   granted ('<ddddd'; crossed: the
--         alert thresholds the charge crossed, bit 8 * period + i)
--      or 0, code, retry_after_ms, shadow call (0: none)   denied ('<dddd'):
--         code 3 max_llm_calls, 4 token_rate (retryable), 5 exceeds capacity,
--         6 + period a budget spent (retryable at its window's end), 9 +
--         period a charge past a budget's whole limit (then retry_after_ms
--         is that limit, top-ups included)
--      or 2, 0, 0, 0   the request id was superseded
--      or 3, call, wait_ms, 0   a repeat of the request id's grant
local o, amount, period, cap, estimate, max_wait, max_calls, shadow, exceeds, retention,
  max_runs = struct.unpack('<ddddddddddd', ARGV[1])
local now = now_ms(o)
local inv_id, rid = ARGV[2], ARGV[4]

local v = redis.call('HMGET', KEYS[2], 'c', 'e')
local calls, live = 0, false
if v[1] and tonumber(v[2]) > now then
  calls, live = tonumber(v[1]), true
  if rid ~= '' then
    local r = redis.call('HGET', KEYS[2], 'r' .. rid)
    if r then
      local sep = string.find(r, ':', 1, true)
      local first, ready = tonumber(string.sub(r, 1, sep - 1)), tonumber(string.sub(r, sep + 1))
      if first == 0 then return struct.pack('<dddd', SUPERSEDED, 0, 0, 0) end
      local left = ready - now
      if left < 0 then left = 0 end
      return struct.pack('<dddd', REPEATED, first, left, 0)
    end
  end
elseif v[1] then
  redis.call('DEL', KEYS[2])
end
if calls >= max_calls and shadow == 0 then
  return struct.pack('<dddd', DENIED, RESERVE_MAX_CALLS, 0, 0)
end

local function record_call(charged, wait, brec)
  local exp = now + retention
  track_run(KEYS[3], ARGV[3], inv_id, not live, now, retention, max_runs)
  live = true
  calls = calls + 1
  if wait and rid ~= '' then
    redis.call('HSET', KEYS[2], 'c', calls, 'e', exp, 'o' .. calls, charged,
      'r' .. rid, calls .. ':' .. (now + wait))
  else
    redis.call('HSET', KEYS[2], 'c', calls, 'e', exp, 'o' .. calls, charged)
  end
  if brec then redis.call('HSET', KEYS[2], 'b' .. calls, brec) end
  redis.call('PEXPIRE', KEYS[2], retention)
  return calls
end

local level, ts, _, old_period, um, uc, up = tok_load(KEYS[1], now, cap, period)
level, ts = refill(level, ts, now, amount, cap, old_period, period)
local outcome, x, after = take(level, estimate * period, max_wait, amount, exceeds)

-- Budgets (tollgate-core/src/spend.rs, Spend::decide): a charge past a
-- whole limit refuses for good (the first such budget); one past what is
-- left refuses until its window ends (the latest end of several).
local bud, spend, b_code, b_hint, B = nil, nil, 0, 0, nil
if ARGV[5] ~= '' then
  B = spend_lib()
  local n = struct.unpack('<d', ARGV[5])
  local k = struct.unpack('<d', ARGV[5], 1 + 8 * (4 + 8 * n))
  bud = {struct.unpack('<' .. string.rep('d', 5 + 8 * n + k), ARGV[5])}
  spend = B.load(KEYS[4])
  for i = 0, n - 1 do
    local o = 5 + 8 * i
    local p, u, ch = bud[o], bud[o + 1], bud[o + 7]
    local ws, we = B.window(now, bud[o + 3], bud[o + 4], bud[o + 5], bud[o + 6])
    local limit = B.limit(spend, p, ws, u, bud[o + 2])
    if ch > limit then
      b_code, b_hint = RESERVE_BUDGET_EXCEEDS + p, limit
      break
    end
    if B.of(spend, p, ws, u) + ch > limit then
      local h = we - now
      if h < 1 then h = 1 end
      if b_code == 0 or h > b_hint then b_code, b_hint = RESERVE_BUDGET + p, h end
    end
  end
end

-- The budget record of a reservation (its charges, or zero ones). Made
-- only when the request names budgets: a top-level local function's
-- closure would be made on every call.
local bud_record = nil
if bud then
  bud_record = function(zero)
    local out = {bud[1], bud[2], bud[3], bud[4]}
    for i = 0, bud[1] - 1 do
      local o = 5 + 8 * i
      local ws = B.window(now, bud[o + 3], bud[o + 4], bud[o + 5], bud[o + 6])
      local ch, e = bud[o + 7], B.epoch(spend, bud[o], ws, bud[o + 1])
      if zero then ch, e = 0, 0 end
      out[#out + 1], out[#out + 2], out[#out + 3] = bud[o], bud[o + 1], ws
      out[#out + 1], out[#out + 2] = e, ch
    end
    return struct.pack('<' .. string.rep('d', #out), unpack(out))
  end
end

-- Which refusal is reported (reserve.rs, first_denial): the run's cap,
-- then a charge that can never fit (the token bucket's first), then the
-- later retry hint of the token bucket and the budgets (a tie: budget).
local code, hint = 0, 0
if calls >= max_calls then code = RESERVE_MAX_CALLS
elseif outcome == TAKE_EXCEEDS then code = RESERVE_EXCEEDS
elseif b_code >= RESERVE_BUDGET_EXCEEDS then code, hint = b_code, b_hint
elseif outcome == TAKE_REFUSED and (b_code == 0 or x > b_hint) then code, hint = RESERVE_TOKEN_RATE, x
elseif b_code ~= 0 then code, hint = b_code, b_hint end

if code == 0 then
  um, uc, up = usage_roll(um, uc, up, now, estimate)
  tok_save(KEYS[1], after, ts, now, amount, cap, period, um, uc, up)
  local brec, crossed = nil, 0
  if bud then
    local n = bud[1]
    local at, k = 6 + 8 * n, bud[5 + 8 * n]
    for i = 0, n - 1 do
      local o = 5 + 8 * i
      local p, u = bud[o], bud[o + 1]
      local ws, we = B.window(now, bud[o + 3], bud[o + 4], bud[o + 5], bud[o + 6])
      local was = B.peak(spend, p, ws, u)
      B.add(spend, p, ws, we, u, bud[o + 7])
      crossed = crossed + B.crossed(p, was, B.peak(spend, p, ws, u),
        B.limit(spend, p, ws, u, bud[o + 2]), bud, at, k)
    end
    B.save(KEYS[4], spend, now)
    brec = bud_record(false)
  end
  return struct.pack('<ddddd', GRANTED, record_call(estimate, x, brec), x, now, crossed)
end
-- Denied: take nothing; keep the refilled level.
tok_save(KEYS[1], level, ts, now, amount, cap, period, um, uc, up)
local call = 0
if shadow == 1 then
  local brec = nil
  if bud then brec = bud_record(true) end
  call = record_call(0, nil, brec)
end
return struct.pack('<dddd', DENIED, code, hint, call)
