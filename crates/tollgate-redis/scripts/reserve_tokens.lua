-- reserve_tokens: count a model call against the run's cap and reserve its
-- estimated tokens (SPEC §2), in one step.
-- KEYS[1] token bucket and usage, packed  {prefix}:tok2:{user} (tok_load in prelude.lua)
-- KEYS[2] invocation hash    {prefix}:inv:{user}:<invocation>
--         {c = calls, e = logical expiry, o<n> = tokens charged by open reservation n}
-- KEYS[3] run index zset     {prefix}:invs:{user}  (member invocation, score expiry;
--         a dropped run's key is built from ARGV[3]: it is in the same slot)
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
-- Returns four little-endian doubles (struct '<dddd': a string is far
-- cheaper for Redis to answer than a table):
--         1, call, wait_ms, now   granted
--      or 0, code, retry_after_ms, shadow call (0: none)   denied:
--         code 3 max_llm_calls, 4 token_rate (retryable), 5 exceeds capacity
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
      if first == 0 then return struct.pack('<dddd', 2, 0, 0, 0) end
      local left = ready - now
      if left < 0 then left = 0 end
      return struct.pack('<dddd', 3, first, left, 0)
    end
  end
elseif v[1] then
  redis.call('DEL', KEYS[2])
end
if calls >= max_calls and shadow == 0 then
  return struct.pack('<dddd', 0, 3, 0, 0)
end

local function record_call(charged, wait)
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
  redis.call('PEXPIRE', KEYS[2], retention)
  return calls
end

local level, ts, _, old_period, um, uc, up = tok_load(KEYS[1], now, cap, period)
level, ts = refill(level, ts, now, amount, cap, old_period, period)
local outcome, x, after = take(level, estimate * period, max_wait, amount, exceeds)
local code = 0
if calls >= max_calls then code = 3
elseif outcome == 2 then code = 4
elseif outcome == 3 then code = 5 end

if code == 0 then
  um, uc, up = usage_roll(um, uc, up, now, estimate)
  tok_save(KEYS[1], after, ts, now, amount, cap, period, um, uc, up)
  return struct.pack('<dddd', 1, record_call(estimate, x), x, now)
end
-- Denied: take nothing; keep the refilled level.
tok_save(KEYS[1], level, ts, now, amount, cap, period, um, uc, up)
local hint = 0
if code == 4 then hint = x end
local call = 0
if shadow == 1 then call = record_call(0, nil) end
return struct.pack('<dddd', 0, code, hint, call)
