-- take_many: take from several buckets and check a cooldown, all or nothing;
-- the wait is the largest (SPEC §5). A key named twice is taken twice, in order.
-- (One bucket with no cooldown goes to take_one.lua instead: no tables.)
-- KEYS[1..n]  bucket strings (bucket_load in prelude.lua; in Cluster they must
--             share one hash tag)
-- KEYS[n+1]   cooldown string (only if it has one): the cooldown's end, ms
-- ARGV[1] little-endian doubles (struct 'd'; no text to parse), each an
--   integer within 2^53, so exact: now override (0: Redis TIME), n, has
--   cooldown (0/1), cooldown max wait ms; then per bucket i, six from byte
--   33 + 48*(i-1): amount, period_ms, capacity scaled, cost, max wait ms,
--   exceeds (0/1)
-- Returns three little-endian doubles (struct '<ddd': a string is far
-- cheaper for Redis to answer than a table): 1, wait_ms, 0
-- | 2, index (1-based; 0 = the cooldown), retry_after_ms | 3, index, 0
local o, n, has_cd, cd_wait = struct.unpack('<dddd', ARGV[1])
local now = now_ms(o)

local orig = {}   -- key -> {level, ts, period, existed} as loaded
local cur = {}    -- key -> {level, ts} after the takes so far
local spec = {}
local wait, refused_i, refused_h, exceeds_i = 0, nil, nil, nil
for i = 1, n do
  local amount, period, cap, cost, max_wait, exceeds =
    struct.unpack('<dddddd', ARGV[1], 33 + 48 * (i - 1))
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
  if outcome == TAKE_GRANTED then
    if x > wait then wait = x end
    cur[key] = {after, ts, period}
  else
    cur[key] = {level, ts, period}
    if outcome == TAKE_REFUSED then
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
if exceeds_i then return struct.pack('<ddd', TAKE_EXCEEDS, exceeds_i, 0) end
if refused_h then return struct.pack('<ddd', TAKE_REFUSED, refused_i, refused_h) end
return struct.pack('<ddd', TAKE_GRANTED, wait, 0)
