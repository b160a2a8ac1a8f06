-- tollgate: helpers prepended to every script (see src/scripts.rs).
--
-- Numbers are Lua doubles: integers are exact up to 2^53. Bucket levels are
-- kept scaled by the period (token*ms) exactly as in tollgate-core, and the
-- config validation keeps every scaled value within 2^53. Divisions go
-- through ceil_div/floor_div, which correct the rounded quotient with its
-- exact remainder, so they agree with Rust's integer division.

local EXPIRY_GRACE_MS = 60000
local MAX_SCALED = 9007199254740992 -- 2^53

-- ARGV[1] of every script: 0 to use Redis TIME, else the caller's clock (ms;
-- used by the conformance suite to drive Redis with a fake clock).
local function now_ms(override)
  local o = tonumber(override)
  if o and o > 0 then return o end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function floor_div(a, b)
  local q = math.floor(a / b)
  local r = a - q * b
  while r < 0 do q = q - 1; r = r + b end
  while r >= b do q = q + 1; r = r - b end
  return q
end

local function ceil_div(a, b)
  local q = floor_div(a, b)
  if q * b < a then q = q + 1 end
  return q
end

-- A bucket (a user's turn bucket, a named bucket) is one string of four
-- little-endian doubles, struct.pack('<dddd', level (scaled), ts, logical
-- expiry, period the level is scaled by): one GET and one SET ... PX, and
-- no number parsed from text. Every stored number is an integer within
-- +-2^53 (MAX_SCALED, rule 6's expiry well below), so doubles hold them
-- exactly. Missing or logically expired state is a full bucket at `now`
-- (rule 1). (Before, a hash {l, t, e, p} under another key name:
-- docs/spec.md §6.)
local function bucket_load(key, now, cap, period)
  local v = redis.call('GET', key)
  if v and #v == 32 then
    local l, t, e, p = struct.unpack('<dddd', v)
    if e > now then return l, t, true, p end
  end
  return cap, now, false, period
end

-- Rule 2: refill by elapsed time, capped; a clock stepping back never
-- refills twice (ts only moves forward). A level scaled by another period
-- (a reloaded plan) is first rescaled in whole tokens, toward less credit.
local function refill(level, ts, now, amount, cap, old_period, period)
  if old_period ~= period and old_period > 0 then
    level = floor_div(level, old_period) * period
    if level < -MAX_SCALED then level = -MAX_SCALED end
  end
  if now > ts then
    local elapsed = now - ts
    if elapsed >= ceil_div(cap - level, amount) then
      level = cap
    else
      level = level + elapsed * amount
    end
    ts = now
  end
  if level > cap then level = cap end
  return level, ts
end

-- Rule 6: the key may go once the bucket is full again, plus a minute.
local function bucket_expiry(level, now, amount, cap)
  local to_full = ceil_div(cap - level, amount)
  if to_full < 0 then to_full = 0 end
  return now + to_full + EXPIRY_GRACE_MS
end

local function bucket_save(key, level, ts, now, amount, cap, period)
  local exp = bucket_expiry(level, now, amount, cap)
  redis.call('SET', key, struct.pack('<dddd', level, ts, exp, period), 'PX', exp - now)
end

-- Rules 3-5 on a refilled level. Returns outcome, new level:
-- outcome TAKE_GRANTED (x = wait), TAKE_REFUSED (x = retry hint) or
-- TAKE_EXCEEDS (src/codes.rs).
-- `exceeds` is computed exactly in Rust (costs may be past 2^53).
local function take(level, cost_scaled, max_wait, amount, exceeds)
  if exceeds == 1 then return TAKE_EXCEEDS, 0, level end
  local after = level - cost_scaled
  local wait = 0
  if after < 0 then wait = ceil_div(-after, amount) end
  if wait > max_wait then
    local hint = wait - max_wait
    if hint < 1 then hint = 1 end
    return TAKE_REFUSED, hint, level
  end
  if after < -MAX_SCALED then after = -MAX_SCALED end
  return TAKE_GRANTED, wait, after
end

-- One bucket taken once (take_one, a one-bucket take_many): bucket_load,
-- refill, take and bucket_save fused, the same rules and arithmetic (each
-- ceil_div written out), without the calls and the closures those helpers
-- cost per call (Redis runs the script's whole text each call: about a
-- sixth of take_one's instructions, measured with callgrind). Saves the
-- bucket taken from, or refused and only refilled if `save_refused` or it
-- existed. Returns outcome, x, level after, as take does.
local function take_now(key, now, amount, period, cap, cost_scaled, max_wait, exceeds, save_refused)
  local level, ts, existed = cap, now, false
  local v = redis.call('GET', key)
  if v and #v == 32 then
    local l, t, e, p = struct.unpack('<dddd', v)
    if e > now then
      level, ts, existed = l, t, true
      if p ~= period and p > 0 then
        level = floor_div(l, p) * period
        if level < -MAX_SCALED then level = -MAX_SCALED end
      end
    end
  end
  if now > ts then
    local q = floor_div(cap - level, amount)
    if q * amount < cap - level then q = q + 1 end
    if now - ts >= q then
      level = cap
    else
      level = level + (now - ts) * amount
    end
    ts = now
  end
  if level > cap then level = cap end
  local outcome, x, after = TAKE_EXCEEDS, 0, level
  if exceeds ~= 1 then
    after = level - cost_scaled
    if after < 0 then
      x = floor_div(-after, amount)
      if x * amount < -after then x = x + 1 end
    end
    if x > max_wait then
      outcome, x, after = TAKE_REFUSED, x - max_wait, level
      if x < 1 then x = 1 end
    else
      outcome = TAKE_GRANTED
      if after < -MAX_SCALED then after = -MAX_SCALED end
    end
  end
  if outcome == TAKE_GRANTED or existed or save_refused then
    local to_full = floor_div(cap - after, amount)
    if to_full * amount < cap - after then to_full = to_full + 1 end
    if to_full < 0 then to_full = 0 end
    local exp = now + to_full + EXPIRY_GRACE_MS
    redis.call('SET', key, struct.pack('<dddd', after, ts, exp, period), 'PX', exp - now)
  end
  return outcome, x, after
end

-- A user's token bucket and tokens charged per minute (for the
-- sliding-minute estimate) share one key, so a reserve or settle reads and
-- writes one key once: a string of seven little-endian doubles,
-- struct.pack('<ddddddd', level (scaled), ts, bucket expiry, period, um, uc,
-- up), the bucket as bucket_load keeps it and the usage triple {um =
-- minute (-1: none yet), uc = its tokens, up = the minute before's}. One
-- GET and one SET ... PX, no field names, no number parsed from text; every
-- stored number is an integer within +-2^53, exact in a double. (Before, a
-- hash {l, t, e, p, um, uc, up} under {prefix}:tok:{user}, which user_state
-- still reads for the usage of replicas before this layout: docs/spec.md
-- §6.) Answers level, ts, live, the level's period, um (nil: none), uc, up.
local function tok_load(key, now, cap, period)
  local v = redis.call('GET', key)
  if v and #v == 56 then
    local l, t, e, p, um, uc, up = struct.unpack('<ddddddd', v)
    if um < 0 then um = nil end
    if e > now then return l, t, true, p, um, uc, up end
    return cap, now, false, period, um, uc, up
  end
  return cap, now, false, period, nil, 0, 0
end

-- Adds `tokens` to the minute of `now` of a usage triple (minute, current,
-- previous; a nil minute: none yet), rolled over first if its minute has
-- passed. Answers the new triple. (Numbers in and out, no table: every
-- table a script makes is garbage Redis's Lua must collect.)
local function usage_roll(om, c, p, now, tokens)
  local m = math.floor(now / 60000)
  if om ~= m then
    if om == m - 1 then p = c else p = 0 end
    c = 0
  end
  return m, c + tokens, p
end

-- Saves the token bucket with the usage triple (m, c, p; m nil: none). The
-- key lives as long as either part needs: the bucket to its expiry (rule
-- 6), the usage to the end of the minute after its minute m.
local function tok_save(key, level, ts, now, amount, cap, period, m, c, p)
  local exp = bucket_expiry(level, now, amount, cap)
  local keep = exp
  if m and (m + 2) * 60000 > keep then keep = (m + 2) * 60000 end
  redis.call('SET', key, struct.pack('<ddddddd', level, ts, exp, period, m or -1, c, p),
    'PX', keep - now)
end

-- A run record is (re)touched in the user's run index (a zset: member the
-- escaped invocation id, score its record's expiry). A new record keeps at
-- most `max_runs` per user: the least recently active run's record (key
-- `inv_prefix .. member`, same slot) is dropped first.
local function track_run(index, inv_prefix, inv_id, is_new, now, retention, max_runs)
  if is_new then
    redis.call('ZREMRANGEBYSCORE', index, '-inf', now)
    if redis.call('ZCARD', index) >= max_runs then
      local oldest = redis.call('ZRANGE', index, 0, 0)
      redis.call('ZREM', index, oldest[1])
      redis.call('DEL', inv_prefix .. oldest[1])
    end
  end
  redis.call('ZADD', index, now + retention, inv_id)
  redis.call('PEXPIRE', index, retention)
end

-- Adjusts a bucket by a signed delta of whole units (positive takes),
-- never refusing: level = min(cap, level - delta) (SPEC §2 settle), debt
-- bounded by MAX_SCALED. Answers the new level.
local function bucket_adjust(key, now, amount, period, cap, delta)
  local level, ts, _, old_period = bucket_load(key, now, cap, period)
  level, ts = refill(level, ts, now, amount, cap, old_period, period)
  level = level - delta * period
  if level > cap then level = cap end
  if level < -MAX_SCALED then level = -MAX_SCALED end
  bucket_save(key, level, ts, now, amount, cap, period)
  return level
end

-- Spend budgets (tollgate-core/src/spend.rs restated), as one
-- helper that answers a table of functions: Redis runs a script's whole
-- text on every call, making each top-level helper's closure anew, so the
-- budget helpers cost a call nothing until a request names budgets.
-- A user's spend is one packed string {prefix}:bud:{user} of twelve
-- little-endian doubles, four per period (daily, weekly, monthly): window
-- start, window end, unit (0 tokens, 1 micro-units), amount spent; a start
-- of 0: nothing spent in that period yet.
local function spend_lib()
  local S = {}
  --
  -- The 21 numbers of the spend at `key`, as a table: per period (daily,
  -- weekly, monthly) window start, end, unit, amount, granted (its
  -- top-ups), peak (the most spent) and epoch (its resets). A value of an
  -- earlier layout reads as no resets (18 numbers) and also as no
  -- top-ups and a peak equal to the amount (12 numbers).
  function S.load(key)
    local v = redis.call('GET', key)
    if v and #v == 168 then return {struct.unpack('<' .. string.rep('d', 21), v)} end
    local o, per = nil, 0
    if v and #v == 144 then o, per = {struct.unpack('<' .. string.rep('d', 18), v)}, 6 end
    if v and #v == 96 then o, per = {struct.unpack('<' .. string.rep('d', 12), v)}, 4 end
    local s = {}
    for p = 0, 2 do
      local b = p * per
      if o then
        local g, k = 0, o[b + 4]
        if per == 6 then g, k = o[b + 5], o[b + 6] end
        s[#s + 1], s[#s + 2], s[#s + 3], s[#s + 4] = o[b + 1], o[b + 2], o[b + 3], o[b + 4]
        s[#s + 1], s[#s + 2], s[#s + 3] = g, k, 0
      else
        for _ = 1, 7 do s[#s + 1] = 0 end
      end
    end
    return s
  end
  --
  -- Saves the spend; the key lives to the end of its latest window plus a
  -- minute (EXPIRY_GRACE_MS), as the memory store keeps it.
  function S.save(key, s, now)
    local keep = math.max(s[2], s[9], s[16]) + EXPIRY_GRACE_MS
    if keep <= now then
      redis.call('DEL', key)
      return
    end
    redis.call('SET', key, struct.pack('<' .. string.rep('d', 21), unpack(s, 1, 21)), 'PX',
      keep - now)
  end
  --
  -- The window a check charges at `now` (its current one until its end,
  -- then the next): start, end.
  function S.window(now, cs, ce, ns, ne)
    if now >= ce then return ns, ne end
    return cs, ce
  end
  --
  -- Whether period p (0-based) holds the window starting at ws in unit u.
  function S.is(s, p, ws, u)
    local b = p * 7
    return s[b + 1] == ws and s[b + 3] == u
  end
  --
  -- Spent in period p in the window starting at ws, in unit u.
  function S.of(s, p, ws, u)
    if S.is(s, p, ws, u) then return s[p * 7 + 4] end
    return 0
  end
  --
  -- Period p's peak in that window (0: not seen).
  function S.peak(s, p, ws, u)
    if S.is(s, p, ws, u) then return s[p * 7 + 6] end
    return 0
  end
  --
  -- Period p's epoch in that window (its resets; 0: not seen).
  function S.epoch(s, p, ws, u)
    if S.is(s, p, ws, u) then return s[p * 7 + 7] end
    return 0
  end
  --
  -- A budget's limit in that window: `limit` plus its top-ups, at most 2^53.
  function S.limit(s, p, ws, u, limit)
    local l = limit
    if S.is(s, p, ws, u) then l = l + s[p * 7 + 5] end
    if l > MAX_SCALED then l = MAX_SCALED end
    return l
  end
  --
  -- Adds delta to period p's spend in window [ws, we) of unit u (a window
  -- or unit not seen yet starts from 0), kept within 0..2^53; the peak
  -- follows, the top-ups and the epoch stay.
  function S.add(s, p, ws, we, u, delta)
    local b = p * 7
    local a, g, k, e = delta, 0, 0, 0
    if S.is(s, p, ws, u) then a, g, k, e = s[b + 4] + delta, s[b + 5], s[b + 6], s[b + 7] end
    if a < 0 then a = 0 end
    if a > MAX_SCALED then a = MAX_SCALED end
    if a > k then k = a end
    s[b + 1], s[b + 2], s[b + 3], s[b + 4], s[b + 5], s[b + 6], s[b + 7] = ws, we, u, a, g, k, e
  end
  --
  -- The alert thresholds crossed by raising period p's peak from `was` to
  -- `is` against `limit`, as bits 8p + i (spend.rs, Spend::crossed): the
  -- i-th of the k percents at q[at + i], threshold ceil(limit * pct / 100),
  -- exact for a limit up to 2^53.
  function S.crossed(p, was, is, limit, q, at, k)
    local bits = 0
    if is <= was then return 0 end
    local lq = floor_div(limit, 100)
    local lr = limit - lq * 100
    for i = 0, k - 1 do
      local pct = q[at + i]
      local t = lq * pct + ceil_div(lr * pct, 100)
      if was < t and t <= is then bits = bits + 2 ^ (8 * p + i) end
    end
    return bits
  end
  --
  -- The cost of up to three (tokens, price per million) terms in
  -- micro-units, rounded up once, at most 2^53 (money.rs's ceil_cost, then
  -- the cap of spend.rs). Exact: each factor is split in limbs of 10^6, so
  -- every product stays within 2^53. Token counts come clamped to 2^53.
  function S.price_cost(t1, p1, t2, p2, t3, p3)
    local whole, frac = 0, 0
    for _, tp in ipairs({{t1, p1}, {t2, p2}, {t3, p3}}) do
      local t, p = tp[1], tp[2]
      local th, ph = floor_div(t, 1000000), floor_div(p, 1000000)
      local tl, pl = t - th * 1000000, p - ph * 1000000
      if th * ph > MAX_SCALED / 1000000 then return MAX_SCALED end
      whole = whole + th * ph * 1000000 + th * pl + tl * ph
      frac = frac + tl * pl
      if whole > MAX_SCALED then return MAX_SCALED end
    end
    local c = whole + ceil_div(frac, 1000000)
    if c > MAX_SCALED then c = MAX_SCALED end
    return c
  end
  --
  return S
end
