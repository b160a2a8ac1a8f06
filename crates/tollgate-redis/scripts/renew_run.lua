-- renew_run: push the expiry of a live lease (never shorten it); a gone lease
-- is never re-added.
-- KEYS[1] run lease zset {prefix}:lease:{user}
-- ARGV[1] now override (0: Redis TIME)   ARGV[2] invocation id   ARGV[3] ttl ms
-- Returns the new expiry, or -1 if the lease is lost.
local now = now_ms(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local held = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[2]))
if not held then return -1 end
local exp = now + tonumber(ARGV[3])
if held > exp then exp = held end
redis.call('ZADD', KEYS[1], exp, ARGV[2])
-- Only ever extended (GT), as admit_turn does: the set exists (it holds
-- this lease) and its TTL already covers every other lease.
redis.call('PEXPIRE', KEYS[1], exp - now, 'GT')
return exp
