-- extend_cooldown: until = max(existing, new) (SPEC §5).
-- KEYS[1] cooldown string (its value is the cooldown's end, ms)
-- ARGV[1] now override   ARGV[2] until ms
-- Returns the cooldown's end after the change.
local now = now_ms(ARGV[1])
local cur = tonumber(redis.call('GET', KEYS[1])) or 0
if cur <= now then cur = 0 end
local untl = tonumber(ARGV[2])
if cur > untl then untl = cur end
if untl > now then
  redis.call('SET', KEYS[1], untl, 'PX', untl - now)
else
  redis.call('DEL', KEYS[1])
end
return untl
