package dev.tollgate.client;

import java.net.URI;
import java.net.http.HttpClient;
import java.time.Duration;
import java.util.Objects;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Executor;
import java.util.concurrent.ForkJoinPool;
import java.util.function.Supplier;

/**
 * A client of {@code tollgate serve}'s HTTP API (docs/spec.md §8): admission control for LLM agent
 * turns, token reservations, session leases with fencing, provider permits, and the admin routes.
 *
 * <pre>{@code
 * TollgateClient tollgate = TollgateClient.builder("http://127.0.0.1:8787")
 *     .credentials(userId -> verifiedTokenOf(userId))
 *     .build();
 * UserClient alice = tollgate.forUser("alice");
 * Outcome<Admitted> turn = alice.admitRun("inv-1").join();
 * }</pre>
 *
 * <p>Every operation is non-blocking ({@link HttpClient#sendAsync}, {@link CompletableFuture});
 * {@link #blocking()} and the {@code blocking()} views have the same operations waiting for their
 * answers. A limit's decision is a value ({@link Outcome}, {@link Refusal}); a fault is a {@link
 * TollgateException}. One client is meant to be shared by a whole process: it holds a bounded
 * connection pool ({@link Builder#maxConnections(int)}).
 */
public final class TollgateClient implements AutoCloseable {
  private final Transport transport;
  private final AdminClient admin;

  private TollgateClient(Transport transport) {
    this.transport = transport;
    this.admin = new AdminClient(transport);
  }

  /**
   * Starts configuring a client of the sidecar at {@code baseUrl}.
   *
   * @param baseUrl the sidecar's {@code listen} address, e.g. {@code http://127.0.0.1:8787}
   * @return the builder
   */
  public static Builder builder(String baseUrl) {
    return new Builder(URI.create(Objects.requireNonNull(baseUrl, "baseUrl")));
  }

  /**
   * Starts configuring a client of the sidecar at {@code baseUrl}.
   *
   * @param baseUrl the sidecar's {@code listen} address
   * @return the builder
   */
  public static Builder builder(URI baseUrl) {
    return new Builder(Objects.requireNonNull(baseUrl, "baseUrl"));
  }

  /**
   * The operations of one user, whose token the credentials give.
   *
   * @param userId the user (passed to {@link Credentials#token(String)})
   * @return the user's client; cheap, make one per request if convenient
   */
  public UserClient forUser(String userId) {
    return new UserClient(transport, userId);
  }

  /**
   * The admin routes.
   *
   * @return the admin client
   */
  public AdminClient admin() {
    return admin;
  }

  /**
   * Whether the sidecar serves ({@code GET /healthz}); no identity needed.
   *
   * @return {@code true} while it serves
   */
  public CompletableFuture<Boolean> healthz() {
    return transport.send(Ops.healthz(), null, false);
  }

  /**
   * Whether the sidecar is ready ({@code GET /readyz}); no identity needed. Never retried.
   *
   * @return {@code true} when ready; fails with {@link TollgateException.StoreUnavailable} while
   *     its store is down under {@code fail_closed}
   */
  public CompletableFuture<Boolean> readyz() {
    return transport.send(Ops.readyz(), null, false);
  }

  /**
   * The same operations, each waiting for its answer and throwing its fault.
   *
   * @return the blocking view
   */
  public Blocking blocking() {
    return new Blocking(this);
  }

  /**
   * Stops the client: later operations fail with {@link TollgateException.SidecarUnreachable}
   * ({@code closed}); requests in flight finish. The JDK's HTTP client frees its connections when
   * it is no longer referenced.
   */
  @Override
  public void close() {
    transport.close();
  }

  /** {@link TollgateClient}'s operations, each waiting for its answer and throwing its fault. */
  public static final class Blocking {
    private final TollgateClient async;

    Blocking(TollgateClient async) {
      this.async = async;
    }

    /**
     * See {@link TollgateClient#forUser(String)}.
     *
     * @param userId the user
     * @return the user's blocking client
     */
    public UserClient.Blocking forUser(String userId) {
      return async.forUser(userId).blocking();
    }

    /**
     * See {@link TollgateClient#admin()}.
     *
     * @return the blocking admin client
     */
    public AdminClient.Blocking admin() {
      return async.admin().blocking();
    }

    /**
     * See {@link TollgateClient#healthz()}.
     *
     * @return {@code true} while the sidecar serves
     */
    public boolean healthz() {
      return Await.result(async.healthz());
    }

    /**
     * See {@link TollgateClient#readyz()}.
     *
     * @return {@code true} when ready
     */
    public boolean readyz() {
      return Await.result(async.readyz());
    }
  }

