-- user_state: one user's buckets refilled to now, live leases and the
-- tokens of the last minute (read only).
-- KEYS[1] turn bucket  KEYS[2] token bucket and tokens per minute, packed
-- (tok_load in prelude.lua)  KEYS[3] run lease zset  KEYS[4] the token hash
-- of replicas before the packed layout ({..., um, uc, up}: its usage is
-- added, so a rolling upgrade counts both; docs/spec.md §6)
-- ARGV[1] now override   ARGV[2..4] turn amount, period_ms, capacity scaled
-- ARGV[5..7] token amount, period_ms, capacity scaled
-- Returns {turns_available, tokens_available, tokens_last_minute, id1, exp1, id2, exp2, ...}
local now = now_ms(ARGV[1])
local turns
do
  local amount, period, cap = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
  local level, ts, _, old_period = bucket_load(KEYS[1], now, cap, period)
  level = refill(level, ts, now, amount, cap, old_period, period)
  turns = floor_div(level, period)
end
local amount, period, cap = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local level, ts, _, old_period, um, uc, up = tok_load(KEYS[2], now, cap, period)
level = refill(level, ts, now, amount, cap, old_period, period)
local tokens = floor_div(level, period)
-- The sliding-minute estimate of a usage triple (minute, current, previous).
local function last_minute(om, c, p)
  if not om then return 0 end
  local _, cur, prev = usage_roll(om, c, p, now, 0)
  return cur + floor_div(prev * (60000 - (now % 60000)), 60000)
end
local old = redis.call('HMGET', KEYS[4], 'um', 'uc', 'up')
local last = last_minute(um, uc, up)
  + last_minute(tonumber(old[1]), tonumber(old[2]) or 0, tonumber(old[3]) or 0)
local out = {turns, tokens, last}
local leases = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. now, '+inf', 'WITHSCORES')
for i = 1, #leases do out[#out + 1] = leases[i] end
return out
