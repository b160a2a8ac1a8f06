-- reset_user: clear a user's buckets (full again); leases and reservations stay.
-- KEYS[1] turn bucket (packed string: bucket_load in prelude.lua)
-- KEYS[2] token bucket and tokens per minute, packed (tok_load in prelude.lua)
-- ARGV[1] now override
-- Returns 1 if a live bucket was cleared, else 0.
local now = now_ms(ARGV[1])
local had = 0
local _, _, live = bucket_load(KEYS[1], now, 0, 0)
if live then had = 1 end
redis.call('DEL', KEYS[1])
-- The token key also keeps the tokens per minute: only its bucket goes
-- (its expiry set to 0: a full bucket), the usage and the key's TTL stay.
local v = redis.call('GET', KEYS[2])
if v and #v == 56 then
  local l, t, e, p, um, uc, up = struct.unpack('<ddddddd', v)
  if e > now then
    had = 1
    redis.call('SET', KEYS[2], struct.pack('<ddddddd', l, t, 0, p, um, uc, up), 'KEEPTTL')
  end
end
return had