  /** Configures a {@link TollgateClient}; every setting has a default but the URL. */
  public static final class Builder {
    private final URI baseUrl;
    private URI adminUrl;
    private Credentials credentials;
    private String adminToken;
    private Duration timeout = Duration.ofSeconds(10);
    private Duration connectTimeout = Duration.ofSeconds(5);
    private RetryPolicy retry = RetryPolicy.defaults();
    private int maxConnections = 64;
    private Executor executor;

    private Builder(URI baseUrl) {
      this.baseUrl = checkUrl(baseUrl, "baseUrl");
    }

    private static URI checkUrl(URI url, String name) {
      String scheme = url.getScheme();
      if (!"http".equalsIgnoreCase(scheme) && !"https".equalsIgnoreCase(scheme)) {
        throw new IllegalArgumentException(name + " must be an http:// or https:// URL, got " + url);
      }
      if (url.getHost() == null) {
        throw new IllegalArgumentException(name + " has no host: " + url);
      }
      return url;
    }

    /**
     * Where the bearer token of a user's requests comes from: a function of the user id (the
     * host's verified credential). Default: none (user operations fail with {@link
     * TollgateException.CredentialsUnavailable}).
     *
     * @param credentials the token source
     * @return this builder
     */
    public Builder credentials(Credentials credentials) {
      this.credentials = Objects.requireNonNull(credentials, "credentials");
      return this;
    }

    /**
     * One token source for every user, asked before every operation.
     *
     * @param token the token source
     * @return this builder
     */
    public Builder token(Supplier<String> token) {
      return credentials(Credentials.fixed(token));
    }

    /**
     * The sidecar's {@code admin_token}, for {@link #admin()}.
     *
     * @param adminToken the token
     * @return this builder
     */
    public Builder adminToken(String adminToken) {
      this.adminToken = Objects.requireNonNull(adminToken, "adminToken");
      return this;
    }

    /**
     * Where the admin routes are, when the sidecar sets {@code admin_listen}. Default: the base
     * URL.
     *
     * @param adminUrl the admin listener's URL
     * @return this builder
     */
    public Builder adminUrl(String adminUrl) {
      this.adminUrl = checkUrl(URI.create(Objects.requireNonNull(adminUrl, "adminUrl")), "adminUrl");
      return this;
    }

    /**
     * How long one request may take until its answer's headers arrive (default 10 s); a {@code
     * wait=true} reserve or permit adds the wait it asked for. Past it the operation fails with
     * {@link TollgateException.SidecarUnreachable} ({@code timeout}). Retries each get the whole
     * timeout.
     *
     * @param timeout positive
     * @return this builder
     */
    public Builder timeout(Duration timeout) {
      this.timeout = positive(timeout, "timeout");
      return this;
    }

    /**
     * How long opening a connection may take (default 5 s).
     *
     * @param connectTimeout positive
     * @return this builder
     */
    public Builder connectTimeout(Duration connectTimeout) {
      this.connectTimeout = positive(connectTimeout, "connectTimeout");
      return this;
    }

    /**
     * Retries of 503 and 429 {@code overloaded} (default {@link RetryPolicy#defaults()}).
     *
     * @param retry the policy
     * @return this builder
     */
    public Builder retry(RetryPolicy retry) {
      this.retry = Objects.requireNonNull(retry, "retry");
      return this;
    }

    /**
     * The most requests in flight at once, and so connections open (default 64); more wait for a
     * free one within their timeout, holding no thread.
     *
     * @param maxConnections 1 to 10,000
     * @return this builder
     */
    public Builder maxConnections(int maxConnections) {
      if (maxConnections < 1 || maxConnections > 10_000) {
        throw new IllegalArgumentException(
            "maxConnections must be 1 to 10,000, got " + maxConnections);
      }
      this.maxConnections = maxConnections;
      return this;
    }

    /**
     * The executor the HTTP client and the retries' continuations run on (default: the JDK HTTP
     * client's own, and the common pool for retries).
     *
     * @param executor the executor
     * @return this builder
     */
    public Builder executor(Executor executor) {
      this.executor = Objects.requireNonNull(executor, "executor");
      return this;
    }

    private static Duration positive(Duration d, String name) {
      Objects.requireNonNull(d, name);
      if (d.isZero() || d.isNegative()) {
        throw new IllegalArgumentException(name + " must be positive, got " + d);
      }
      return d;
    }

    /**
     * The client.
     *
     * @return a new client
     */
    public TollgateClient build() {
      HttpClient.Builder http =
          HttpClient.newBuilder()
              .version(HttpClient.Version.HTTP_1_1)
              .connectTimeout(connectTimeout)
              .followRedirects(HttpClient.Redirect.NEVER);
      if (executor != null) {
        http.executor(executor);
      }
      return new TollgateClient(
          new Transport(
              http.build(),
              baseUrl,
              adminUrl == null ? baseUrl : adminUrl,
              credentials,
              adminToken,
              timeout,
              retry,
              maxConnections,
              executor == null ? ForkJoinPool.commonPool() : executor));
    }
  }
}
