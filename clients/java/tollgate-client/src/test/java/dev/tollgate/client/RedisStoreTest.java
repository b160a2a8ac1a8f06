package dev.tollgate.client;

import dev.tollgate.client.testing.RedisServer;
import dev.tollgate.client.testing.Sidecar;
import org.junit.jupiter.api.AfterAll;

/** {@link ClientContract} against a sidecar on a Redis node the suite starts. */
class RedisStoreTest extends ClientContract {
  private RedisServer redis;

  @Override
  protected Sidecar start() {
    redis = RedisServer.start();
    return Sidecar.start("", LIMITS + Sidecar.redisStore(redis, "fail_closed"));
  }

  @AfterAll
  void stopRedis() {
    if (redis != null) {
      redis.close();
    }
  }
}
