-- clear_provider: clear a provider key's cooldown and AIMD state in one step
-- (SPEC §5); its buckets are left alone.
-- KEYS[1] cooldown string (as extend_cooldown.lua)
-- KEYS[2] AIMD hash (as aimd.lua); both keys share the provider key's hash tag
-- ARGV[1] now override   ARGV[2] step permille   ARGV[3] increase interval ms
-- Returns {the cooldown's end (0: none was live), the effective rate just
-- before, permille (1000 = full)}, read as extend_cooldown.lua and aimd.lua
-- read them.
local FULL = 1000
local now = now_ms(ARGV[1])
local step, inc = tonumber(ARGV[2]), tonumber(ARGV[3])
local cd = tonumber(redis.call('GET', KEYS[1])) or 0
if cd <= now then cd = 0 end
local eff = FULL
local v = redis.call('HMGET', KEYS[2], 'p', 'a')
if v[1] then
  local p, a = tonumber(v[1]), tonumber(v[2])
  if p < FULL then
    local elapsed = now - a
    if elapsed < 0 then elapsed = 0 end
    eff = p + floor_div(elapsed, inc) * step
    if eff > FULL then eff = FULL end
  end
end
redis.call('DEL', KEYS[1], KEYS[2])
return {cd, eff}
