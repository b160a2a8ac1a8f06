package dev.tollgate.adk;

import dev.tollgate.client.testing.RedisServer;
import dev.tollgate.client.testing.Sidecar;
import org.junit.jupiter.api.AfterAll;

/** {@link PluginContract} on a Redis node the suite starts. */
class RedisPluginTest extends PluginContract {
  private RedisServer redis;

  @Override
  protected Sidecar start() {
    redis = RedisServer.start();
    return Sidecar.start("", OVERRIDES + Sidecar.redisStore(redis, "fail_closed"));
  }

  @AfterAll
  void stopRedis() {
    if (redis != null) {
      redis.close();
    }
  }
}
