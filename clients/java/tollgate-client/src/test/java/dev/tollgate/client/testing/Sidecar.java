package dev.tollgate.client.testing;

import dev.tollgate.client.RetryPolicy;
import dev.tollgate.client.TollgateClient;
import java.io.IOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.UUID;

/**
 * A real {@code tollgate serve} built from this repository, on a free port, with a config the test
 * writes: JWT identity (HS256, {@link Tokens}), the admin token, the suite's plans ({@link
 * #PLANS}) and whatever the test adds. The sidecar has no fake clock: the plans refill too slowly
 * (one token or turn an hour) for the machine's speed to change a count.
 */
public final class Sidecar implements AutoCloseable {

  /**
   * The suite's plans. {@code std} (the default) holds 50 turns and 100,000 tokens, refilling one
   * an hour each; the others change one thing each.
   */
  public static final String PLANS =
      """
      [plans.std]
      turns = { amount = 1, period_ms = 3600000, burst = 50 }
      tokens = { amount = 1, period_ms = 3600000, burst = 100000 }
      concurrent_runs = 2
      max_wait_ms = 2000
      estimate_tokens = 1000
      max_sessions = 3

      # The embedded default's burst of 5 turns, refilling one an hour.
      [plans.five]
      turns = { amount = 1, period_ms = 3600000, burst = 5 }
      tokens = { amount = 1, period_ms = 3600000, burst = 100000 }
      concurrent_runs = 8
      max_wait_ms = 2000
      estimate_tokens = 1000

      [plans.onecall]
      turns = { amount = 1, period_ms = 3600000, burst = 50 }
      tokens = { amount = 1, period_ms = 3600000, burst = 100000 }
      concurrent_runs = 8
      max_llm_calls = 1
      estimate_tokens = 1000

      # Refills 1,000 tokens a second: a reservation of 1,500 tokens on an
      # empty bucket waits about 1.5 s.
      [plans.waiter]
      turns = { amount = 1, period_ms = 3600000, burst = 50 }
      tokens = { amount = 60000, period_ms = 60000, burst = 1000 }
      concurrent_runs = 8
      max_wait_ms = 5000
      estimate_tokens = 1000

      # Spend budgets: 1,000 tokens a day and $50 a month.
      [plans.spender]
      turns = { amount = 1, period_ms = 3600000, burst = 50 }
      tokens = { amount = 1, period_ms = 3600000, burst = 100000 }
      concurrent_runs = 8
      estimate_tokens = 500

      [plans.spender.budgets]
      daily = { tokens = 1000 }
      monthly = { cost = "50.00" }

      [prices."openai:gpt-4o"]
      input = "2.50"
      output = "10.00"

      [users]
      spender = "spender"
      five = "five"
      onecall = "onecall"
      waiter = "waiter"
      waiter2 = "waiter"
      waiter3 = "waiter"

      # One provider key per test that changes one.
      [providers."gemini:flash"]
      requests = { amount = 1, period_ms = 3600000, burst = 1000 }
      policy = "reject"

      [providers."gemini:pro"]
      requests = { amount = 1, period_ms = 3600000, burst = 2 }
      policy = "reject"

      [providers."gemini:cool"]
      requests = { amount = 1, period_ms = 3600000, burst = 1000 }
      policy = "reject"

      [providers."openai:gpt-4o"]
      requests = { amount = 1, period_ms = 3600000, burst = 1000 }
      policy = "reject"

      # Fair sharing: tenants a and b weighted 3:1.
      [providers."gemini:fair"]
      requests = { amount = 1, period_ms = 3600000, burst = 1000 }
      policy = "reject"

      [providers."gemini:fair".tenants.a]
      weight = 3

      [providers."gemini:fair".tenants.b]
      weight = 1
      """;

  private final Process process;
  private final Path config;
  private final Path log;
  private final String url;

  private Sidecar(Process process, Path config, Path log, String url) {
    this.process = process;
    this.config = config;
    this.log = log;
    this.url = url;
  }

  /** A sidecar on the memory store with the suite's plans and {@code extra} config. */
  public static Sidecar start(String extra) {
    return start(extra, "");
  }

