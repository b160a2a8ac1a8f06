-- reserve_tokens: count a model call against the run's cap and reserve its
-- estimated tokens (SPEC §2), in one step.
-- KEYS[1] token bucket hash  {prefix}:tok:{user}
-- KEYS[2] invocation hash    {prefix}:inv:{user}:<invocation>
--         {c = calls, e = logical expiry, o<n> = tokens charged by open reservation n}
--         (it also keeps the user's tokens per minute: see tok_load in prelude.lua)
-- KEYS[3] run index zset     {prefix}:invs:{user}  (member invocation, score expiry):
--         past ARGV[11] runs the least recently active run's record is dropped
--         (its key is built from ARGV[13]; it is in the same slot).
-- ARGV[1] now override   ARGV[2] amount   ARGV[3] period_ms   ARGV[4] capacity scaled
-- ARGV[5] estimate (tokens)   ARGV[6] max wait ms   ARGV[7] max llm calls
-- ARGV[8] shadow (0/1)   ARGV[9] exceeds capacity (0/1, computed exactly by the caller)
-- ARGV[10] reservation retention ms   ARGV[11] most runs tracked per user
-- ARGV[12] the invocation id (escaped, as in KEYS[2])
-- ARGV[13] the prefix of invocation keys ({prefix}:inv:{user}:), for eviction
-- ARGV[14] the request id ('' for none): the invocation hash keeps
--         r<id> = "<call>:<ready_at>" for each granted reserve that named one
--         ("0:0": superseded by reconcile)
-- Returns {1, call, wait_ms, now}
--      or {0, code, retry_after_ms, shadow call (0: none)}
--         code 3 max_llm_calls, 4 token_rate (retryable), 5 exceeds capacity
--      or {2} the request id was superseded, {3, call, wait_ms} a repeat of it
local now = now_ms(ARGV[1])
local amount, period, cap = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local estimate, max_wait = tonumber(ARGV[5]), tonumber(ARGV[6])
local max_calls, shadow, exceeds = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local retention, max_runs = tonumber(ARGV[10]), tonumber(ARGV[11])
local inv_id, rid = ARGV[12], ARGV[14]

local v = redis.call('HMGET', KEYS[2], 'c', 'e')
local calls, live = 0, false
if v[1] and tonumber(v[2]) > now then
  calls, live = tonumber(v[1]), true
  if rid ~= '' then
    local r = redis.call('HGET', KEYS[2], 'r' .. rid)
    if r then
      local sep = string.find(r, ':', 1, true)
      local first, ready = tonumber(string.sub(r, 1, sep - 1)), tonumber(string.sub(r, sep + 1))
      if first == 0 then return {2} end
      local left = ready - now
      if left < 0 then left = 0 end
      return {3, first, left}
    end
  end
elseif v[1] then
  redis.call('DEL', KEYS[2])
end
if calls >= max_calls and shadow == 0 then
  return {0, 3, 0, 0}
end

local function record_call(charged, wait)
  local exp = now + retention
  track_run(KEYS[3], ARGV[13], inv_id, not live, now, retention, max_runs)
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

local level, ts, _, old_period, v_tok = tok_load(KEYS[1], now, cap, period)
level, ts = refill(level, ts, now, amount, cap, old_period, period)
local outcome, x, after = take(level, estimate * period, max_wait, amount, exceeds)
local code = 0
if calls >= max_calls then code = 3
elseif outcome == 2 then code = 4
elseif outcome == 3 then code = 5 end

if code == 0 then
  local um, uc, up = usage_of(v_tok)
  um, uc, up = usage_roll(um, uc, up, now, estimate)
  tok_save(KEYS[1], after, ts, now, amount, cap, period, um, uc, up)
  return {1, record_call(estimate, x), x, now}
end
-- Denied: take nothing; keep the refilled level.
tok_save(KEYS[1], level, ts, now, amount, cap, period, tonumber(v_tok[5]))
local hint = 0
if code == 4 then hint = x end
local call = 0
if shadow == 1 then call = record_call(0, nil) end
return {0, code, hint, call}
