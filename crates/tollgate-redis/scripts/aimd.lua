-- aimd: a provider key's effective rate (SPEC §5), as tollgate_core::aimd.
-- KEYS[1] hash {p = permille at the anchor, a = anchor ms (last 429),
--               d = last halving ms}; missing: full rate, never halved
-- ARGV[1] now override   ARGV[2] floor permille   ARGV[3] step permille
-- ARGV[4] decrease interval ms   ARGV[5] increase interval ms
-- ARGV[6] 1: a per-minute 429 was seen now (halve at most once per
--         decrease interval, never below the floor; restart the increase
--         clock); 0: read
-- Returns the effective rate now, permille of configured (1000 = full).
-- The key expires when the rate is back at full, so idle keys cost nothing.
local FULL = 1000
local now = now_ms(ARGV[1])
local floor = tonumber(ARGV[2])
local step = tonumber(ARGV[3])
local dec = tonumber(ARGV[4])
local inc = tonumber(ARGV[5])
local v = redis.call('HMGET', KEYS[1], 'p', 'a', 'd')
local p, a, d, halved = FULL, 0, 0, false
if v[1] then
  p, a, d, halved = tonumber(v[1]), tonumber(v[2]), tonumber(v[3]), true
end

local function effective(perm, anchor)
  if perm >= FULL then return FULL end
  local elapsed = now - anchor
  if elapsed < 0 then elapsed = 0 end
  local e = perm + floor_div(elapsed, inc) * step
  if e > FULL then e = FULL end
  return e
end

local cur = effective(p, a)
if ARGV[6] ~= '1' then return cur end

if not halved or now >= d + dec then
  cur = floor_div(cur, 2)
  if cur < floor then cur = floor end
  d = now
end
redis.call('HSET', KEYS[1], 'p', cur, 'a', now, 'd', d)
local ttl = 1
if cur < FULL then ttl = ceil_div(FULL - cur, step) * inc end
redis.call('PEXPIRE', KEYS[1], ttl)
return cur
