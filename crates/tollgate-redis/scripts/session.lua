-- session: session lease acquire / renew / release, fence check, fenced
-- append and record deletion (SPEC §4). One script; ARGV[2] picks the op.
-- KEYS[1] lease hash    {prefix}:sl:{session}
--         {h = holder, x = holder expiry, f = latest fence, e = retention end}
-- KEYS[2] records list  {prefix}:sr:{session}
-- ARGV[1] now override   ARGV[2] op   ARGV[3] retention ms   ARGV[4] grace ms
-- op 'acquire' ARGV[5] holder ARGV[6] ttl -> {1, fence, expires_at} | {0, retry_after_ms}
-- op 'renew'   ARGV[5] holder ARGV[6] ttl -> {1, fence, expires_at} | {0}
-- op 'release' ARGV[5] holder            -> {1} | {0}
-- op 'check'   ARGV[5] fence             -> {current (0/1), latest}
-- op 'append'  ARGV[5] fence ARGV[6] record -> {1, index} | {0, latest}
-- op 'read'    ARGV[5] from ARGV[6] limit  -> records
-- op 'delete'                            -> {count}
-- The fence counter never resets while the session exists. A session with
-- records is kept `retention` past its last activity; one without (a lease
-- and its fence only) until its lease's end, or its last activity if later,
-- plus `grace` (at most the retention; the caller passes it so). The end
-- never moves back, and never before the lease's end.
local now = now_ms(ARGV[1])
local op, retention, grace = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])

local v = redis.call('HMGET', KEYS[1], 'h', 'x', 'f', 'e')
local holder, hexp, fence, rexp = v[1], tonumber(v[2]), tonumber(v[3]) or 0, tonumber(v[4]) or 0
if rexp <= now then
  -- Missing or past retention: a fresh session.
  if v[3] or v[4] then redis.call('DEL', KEYS[1], KEYS[2]) end
  holder, hexp, fence, rexp = nil, nil, 0, 0
end
local live = holder and hexp and hexp > now

local function touch()
  local nrec = redis.call('LLEN', KEYS[2])
  if fence == 0 and nrec == 0 then
    redis.call('DEL', KEYS[1])
    return
  end
  local e
  if nrec > 0 then
    e = now + retention
  else
    e = now
    if holder and hexp and hexp > e then e = hexp end
    e = e + grace
  end
  if rexp > e then e = rexp end
  if holder and hexp and hexp > e then e = hexp end
  redis.call('HSET', KEYS[1], 'f', fence, 'e', e)
  redis.call('PEXPIRE', KEYS[1], e - now)
  if nrec > 0 then redis.call('PEXPIRE', KEYS[2], e - now) end
end

if op == 'check' then
  local f = tonumber(ARGV[5])
  if fence ~= 0 and f == fence then return {1, fence} end
  return {0, fence}
elseif op == 'read' then
  if fence == 0 and rexp == 0 then return {} end
  local from, limit = tonumber(ARGV[5]), tonumber(ARGV[6])
  if limit <= 0 then return {} end
  return redis.call('LRANGE', KEYS[2], from, from + limit - 1)
end

-- Mutating ops: every one refreshes the retention of an existing session,
-- whatever its answer (as the in-memory store does).
local out
if op == 'acquire' then
  local h, exp = ARGV[5], now + tonumber(ARGV[6])
  if live and holder ~= h then
    local r = hexp - now
    if r < 1 then r = 1 end
    out = {0, r}
  else
    if live then
      if hexp > exp then exp = hexp end
    else
      fence = fence + 1
    end
    holder, hexp = h, exp
    redis.call('HSET', KEYS[1], 'h', h, 'x', exp)
    out = {1, fence, exp}
  end
elseif op == 'renew' then
  if live and holder == ARGV[5] then
    local exp = now + tonumber(ARGV[6])
    if exp > hexp then hexp = exp end
    redis.call('HSET', KEYS[1], 'x', hexp)
    out = {1, fence, hexp}
  else
    out = {0}
  end
elseif op == 'release' then
  if live and holder == ARGV[5] then
    holder, hexp = nil, nil
    redis.call('HDEL', KEYS[1], 'h', 'x')
    out = {1}
  else
    out = {0}
  end
elseif op == 'append' then
  local f = tonumber(ARGV[5])
  if fence == 0 or f ~= fence then
    out = {0, fence}
  else
    local len = redis.call('RPUSH', KEYS[2], ARGV[6])
    out = {1, len - 1}
  end
elseif op == 'delete' then
  local n = redis.call('LLEN', KEYS[2])
  redis.call('DEL', KEYS[2])
  out = {n}
else
  return redis.error_reply('tollgate: unknown session op ' .. tostring(op))
end
touch()
return out