  /**
   * A sidecar with the suite's plans, {@code top} (top-level keys, e.g. {@code max_in_flight})
   * and {@code tables} (a {@code [store]}, {@code [limits]}, more plans, ...).
   */
  public static Sidecar start(String top, String tables) {
    IOException last = null;
    for (int attempt = 0; attempt < 3; attempt++) {
      int port = Processes.freePort();
      try {
        Path dir = Files.createTempDirectory("tollgate-java");
        Path cfg = dir.resolve("tollgate.toml");
        Files.writeString(
            cfg,
            "listen = \"127.0.0.1:" + port + "\"\n"
                + "admin_token = \"" + Tokens.ADMIN + "\"\n"
                + "default_plan = \"std\"\n"
                + "currency = \"USD\"\n"
                + top + "\n"
                + tables + "\n"
                + "[identity]\n"
                + "mode = \"jwt\"\n"
                + "algorithm = \"HS256\"\n"
                + "secret = \"" + Tokens.SECRET + "\"\n"
                + "issuer = \"" + Tokens.ISSUER + "\"\n"
                + "audience = \"" + Tokens.AUDIENCE + "\"\n"
                + PLANS);
        Path log = dir.resolve("tollgate.log");
        Process p =
            Processes.start(
                new ProcessBuilder(Binary.get().toString(), "serve", "--config", cfg.toString())
                    .redirectErrorStream(true)
                    .redirectOutput(log.toFile()));
        String url = "http://127.0.0.1:" + port;
        if (waitHealthy(p, url)) {
          return new Sidecar(p, cfg, log, url);
        }
        Processes.stop(p);
        String why = Processes.tail(log, 4000);
        Processes.deleteTree(dir);
        if (!why.contains("Address already in use")) {
          throw new IllegalStateException("tollgate serve did not start on " + url + ":\n" + why);
        }
      } catch (IOException e) {
        last = e;
      }
    }
    throw new IllegalStateException("tollgate serve did not start after 3 tries", last);
  }

  private static boolean waitHealthy(Process p, String url) {
    HttpClient http = HttpClient.newBuilder().connectTimeout(Duration.ofMillis(500)).build();
    HttpRequest health =
        HttpRequest.newBuilder(URI.create(url + "/healthz")).timeout(Duration.ofSeconds(1)).build();
    return Processes.poll(
        30_000,
        () -> {
          if (!p.isAlive()) {
            return true;
          }
          try {
            return http.send(health, HttpResponse.BodyHandlers.discarding()).statusCode() == 200;
          } catch (IOException e) {
            return false;
          } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            return false;
          }
        })
        && p.isAlive();
  }

  /** A {@code [store]} table on {@code redis} with a key prefix of its own. */
  public static String redisStore(RedisServer redis, String failure) {
    return redisStore(redis, failure, "j" + UUID.randomUUID().toString().substring(0, 8));
  }

  /** A {@code [store]} table on {@code redis} with the key prefix {@code prefix}. */
  public static String redisStore(RedisServer redis, String failure, String prefix) {
    return "[store]\n"
        + "kind = \"redis\"\n"
        + "url = \"" + redis.url() + "\"\n"
        + "key_prefix = \"" + prefix + "\"\n"
        + "op_timeout_ms = 500\n"
        + "failure = \"" + failure + "\"\n";
  }

  /** {@code http://127.0.0.1:<port>}. */
  public String url() {
    return url;
  }

  /** A client of this sidecar with per-user tokens ({@link Tokens#token(String)}) and the admin token. */
  public TollgateClient client() {
    return client(url);
  }

  /** The same client, aimed at {@code url} (e.g. a proxy in front of this sidecar). */
  public static TollgateClient client(String url) {
    return client(url, RetryPolicy.defaults());
  }

  /** The same client, aimed at {@code url}, retrying under {@code retry}. */
  public static TollgateClient client(String url, RetryPolicy retry) {
    return TollgateClient.builder(url)
        .credentials(Tokens::token)
        .adminToken(Tokens.ADMIN)
        .retry(retry)
        .build();
  }

  /** {@code retries} retries with backoffs of 10 to 50 ms, hints waited out up to 5 s. */
  public static RetryPolicy fastRetries(int retries) {
    return new RetryPolicy(
        retries, Duration.ofMillis(10), Duration.ofMillis(50), Duration.ofSeconds(5));
  }

  /** The config file it was started with (a test may rewrite it and reload). */
  public Path config() {
    return config;
  }

  /** What the sidecar logged so far. */
  public String log() {
    return Processes.tail(log, 20_000);
  }

  /** Whether the process still runs. */
  public boolean alive() {
    return process.isAlive();
  }

  @Override
  public void close() {
    Processes.stop(process);
    Processes.deleteTree(config.getParent());
  }
}
