-- reset_user: clear a user's buckets (full again); leases and reservations stay.
-- KEYS[1] turn bucket  KEYS[2] token bucket
-- ARGV[1] now override
-- Returns 1 if a live bucket was cleared, else 0.
local now = now_ms(ARGV[1])
local had = 0
for i = 1, 2 do
  local e = tonumber(redis.call('HGET', KEYS[i], 'e'))
  if e and e > now then had = 1 end
end
redis.call('DEL', KEYS[1])
-- The token hash also keeps the tokens per minute (tok_load in prelude.lua):
-- only its bucket goes.
redis.call('HDEL', KEYS[2], 'l', 't', 'e', 'p')
return had
