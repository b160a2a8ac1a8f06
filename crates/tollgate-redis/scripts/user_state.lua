-- user_state: one user's buckets refilled to now, live leases and the
-- tokens of the last minute (read only).
-- KEYS[1] turn bucket  KEYS[2] token bucket  KEYS[3] run lease zset  KEYS[4] usage hash
-- ARGV[1] now override   ARGV[2..4] turn amount, period_ms, capacity scaled
-- ARGV[5..7] token amount, period_ms, capacity scaled
-- Returns {turns_available, tokens_available, tokens_last_minute, id1, exp1, id2, exp2, ...}
local now = now_ms(ARGV[1])
local function avail(key, amount, period, cap)
  local level, ts, _, old_period = bucket_load(key, now, cap, period)
  level = refill(level, ts, now, amount, cap, old_period, period)
  return floor_div(level, period)
end
local turns = avail(KEYS[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]))
local tokens = avail(KEYS[2], tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]))
local u = redis.call('HMGET', KEYS[4], 'm', 'c', 'p')
local last = 0
if u[1] then
  local m = math.floor(now / 60000)
  local om, c, p = tonumber(u[1]), tonumber(u[2]), tonumber(u[3])
  if om ~= m then
    if om == m - 1 then p = c else p = 0 end
    c = 0
  end
  last = c + floor_div(p * (60000 - (now % 60000)), 60000)
end
local out = {turns, tokens, last}
local leases = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. now, '+inf', 'WITHSCORES')
for i = 1, #leases do out[#out + 1] = leases[i] end
return out
