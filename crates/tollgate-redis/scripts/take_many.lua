-- take_many: take from several buckets and check a cooldown, all or nothing;
-- the wait is the largest (SPEC §5). A key named twice is taken twice, in order.
-- KEYS[1..n]  bucket hashes (in Cluster they must share one hash tag)
-- KEYS[n+1]   cooldown string (only if ARGV[3] = 1): the cooldown's end, ms
-- ARGV[1] now override   ARGV[2] n   ARGV[3] has cooldown (0/1)
-- ARGV[4] cooldown max wait ms
-- then per bucket i, six values from ARGV[5 + 6*(i-1)]:
--   amount, period_ms, capacity scaled, cost, max wait ms, exceeds (0/1)
-- Returns {1, wait_ms} | {2, index (1-based; 0 = the cooldown), retry_after_ms}
--       | {3, index (1-based)}
local now = now_ms(ARGV[1])
local n, has_cd, cd_wait = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])

if n == 1 and has_cd == 0 then
  -- One bucket and no cooldown (an Envoy descriptor, a provider quota): the
  -- rules below without the tables they keep for several keys. Granted or
  -- not, the bucket is saved: taken from, or only refilled (a missing one
  -- full at now, under this take's spec).
  local amount, period, cap = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
  local key = KEYS[1]
  local level, ts, _, old_period = bucket_load(key, now, cap, period)
  level, ts = refill(level, ts, now, amount, cap, old_period, period)
  local outcome, x, after = take(level, tonumber(ARGV[8]) * period, tonumber(ARGV[9]),
    amount, tonumber(ARGV[10]))
  bucket_save(key, after, ts, now, amount, cap, period)
  if outcome == 1 then return {1, x} end
  if outcome == 2 then return {2, 1, x} end
  return {3, 1}
end

local orig = {}   -- key -> {level, ts, period, existed} as loaded
local cur = {}    -- key -> {level, ts} after the takes so far
local spec = {}
local wait, refused_i, refused_h, exceeds_i = 0, nil, nil, nil
for i = 1, n do
  local b = 5 + 6 * (i - 1)
  local amount, period, cap = tonumber(ARGV[b]), tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
  local cost, max_wait, exceeds = tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5])
  local key = KEYS[i]
  spec[i] = {amount, cap, period}
  local level, ts, old_period
  if cur[key] then
    level, ts, old_period = cur[key][1], cur[key][2], cur[key][3]
  else
    local existed
    level, ts, existed, old_period = bucket_load(key, now, cap, period)
    orig[key] = {level, ts, old_period, existed}
  end
  level, ts = refill(level, ts, now, amount, cap, old_period, period)
  local outcome, x, after = take(level, cost * period, max_wait, amount, exceeds)
  if outcome == 1 then
    if x > wait then wait = x end
    cur[key] = {after, ts, period}
  else
    cur[key] = {level, ts, period}
    if outcome == 2 then
      if not refused_h or x > refused_h then refused_i, refused_h = i, x end
    elseif not exceeds_i then
      exceeds_i = i
    end
  end
end

if has_cd == 1 then
  local untl = tonumber(redis.call('GET', KEYS[n + 1])) or 0
  local remaining = untl - now
  if remaining < 0 then remaining = 0 end
  if remaining > cd_wait then
    local h = remaining - cd_wait
    if not refused_h or h > refused_h then refused_i, refused_h = 0, h end
  elseif remaining > wait then
    wait = remaining
  end
end

local granted = not exceeds_i and not refused_h
for i = 1, n do
  local key = KEYS[i]
  local amount, cap, period = spec[i][1], spec[i][2], spec[i][3]
  local st
  if granted then
    st = cur[key]
  else
    -- Refused: each key as if untouched, refilled to now; a missing one is
    -- full under this take's spec (not the first take's, rescaled).
    local o = orig[key]
    if o[4] then
      local l, t = refill(o[1], o[2], now, amount, cap, o[3], period)
      st = {l, t}
    else
      st = {cap, now}
    end
  end
  bucket_save(key, st[1], st[2], now, amount, cap, period)
end
if exceeds_i then return {3, exceeds_i} end
if refused_h then return {2, refused_i, refused_h} end
return {1, wait}
