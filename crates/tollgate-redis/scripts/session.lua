-- session: session lease acquire / renew / release, fence check, fenced
-- append, record deletion, and the grouped writes that also write logs of
-- the session's group (SPEC §4). One script; ARGV[2] picks the op.
-- KEYS[1] lease hash    {prefix}:sl:{tag}…
--         {h = holder, x = holder expiry, f = latest fence, e = retention end}
-- KEYS[2] records list  {prefix}:sr:{tag}…
-- KEYS[3] event ids set {prefix}:si:{tag}… (ids appended by 'event')
-- KEYS[4], KEYS[5], … the grouped ops' logs: lease hash and records list of
--         each, in pairs, all in the session's slot (one group's tag)
-- ARGV[1] now override   ARGV[2] op   ARGV[3] retention ms   ARGV[4] grace ms
-- op 'acquire' ARGV[5] holder ARGV[6] ttl -> {1, fence, expires_at} | {0, retry_after_ms}
-- op 'renew'   ARGV[5] holder ARGV[6] ttl -> {1, fence, expires_at} | {0}
-- op 'release' ARGV[5] holder            -> {1} | {0}
-- op 'check'   ARGV[5] fence             -> {current (0/1), latest}
-- op 'append'  ARGV[5] fence ARGV[6] record -> {1, index} | {0, latest}
-- op 'read'    ARGV[5] from ARGV[6] limit  -> records
-- op 'delete'                            -> {count}
-- Grouped ops; each log's write is two ARGVs from `L`: a flag ('1': append
-- the next ARGV; '0': only refresh its retention) and the record ('').
-- op 'create'  ARGV[5] record, L = 6     -> {1, fence} | {2} exists | {3, retry_after_ms} busy
-- op 'event'   ARGV[5] fence ARGV[6] has id (0/1) ARGV[7] id ARGV[8] record, L = 9
--                                        -> {1, index} | {0, latest} stale | {4} missing | {2} repeated
-- op 'drop'    L = 5                     -> {count} (logs written only if count > 0)
-- The fence counter never resets while the session exists. A session with
-- records is kept `retention` past its last activity; one without (a lease
-- and its fence only) until its lease's end, or its last activity if later,
-- plus `grace` (at most the retention; the caller passes it so). The end
-- never moves back, and never before the lease's end. A log is a session
-- like any other: the same rules keep it.
local now = now_ms(ARGV[1])
local op, retention, grace = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])

-- The state of the session at kl (lease hash), kr (records) and ki (event
-- ids, or nil): missing or past retention, a fresh one (its keys deleted).
local function load(kl, kr, ki)
  local v = redis.call('HMGET', kl, 'h', 'x', 'f', 'e')
  local s = {kl = kl, kr = kr, ki = ki, holder = v[1], hexp = tonumber(v[2]),
             fence = tonumber(v[3]) or 0, rexp = tonumber(v[4]) or 0}
  if s.rexp <= now then
    if v[3] or v[4] then
      redis.call('DEL', kl, kr)
      if ki then redis.call('DEL', ki) end
    end
    s.holder, s.hexp, s.fence, s.rexp = nil, nil, 0, 0
  end
  s.live = s.holder and s.hexp and s.hexp > now
  return s
end

local function touch(s)
  local nrec = redis.call('LLEN', s.kr)
  if s.fence == 0 and nrec == 0 then
    -- Nothing to keep, unless a record gave it an end (a log whose records
    -- were deleted): that end never moves back, and is not pushed out.
    if s.rexp <= now then redis.call('DEL', s.kl) end
    return
  end
  local e
  if nrec > 0 then
    e = now + retention
  else
    e = now
    if s.holder and s.hexp and s.hexp > e then e = s.hexp end
    e = e + grace
  end
  if s.rexp > e then e = s.rexp end
  if s.holder and s.hexp and s.hexp > e then e = s.hexp end
  redis.call('HSET', s.kl, 'f', s.fence, 'e', e)
  redis.call('PEXPIRE', s.kl, e - now)
  if nrec > 0 then redis.call('PEXPIRE', s.kr, e - now) end
  if s.ki then redis.call('PEXPIRE', s.ki, e - now) end
end

local s = load(KEYS[1], KEYS[2], KEYS[3])

