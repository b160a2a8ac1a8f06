-- extend_cooldown: until = max(existing, now + for) on Redis's clock, an
-- existing end past now + max counting as now + max (SPEC §5).
-- KEYS[1] cooldown string (its value is the cooldown's end, ms)
-- ARGV[1] now override   ARGV[2] for ms   ARGV[3] max ms
-- Returns the cooldown's end after the change, 0 if none runs.
local now = now_ms(ARGV[1])
local cap = now + tonumber(ARGV[3])
local cur = tonumber(redis.call('GET', KEYS[1])) or 0
if cur <= now then cur = 0 end
if cur > cap then cur = cap end
local for_ms = tonumber(ARGV[2])
if for_ms > tonumber(ARGV[3]) then for_ms = tonumber(ARGV[3]) end
local untl = now + for_ms
if cur > untl then untl = cur end
if untl > now then
  redis.call('SET', KEYS[1], untl, 'PX', untl - now)
  return untl
end
redis.call('DEL', KEYS[1])
return 0
