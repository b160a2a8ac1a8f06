-- claim_session: count a session among its user's live sessions (SPEC §4),
-- before the session operation itself (which runs in the session's slot).
-- KEYS[1] claims zset  {prefix}:sess:{user}  (member session id, score the claim's end)
-- ARGV[1] now override   ARGV[2] session id   ARGV[3] hold ms (the claim
--         lasts until now + hold at least; computed by the caller)
-- ARGV[4] most live claims   ARGV[5] create (1: add a missing claim; 0: only extend)
-- Returns {1, sessions} claimed (new or extended)
--      or {2, sessions} not claimed (create = 0 and no claim)
--      or {0, retry_after_ms} the user has ARGV[4] live claims already
local now = now_ms(ARGV[1])
local member, hold = ARGV[2], tonumber(ARGV[3])
local cap, create = tonumber(ARGV[4]), tonumber(ARGV[5])
local untl = now + hold

redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local n = redis.call('ZCARD', KEYS[1])
local score = redis.call('ZSCORE', KEYS[1], member)
local out
if score then
  if tonumber(score) < untl then redis.call('ZADD', KEYS[1], untl, member) end
  out = {1, n}
elseif create == 0 then
  out = {2, n}
elseif n >= cap then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  local r = hold
  if first[2] then r = tonumber(first[2]) - now end
  if r < 1 then r = 1 end
  return {0, r}
else
  redis.call('ZADD', KEYS[1], untl, member)
  out = {1, n + 1}
end
-- The set expires with its latest claim.
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if last[2] then
  redis.call('PEXPIRE', KEYS[1], tonumber(last[2]) - now)
end
return out
