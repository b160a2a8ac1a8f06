-- release_run: remove one invocation's run lease, by id only.
-- KEYS[1] run lease zset {prefix}:lease:{user}
-- ARGV[1] now override (0: Redis TIME)   ARGV[2] invocation id
-- Returns 1 if it held a live lease, else 0.
local now = now_ms(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZREM', KEYS[1], ARGV[2])
