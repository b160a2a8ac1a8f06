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
--   exceeds: 1 exceeds at its max wait, 2 only without a wait, 0 fits;
--   then, with a cooldown, its max ms (byte 33 + 48n): a stored end past
--   now + max counts as now + max
-- With ARGV[2] (take_many_fair: fair sharing, SPEC §5, core's fair.rs
-- restated): ARGV[2] packs doubles amount, period_ms, capacity (the pool's
-- requests rate as effective now), window_ms, the weights' version (a hash
-- of the configured names and weights), nw, then nw weights; ARGV[3] is
-- the tenant (free of NUL: fair.rs `held_name`), ARGV[3+j] the name of
-- weight j; KEYS[#KEYS] the key's fair state, one string: '<dddddd' v,
-- at, nt, the weights' version it holds, when it expires (ms; as the memory
-- store's), when its key does (the TTL last set), then per tenant 'sdddd'
-- its name, weight, finish, seen ms, queued (0/1). It is
-- read by one unpack and written by one pack from one flat table, and the
-- weights are looked up only when the version changed or a tenant is new:
-- in Redis's Lua a table, a C call or a loop over the names per tenant
-- costs more than everything else here (callgrind).
-- Returns three little-endian doubles (struct '<ddd': a string is far
-- cheaper for Redis to answer than a table): 1, wait_ms, 0
-- | 2, index (1-based; 0 = the cooldown), retry_after_ms | 3, index, 0
local o, n, has_cd, cd_wait = struct.unpack('<dddd', ARGV[1])
local now = now_ms(o)

-- The fair gate, decided before any bucket (nothing here is taken).
-- s: v, at, nt, version, expiry, key expiry, then tenant i's name,
-- weight, finish, seen, queued at s[b..b+4], b = 5i + 2. fi: the b of the
-- permit's entry.
local immediate, s, fi, fkey, fexp, fmt, g_fin, r_fin, r_q = false, nil, 0
if ARGV[2] then
  local fa = ARGV[2]
  local famount, fperiod, fcap, window, ver, nw = struct.unpack('<dddddd', fa)
  fkey = KEYS[#KEYS]
  local raw = redis.call('GET', fkey)
  if raw then
    fmt = '<dddddd' .. string.rep('sdddd', struct.unpack('<d', raw, 17))
    s = {struct.unpack(fmt, raw)}
    s[5 * s[3] + 7] = nil
    -- Past its expiry the state is forgotten (the key itself may live on
    -- a little: its TTL is renewed only now and then, below).
    if s[5] <= now then s = {0, 0, 0, ver, 0, s[6]} end
  else
    s = {0, 0, 0, ver, 0, 0}
  end
  local nt = s[3]
  local last = 5 * nt + 2
  if s[4] ~= ver then
    -- The weights were reloaded: each held tenant's weight anew.
    for b = 7, last, 5 do
      local name, wi = s[b], 1
      for j = 1, nw do
        if ARGV[3 + j] == name then wi = struct.unpack('<d', fa, 41 + 8 * j); break end
      end
      s[b + 1] = wi
    end
    s[4] = ver
  end
  -- Advance the clock to now (fair.rs `advance`) and, in the same passes,
  -- forget the idle (moving the kept down) and sum what the gate needs as
  -- if the permit is accounted under its own tenant (again below in the
  -- rare case it is not: the table is full). A pass is made again only
  -- when the clock passes a finish tag: otherwise no tag lies between the
  -- clock before and after, so the sums hold for both. (An entry dropped
  -- at an earlier clock would be dropped at the later one too.)
  local v, at = s[1], s[2]
  local dt = now - at
  if dt < 0 then dt = 0 end
  if now > at then at = now end
  local since = now - window
  if since < 0 then since = 0 end
  local tenant = ARGV[3]
  local c, me, ahead, active, others, others_ahead
  local n_in = last
  while true do
    local nxt
    c, me, ahead, active, others, others_ahead = 2, nil, 0, 0, false, false
    for b = 7, n_in, 5 do
      local f, seen = s[b + 2], s[b + 3]
      if seen >= since or f > v then
        c = c + 5
        local name, wi = s[b], s[b + 1]
        if c < b then
          s[c], s[c + 1], s[c + 2], s[c + 3], s[c + 4] = name, wi, f, seen, s[b + 4]
        end
        if f > v then
          ahead = ahead + wi
          if not nxt or f < nxt then nxt = f end
        end
        if name == tenant then
          me = c
        elseif seen >= since then
          others = true
          active = active + wi
          if f > v then others_ahead = true end
        end
      end
    end
    n_in = c
    if ahead == 0 then
      v = 0
      for b = 9, c + 2, 5 do s[b] = 0; s[b + 2] = 0 end
      break
    end
    if dt <= 0 then break end
    local need = math.ceil((nxt - v) * ahead / 1000)
    if need > dt then
      v = v + math.floor(dt * 1000 / ahead)
      break
    end
    v = nxt
    dt = dt - need
  end
  local all_ahead = ahead
  for i = c + 5, last + 4 do s[i] = nil end
  if me then
    fi = me
  else
    local entry, wt = tenant, nil
    for j = 1, nw do
      if ARGV[3 + j] == tenant then wt = struct.unpack('<d', fa, 41 + 8 * j); break end
    end
    if not wt and c >= 322 then
      -- Full (64 tenants): an unconfigured tenant joins '{others}'.
      entry = '{others}'
      active, others, others_ahead = 0, false, false
      for b = 7, c, 5 do
        if s[b] == entry then
          me = b
        elseif s[b + 3] >= since then
          others = true
          active = active + s[b + 1]
          if s[b + 2] > v then others_ahead = true end
        end
      end
    end
    if me then
      fi = me
    else
      c = c + 5
      fi = c
      s[fi], s[fi + 1], s[fi + 2], s[fi + 4] = entry, wt or 1, 0, 0
    end
  end
  if c ~= last then fmt = '<dddddd' .. string.rep('sdddd', (c - 2) / 5) end
  -- The state expires window + 60 s after its last write, as in memory;
  -- the key's TTL is set (PX) only when it would end before that, to 30 s
  -- past it (a SET with PX costs Redis more than one with KEEPTTL).
  s[1], s[2], s[3], s[5] = v, at, (c - 2) / 5, now + window + 60000
  fexp = nil
  if s[6] < s[5] then
    fexp = window + 90000
    s[6] = now + fexp
  end
  local wt, mfin, mq = s[fi + 1], s[fi + 2], s[fi + 4]
  local cost = math.floor((fperiod * 1000) / (famount * wt))
  if cost < 1 then cost = 1 end
  local join = others and mfin <= v
  r_fin, r_q = mfin, 0
  if join then r_fin = v + cost end
  if join or (mq == 1 and mfin > v) then r_q = 1 end
  local start = v
  if others then
    if mq == 1 then mfin = mfin - cost end
    if mfin > v then start = mfin end
  end
  g_fin = start + cost
  if others then
    active = active + wt
    local lead = start - v
    local burst = math.floor((fcap * fperiod * 1000) / (famount * active))
    if lead <= cost then
      immediate = false
    elseif lead <= cost + burst or not others_ahead then
      immediate = true
    else
      if all_ahead < 1 then all_ahead = 1 end
      local h = math.ceil(((lead - cost) * all_ahead) / 1000)
      if h < 1 then h = 1 end
      s[fi + 2], s[fi + 3], s[fi + 4] = r_fin, now, r_q
      if fexp then
        redis.call('SET', fkey, struct.pack(fmt, unpack(s)), 'PX', fexp)
      else
        redis.call('SET', fkey, struct.pack(fmt, unpack(s)), 'KEEPTTL')
      end
      return struct.pack('<ddd', TAKE_REFUSED, 1, h)
    end
  end
end

if immediate then cd_wait = 0 end

local orig = {}   -- key -> {level, ts, period, existed} as loaded
local cur = {}    -- key -> {level, ts} after the takes so far
local spec = {}
local wait, refused_i, refused_h, exceeds_i = 0, nil, nil, nil
for i = 1, n do
  local amount, period, cap, cost, max_wait, exceeds =
    struct.unpack('<dddddd', ARGV[1], 33 + 48 * (i - 1))
  if immediate then
    max_wait = 0
    if exceeds == 2 then exceeds = 1 end
  end
  if exceeds ~= 1 then exceeds = 0 end
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
  local cd_max = struct.unpack('<d', ARGV[1], 33 + 48 * n)
  if remaining > cd_max then remaining = cd_max end
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
if s then
  if granted then
    s[fi + 2], s[fi + 3], s[fi + 4] = g_fin, now, 0
  else
    s[fi + 2], s[fi + 3], s[fi + 4] = r_fin, now, r_q
  end
  if fexp then
    redis.call('SET', fkey, struct.pack(fmt, unpack(s)), 'PX', fexp)
  else
    redis.call('SET', fkey, struct.pack(fmt, unpack(s)), 'KEEPTTL')
  end
end
if exceeds_i then return struct.pack('<ddd', TAKE_EXCEEDS, exceeds_i, 0) end
if refused_h then return struct.pack('<ddd', TAKE_REFUSED, refused_i, refused_h) end
return struct.pack('<ddd', TAKE_GRANTED, wait, 0)
