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
--   exceeds: 1 exceeds at its max wait, 2 only without a wait, 0 fits
-- With ARGV[2] (take_many_fair: fair sharing, SPEC §5, core's fair.rs
-- restated): ARGV[2] packs doubles amount, period_ms, capacity (the pool's
-- requests rate as effective now), window_ms, nw, then nw weights; ARGV[3]
-- is the tenant, ARGV[3+j] the name of weight j; KEYS[#KEYS] the key's
-- fair state, one string: '<ddd' v, at, n, then per tenant '<d' the
-- length of its name, the name, '<ddd' finish, seen ms, queued.
-- Returns three little-endian doubles (struct '<ddd': a string is far
-- cheaper for Redis to answer than a table): 1, wait_ms, 0
-- | 2, index (1-based; 0 = the cooldown), retry_after_ms | 3, index, 0
local o, n, has_cd, cd_wait = struct.unpack('<dddd', ARGV[1])
local now = now_ms(o)

-- The fair gate, decided before any bucket (nothing here is taken).
local fair, immediate = nil, false
if ARGV[2] then
  local unit = 1000
  local famount, fperiod, fcap, window, nw = struct.unpack('<ddddd', ARGV[2])
  local weights = {}
  for j = 1, nw do
    weights[ARGV[3 + j]] = struct.unpack('<d', ARGV[2], 41 + 8 * (j - 1))
  end
  local fkey = KEYS[#KEYS]
  local v, at, ten, count = 0, 0, {}, 0
  local raw = redis.call('GET', fkey)
  if raw then
    local nt, pos
    v, at, nt, pos = struct.unpack('<ddd', raw)
    for _ = 1, nt do
      local name, fin, seen, q
      name, fin, seen, q, pos = struct.unpack('<dc0ddd', raw, pos)
      ten[name] = {fin, seen, q}
    end
  end
  -- Advance the clock to now (fair.rs `advance`).
  local dt = now - at
  if dt < 0 then dt = 0 end
  if now > at then at = now end
  while true do
    local ahead, nxt = 0, nil
    for name, e in pairs(ten) do
      if e[1] > v then
        ahead = ahead + (weights[name] or 1)
        if not nxt or e[1] < nxt then nxt = e[1] end
      end
    end
    if ahead == 0 then
      v = 0
      for _, e in pairs(ten) do e[1] = 0; e[3] = 0 end
      break
    end
    if dt <= 0 then break end
    local need = math.ceil((nxt - v) * ahead / unit)
    if need <= dt then
      v = nxt
      dt = dt - need
    else
      v = v + math.floor(dt * unit / ahead)
      break
    end
  end
  local since = now - window
  if since < 0 then since = 0 end
  -- One pass: forget the idle, and sum what the gate needs as if the permit
  -- is accounted under its own tenant (again below in the rare case it is
  -- not: the table is full).
  local tenant = ARGV[3]
  local all_ahead, active, others, others_ahead = 0, 0, false, false
  local function tally(entry)
    for name, e in pairs(ten) do
      if e[1] > v then all_ahead = all_ahead + (weights[name] or 1) end
      if name ~= entry and e[2] >= since then
        others = true
        active = active + (weights[name] or 1)
        if e[1] > v then others_ahead = true end
      end
    end
  end
  for name, e in pairs(ten) do
    if e[2] < since and e[1] <= v then
      ten[name] = nil
    else
      count = count + 1
      local wn = weights[name] or 1
      if e[1] > v then all_ahead = all_ahead + wn end
      if name ~= tenant and e[2] >= since then
        others = true
        active = active + wn
        if e[1] > v then others_ahead = true end
      end
    end
  end
  local entry = tenant
  if not (weights[tenant] or ten[tenant] or count < 64) then
    entry = '{others}'
    all_ahead, active, others, others_ahead = 0, 0, false, false
    tally(entry)
  end
  local w = weights[entry] or 1
  local cost = math.floor((fperiod * unit) / (famount * w))
  if cost < 1 then cost = 1 end
  local mine = ten[entry] or {0, 0, 0}
  local start
  if not others then start = v
  elseif mine[3] == 0 then start = math.max(mine[1], v)
  else start = math.max(math.max(mine[1] - cost, 0), v) end
  local closed = nil
  if others then
    active = active + w
    local lead = start - v
    local open = cost
    local burst = math.floor((fcap * fperiod * unit) / (famount * active))
    if lead <= open then
      immediate = false
    elseif lead <= open + burst or not others_ahead then
      immediate = true
    else
      local h = math.ceil(((lead - open) * math.max(all_ahead, 1)) / unit)
      if h < 1 then h = 1 end
      closed = h
    end
  end
  local join = others and mine[1] <= v
  local queued = 0
  if join or (mine[3] == 1 and mine[1] > v) then queued = 1 end
  fair = {key = fkey, v = v, at = at, ten = ten, entry = entry, window = window,
          granted = {start + cost, now, 0},
          refused = {join and (v + cost) or mine[1], now, queued}}
  if closed then
    fair.closed = closed
  end
end

local function fair_save(granted)
  local f = fair
  f.ten[f.entry] = granted and f.granted or f.refused
  local parts, nt = {''}, 0
  for name, e in pairs(f.ten) do
    nt = nt + 1
    parts[#parts + 1] = struct.pack('<dc0ddd', #name, name, e[1], e[2], e[3])
  end
  parts[1] = struct.pack('<ddd', f.v, f.at, nt)
  redis.call('SET', f.key, table.concat(parts), 'PX', f.window + 60000)
end

if fair and fair.closed then
  fair_save(false)
  return struct.pack('<ddd', TAKE_REFUSED, 1, fair.closed)
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
if fair then fair_save(granted) end
if exceeds_i then return struct.pack('<ddd', TAKE_EXCEEDS, exceeds_i, 0) end
if refused_h then return struct.pack('<ddd', TAKE_REFUSED, refused_i, refused_h) end
return struct.pack('<ddd', TAKE_GRANTED, wait, 0)
