-- reset_user: clear a user's buckets (full again); leases and reservations stay.
-- KEYS[1] turn bucket (packed string: bucket_load in prelude.lua)
-- KEYS[2] token bucket hash
-- ARGV[1] now override
-- Returns 1 if a live bucket was cleared, else 0.
local now = now_ms(ARGV[1])
local had = 0
local _, _, live = bucket_load(KEYS[1], now, 0, 0)
if live then had = 1 end
local e = tonumber(redis.call('HGET', KEYS[2], 'e'))
if e and e > now then had = 1 end
redis.call('DEL', KEYS[1])
-- The token hash also keeps the tokens per minute (tok_load in prelude.lua):
-- only its bucket goes.
redis.call('HDEL', KEYS[2], 'l', 't', 'e', 'p')
return had