if op == 'check' then
  local f = tonumber(ARGV[5])
  if s.fence ~= 0 and f == s.fence then return {1, s.fence} end
  return {0, s.fence}
elseif op == 'read' then
  if s.fence == 0 and s.rexp == 0 then return {} end
  local from, limit = tonumber(ARGV[5]), tonumber(ARGV[6])
  if limit <= 0 then return {} end
  return redis.call('LRANGE', KEYS[2], from, from + limit - 1)
end

-- The logs of a grouped op, loaded before anything is written.
local logs = {}
for i = 4, #KEYS - 1, 2 do
  logs[#logs + 1] = load(KEYS[i], KEYS[i + 1], nil)
end

-- Writes every log (records from ARGV[first]) and refreshes it.
local function write_logs(first)
  for i, l in ipairs(logs) do
    local a = first + 2 * (i - 1)
    if ARGV[a] == '1' then redis.call('RPUSH', l.kr, ARGV[a + 1]) end
    touch(l)
  end
end

-- Mutating ops: every one refreshes the retention of an existing session,
-- whatever its answer (as the in-memory store does).
local out
if op == 'acquire' then
  local h, exp = ARGV[5], now + tonumber(ARGV[6])
  if s.live and s.holder ~= h then
    local r = s.hexp - now
    if r < 1 then r = 1 end
    out = {0, r}
  else
    if s.live then
      if s.hexp > exp then exp = s.hexp end
    else
      s.fence = s.fence + 1
    end
    s.holder, s.hexp = h, exp
    redis.call('HSET', KEYS[1], 'h', h, 'x', exp)
    out = {1, s.fence, exp}
  end
elseif op == 'renew' then
  if s.live and s.holder == ARGV[5] then
    local exp = now + tonumber(ARGV[6])
    if exp > s.hexp then s.hexp = exp end
    redis.call('HSET', KEYS[1], 'x', s.hexp)
    out = {1, s.fence, s.hexp}
  else
    out = {0}
  end
elseif op == 'release' then
  if s.live and s.holder == ARGV[5] then
    s.holder, s.hexp = nil, nil
    redis.call('HDEL', KEYS[1], 'h', 'x')
    out = {1}
  else
    out = {0}
  end
elseif op == 'append' then
  local f = tonumber(ARGV[5])
  if s.fence == 0 or f ~= s.fence then
    out = {0, s.fence}
  else
    local len = redis.call('RPUSH', KEYS[2], ARGV[6])
    out = {1, len - 1}
  end
elseif op == 'delete' then
  local n = redis.call('LLEN', KEYS[2])
  redis.call('DEL', KEYS[2], KEYS[3])
  out = {n}
elseif op == 'create' then
  if s.live then
    local r = s.hexp - now
    if r < 1 then r = 1 end
    out = {3, r}
  elseif redis.call('LLEN', KEYS[2]) > 0 then
    out = {2}
  else
    -- A number of its own, held by no one: earlier holders are stale.
    s.fence = s.fence + 1
    s.holder, s.hexp = nil, nil
    redis.call('HDEL', KEYS[1], 'h', 'x')
    redis.call('RPUSH', KEYS[2], ARGV[5])
    write_logs(6)
    out = {1, s.fence}
  end
elseif op == 'event' then
  local f = tonumber(ARGV[5])
  local has_id = ARGV[6] == '1'
  if s.fence == 0 or f ~= s.fence then
    out = {0, s.fence}
  elseif redis.call('LLEN', KEYS[2]) == 0 then
    out = {4}
  elseif has_id and redis.call('SISMEMBER', KEYS[3], ARGV[7]) == 1 then
    out = {2}
  else
    local len = redis.call('RPUSH', KEYS[2], ARGV[8])
    if has_id then redis.call('SADD', KEYS[3], ARGV[7]) end
    write_logs(9)
    out = {1, len - 1}
  end
elseif op == 'drop' then
  local n = redis.call('LLEN', KEYS[2])
  redis.call('DEL', KEYS[2], KEYS[3])
  if n > 0 then write_logs(5) end
  out = {n}
else
  return redis.error_reply('tollgate: unknown session op ' .. tostring(op))
end
touch(s)
return out
