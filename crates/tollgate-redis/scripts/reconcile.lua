-- reconcile: charge what a fallback decided for one user during an outage
-- (SPEC §6), in one step on the user's keys.
-- KEYS[1] turn bucket string {prefix}:turn2:{user} (bucket_load in prelude.lua)
-- KEYS[2] token bucket and usage, packed  {prefix}:tok2:{user} (tok_load in prelude.lua)
-- KEYS[3] run lease zset     {prefix}:lease:{user}
-- KEYS[4] run index zset     {prefix}:invs:{user}
-- KEYS[5] batches hash       {prefix}:rec:{user}  (replica tag -> last batch applied)
-- KEYS[6] spend, packed      {prefix}:bud:{user}  (spend_lib in prelude.lua)
-- ARGV[1] now override   ARGV[2..4] turn amount, period, capacity scaled
-- ARGV[5..7] token amount, period, capacity scaled
-- ARGV[8] turns taken   ARGV[9] net tokens   ARGV[10] reservation retention ms
-- ARGV[11] most runs tracked per user   ARGV[12] prefix of invocation keys
-- ARGV[13] the replica's tag   ARGV[14] the batch number: a batch at or below
--          the last one applied from that replica charges nothing (a retry)
-- ARGV[15] n ambiguous reserves, then n pairs (escaped invocation id,
--          request id), then m ambiguous admissions, then m invocation ids,
--          then the fallback's budget charges ('' for none): little-endian
--          doubles k, then per charge period, unit, window start, end and
--          the net amount, added to each window that has not ended.
-- An ambiguous reserve this store ran (its r<id> names an open call) is
-- refunded (its budget charges given back to windows still held) and its
-- id marked superseded ("0:0"); one it did not run is
-- marked superseded, so a late copy takes nothing. An ambiguous admission
-- whose run holds a live lease here was charged its turn here.
-- Returns {turns charged, tokens charged (net), reserves refunded, now}.
local now = now_ms(ARGV[1])
local t_amount, t_period, t_cap = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local k_amount, k_period, k_cap = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local turns, tokens = tonumber(ARGV[8]), tonumber(ARGV[9])
local retention, max_runs, prefix = tonumber(ARGV[10]), tonumber(ARGV[11]), ARGV[12]

local replica, batch = ARGV[13], tonumber(ARGV[14])
local last = tonumber(redis.call('HGET', KEYS[5], replica))
if last and batch <= last then return {0, 0, 0, now} end
redis.call('HSET', KEYS[5], replica, batch)
redis.call('PEXPIRE', KEYS[5], retention)

local n = tonumber(ARGV[15])
local i = 16
local refunded, given_back = 0, 0
local B, spend = nil, nil
local function spend_now()
  if not B then
    B = spend_lib()
    spend = B.load(KEYS[6])
  end
  return spend
end
for _ = 1, n do
  local inv_id, rid = ARGV[i], ARGV[i + 1]
  i = i + 2
  local key = prefix .. inv_id
  local v = redis.call('HMGET', key, 'c', 'e', 'r' .. rid)
  local live = v[1] and tonumber(v[2]) > now
  if v[1] and not live then redis.call('DEL', key) end
  local calls = 0
  if live then calls = tonumber(v[1]) end
  if live and v[3] then
    local sep = string.find(v[3], ':', 1, true)
    local call = tonumber(string.sub(v[3], 1, sep - 1))
    if call > 0 then
      local got = redis.call('HMGET', key, 'o' .. call, 'b' .. call)
      local charged, brec = got[1], got[2]
      if charged then
        if brec then
          -- Spend.give_back: each charge leaves the window it went to, if
          -- that window is still the one held.
          local s = spend_now()
          local rn = struct.unpack('<d', brec)
          local per = 5
          if #brec == 8 * (4 + 4 * rn) then per = 4 end
          local r = {struct.unpack('<' .. string.rep('d', 4 + per * rn), brec)}
          for j = 0, rn - 1 do
            local c = 5 + per * j
            local p, u, ws0, e0, ch = r[c], r[c + 1], r[c + 2], 0, r[c + 3]
            if per == 5 then e0, ch = r[c + 3], r[c + 4] end
            if B.is(s, p, ws0, u) and B.epoch(s, p, ws0, u) == e0 then
              local a = s[p * 7 + 4] - ch
              if a < 0 then a = 0 end
              s[p * 7 + 4] = a
            end
          end
        end
        redis.call('HDEL', key, 'o' .. call, 'b' .. call)
        given_back = given_back + tonumber(charged)
        refunded = refunded + 1
      end
    end
  end
  track_run(KEYS[4], prefix, inv_id, not live, now, retention, max_runs)
  redis.call('HSET', key, 'c', calls, 'e', now + retention, 'r' .. rid, '0:0')
  redis.call('PEXPIRE', key, retention)
end

local m = tonumber(ARGV[i])
i = i + 1
for _ = 1, m do
  local exp = redis.call('ZSCORE', KEYS[3], ARGV[i])
  i = i + 1
  if exp and tonumber(exp) > now and turns > 0 then turns = turns - 1 end
end

if ARGV[i] ~= '' then
  local s = spend_now()
  local k = struct.unpack('<d', ARGV[i])
  local q = {struct.unpack('<' .. string.rep('d', 1 + 5 * k), ARGV[i])}
  for j = 0, k - 1 do
    local o = 2 + 5 * j
    if q[o + 3] > now then B.add(s, q[o], q[o + 2], q[o + 3], q[o + 1], q[o + 4]) end
  end
end
if spend then B.save(KEYS[6], spend, now) end

if turns > 0 then
  bucket_adjust(KEYS[1], now, t_amount, t_period, t_cap, turns)
end
tokens = tokens - given_back
if tokens ~= 0 then
  -- bucket_adjust, and the usage in the same key (tok_load in prelude.lua).
  local level, ts, _, old_period, um, uc, up = tok_load(KEYS[2], now, k_cap, k_period)
  level, ts = refill(level, ts, now, k_amount, k_cap, old_period, k_period)
  level = level - tokens * k_period
  if level > k_cap then level = k_cap end
  if level < -MAX_SCALED then level = -MAX_SCALED end
  um, uc, up = usage_roll(um, uc, up, now, tokens)
  tok_save(KEYS[2], level, ts, now, k_amount, k_cap, k_period, um, uc, up)
end
return {turns, tokens, refunded, now}
