package dev.tollgate.adk;

import com.google.adk.agents.RunConfig;
import com.google.adk.events.Event;
import com.google.adk.plugins.Plugin;
import com.google.adk.runner.Runner;
import com.google.genai.types.Content;
import dev.tollgate.adk.postgres.PgSessionService;
import dev.tollgate.client.Outcome;
import dev.tollgate.client.SessionLease;
import dev.tollgate.client.TollgateClient;
import dev.tollgate.client.UserClient;
import io.reactivex.rxjava3.core.Completable;
import io.reactivex.rxjava3.core.Flowable;
import io.reactivex.rxjava3.core.Scheduler;
import io.reactivex.rxjava3.core.Single;
import io.reactivex.rxjava3.disposables.Disposable;
import io.reactivex.rxjava3.schedulers.Schedulers;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Optional;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Runs ADK Java turns ({@code Runner.runAsync}) under a per-process in-flight cap and the session's
 * lease with its fence, and guarantees that everything a turn holds is freed however its {@code
 * Flowable} ends: completed, failed or disposed.
 *
 * <ul>
 *   <li>At most {@code maxInFlight} turns of this executor run at once ({@link
 *       Semaphore#tryAcquire()}); past it the {@code Flowable} fails with {@link
 *       TurnRejectedException} (429, with a retry hint), nothing taken.
 *   <li>Before the run, the session's lease is taken from the sidecar (holder: a token of the
 *       turn's own); another turn holding it fails the turn with {@link TurnRejectedException} (409,
 *       the lease's remaining TTL). The lease is renewed every third of {@code sessionTtlMs}; its
 *       fence is {@link #turn(String)}'s while the turn runs.
 *   <li>When the run's {@code Flowable} completes, fails or is disposed: the renewal stops, the
 *       session lease is released, the {@link TollgatePlugin} on the runner releases the run's lease
 *       and refunds its open reservations (ADK runs neither {@code afterRunCallback} nor {@code
 *       onRunErrorCallback} for a disposed run), and the slot is freed.
 * </ul>
 *
 * <p>The cap is per process: N replicas admit up to N × {@code maxInFlight} turns.
 */
public final class TurnExecutor {
  private static final Logger log = LoggerFactory.getLogger(TurnExecutor.class);

  private final Runner runner;
  private final TollgateClient client;
  private final TollgatePlugin plugin;
  private final int maxInFlight;
  private final long sessionTtlMs;
  private final long overloadedRetryMs;
  private final Scheduler scheduler;
  private final PgSessionService postgresSessions;
  private final Semaphore slots;
  private final ConcurrentHashMap<String, Turn> turns = new ConcurrentHashMap<>();

  private TurnExecutor(Builder b) {
    this.runner = b.runner;
    this.client = b.client;
    this.plugin = b.plugin != null ? b.plugin : find(b.runner);
    this.maxInFlight = b.maxInFlight;
    this.sessionTtlMs = b.sessionTtlMs;
    this.overloadedRetryMs = b.overloadedRetryMs;
    this.scheduler = b.scheduler;
    this.postgresSessions = b.postgresSessions;
    this.slots = new Semaphore(b.maxInFlight);
  }

  private static TollgatePlugin find(Runner runner) {
    for (Plugin p : runner.pluginManager().getPlugins()) {
      if (p instanceof TollgatePlugin t) {
        return t;
      }
    }
    return null;
  }

  /**
   * Starts configuring an executor of {@code runner}'s turns.
   *
   * @param runner the ADK runner (with {@link TollgatePlugin} among its plugins to admit and meter
   *     the turns too)
   * @param client the sidecar's client; its credentials give each turn's user a token
   * @return the builder
   */
  public static Builder builder(Runner runner, TollgateClient client) {
    return new Builder(runner, client);
  }

  /** Configures a {@link TurnExecutor}. */
  public static final class Builder {
    private final Runner runner;
    private final TollgateClient client;
    private TollgatePlugin plugin;
    private int maxInFlight = 64;
    private long sessionTtlMs = 30_000;
    private long overloadedRetryMs = 1_000;
    private Scheduler scheduler = Schedulers.computation();
    private PgSessionService postgresSessions;

    private Builder(Runner runner, TollgateClient client) {
      this.runner = Objects.requireNonNull(runner, "runner");
      this.client = Objects.requireNonNull(client, "client");
    }

    /**
     * The plugin whose runs a disposed turn releases (default: the {@link TollgatePlugin} among the
     * runner's plugins, if any).
     *
     * @param plugin the plugin
     * @return this builder
     */
    public Builder plugin(TollgatePlugin plugin) {
      this.plugin = Objects.requireNonNull(plugin, "plugin");
      return this;
    }

    /**
     * The most turns of this executor running at once (default 64).
     *
     * @param maxInFlight at least 1
     * @return this builder
     */
    public Builder maxInFlight(int maxInFlight) {
      if (maxInFlight < 1) {
        throw new IllegalArgumentException("maxInFlight must be at least 1, got " + maxInFlight);
      }
      this.maxInFlight = maxInFlight;
      return this;
    }

    /**
     * The session lease's TTL (default 30 s), renewed every third of it while the turn runs; a
     * process that dies holding it leaves it to expire after this long.
     *
     * @param sessionTtlMs 3 to 3,600,000 ms
     * @return this builder
     */
    public Builder sessionTtlMs(long sessionTtlMs) {
      if (sessionTtlMs < 3 || sessionTtlMs > 3_600_000) {
        throw new IllegalArgumentException("sessionTtlMs must be 3 to 3,600,000, got " + sessionTtlMs);
      }
      this.sessionTtlMs = sessionTtlMs;
      return this;
    }

    /**
     * The retry hint of the process cap's rejection (default 1,000 ms).
     *
     * @param overloadedRetryMs milliseconds, not negative
     * @return this builder
     */
    public Builder overloadedRetryMs(long overloadedRetryMs) {
      if (overloadedRetryMs < 0) {
        throw new IllegalArgumentException("overloadedRetryMs must not be negative");
      }
      this.overloadedRetryMs = overloadedRetryMs;
      return this;
    }

    /**
     * The scheduler of the lease renewals (default {@link Schedulers#computation()}).
     *
     * @param scheduler the scheduler
     * @return this builder
     */
    public Builder scheduler(Scheduler scheduler) {
      this.scheduler = Objects.requireNonNull(scheduler, "scheduler");
      return this;
    }

    /**
     * Sessions in PostgreSQL: the runner's session service, whose appends are fenced by the
     * database. Each turn then takes the session's database fence after its lease ({@link
     * Turn#db()}) and runs with it; if the database cannot issue it, the turn fails with the
     * service's {@link dev.tollgate.adk.postgres.SessionDatabaseException} and its lease is
     * released.
     *
     * @param sessions the service the runner keeps its sessions in
     * @return this builder
     */
    public Builder postgresSessions(PgSessionService sessions) {
      this.postgresSessions = Objects.requireNonNull(sessions, "sessions");
      return this;
    }

    /**
     * The executor.
     *
     * @return a new executor
     */
    public TurnExecutor build() {
      return new TurnExecutor(this);
    }
  }

  /**
   * Turns of this executor running now.
   *
   * @return how many hold a slot
   */
  public int inFlight() {
    return maxInFlight - slots.availablePermits();
  }

  /**
   * The turn running in {@code sessionId} on this executor, with its fence.
   *
   * @param sessionId the session
   * @return the turn, while one runs
   */
  public Optional<Turn> turn(String sessionId) {
    return Optional.ofNullable(turns.get(sessionId));
  }

  /**
   * Runs one turn with the default {@link RunConfig}.
   *
   * @param userId the user (the sidecar's user is the token the client's credentials give for it)
   * @param sessionId the session, which must exist unless the config creates it
   * @param message the user's message
   * @return the run's events; fails with {@link TurnRejectedException} when the turn is not
   *     started, or with a {@link dev.tollgate.client.TollgateException} when the sidecar cannot
   *     take the session lease (session leases fail closed)
   */
  public Flowable<Event> runAsync(String userId, String sessionId, Content message) {
    return runAsync(userId, sessionId, message, RunConfig.builder().build());
  }

  /**
   * Runs one turn.
   *
   * @param userId the user
   * @param sessionId the session
   * @param message the user's message
   * @param config the run's config
   * @return the run's events, as {@link #runAsync(String, String, Content)}
   */
  public Flowable<Event> runAsync(String userId, String sessionId, Content message, RunConfig config) {
    Objects.requireNonNull(userId, "userId");
    Objects.requireNonNull(sessionId, "sessionId");
    Objects.requireNonNull(message, "message");
    Objects.requireNonNull(config, "config");
    return Flowable.defer(
        () -> {
          if (!slots.tryAcquire()) {
            return Flowable.error(
                TurnRejectedException.overloaded(inFlight(), maxInFlight, overloadedRetryMs));
          }
          State st = new State(new Turn(userId, sessionId, "turn-" + UUID.randomUUID()), client.forUser(userId));
          var lease = st.user.acquireSessionLease(sessionId, st.turn.holder(), sessionTtlMs);
          lease.whenComplete(
              (out, fault) -> {
                synchronized (st) {
                  if (out instanceof Outcome.Granted<SessionLease> g) {
                    st.leased = true;
                    st.turn.fence(g.value().fence());
                    if (st.closed) {
                      // Disposed while the lease was on its way.
                      releaseLease(st);
                    }
                  }
                }
              });
          return Single.fromCompletionStage(lease)
              .flatMapPublisher(
                  out -> {
                    if (out instanceof Outcome.Refused<SessionLease> r) {
                      return Flowable.<Event>error(TurnRejectedException.refused(r.refusal()));
                    }
                    synchronized (st) {
                      if (!st.closed) {
                        turns.put(sessionId, st.turn);
                        st.renewer = renewer(st);
                      }
                    }
                    if (postgresSessions == null) {
                      return runner.runAsync(userId, sessionId, message, config);
                    }
                    // Sessions in PostgreSQL: the database's fence, taken now, travels in the
                    // session the runner loads for this run (a temp: key, never stored).
                    return postgresSessions
                        .takeFence(runner.appName(), userId, sessionId)
                        .flatMapPublisher(
                            db -> {
                              st.turn.db(db);
                              return runner.runAsync(
                                  userId,
                                  sessionId,
                                  message,
                                  config,
                                  Map.of(PgSessionService.FENCE_KEY, db));
                            });
                  })
              // Ended: everything is released before the subscriber sees the end, so its next
              // turn of the session finds the lease free and the slot back.
              .concatWith(Completable.defer(() -> finish(st)))
              .onErrorResumeNext(e -> finish(st).andThen(Flowable.<Event>error(e)))
              // Disposed: the same, in the background.
              .doFinally(() -> finish(st).subscribe());
        });
  }

  /** One turn's holdings. Guarded by itself. */
  private static final class State {
    final Turn turn;
    final UserClient user;
    boolean leased;
    boolean closed;
    Disposable renewer;
    final AtomicBoolean finished = new AtomicBoolean();

    State(Turn turn, UserClient user) {
      this.turn = turn;
      this.user = user;
    }
  }

  private Disposable renewer(State st) {
    long period = Math.max(1, sessionTtlMs / 3);
    return Flowable.interval(period, period, TimeUnit.MILLISECONDS, scheduler)
        .subscribe(
            tick ->
                st.user
                    .renewSessionLease(st.turn.sessionId(), st.turn.holder(), sessionTtlMs)
                    .whenComplete(
                        (out, fault) -> {
                          if (fault != null) {
                            log.warn("tollgate session renew of {} failed: {}", st.turn.sessionId(),
                                TollgatePlugin.cause(fault).toString());
                          } else if (out instanceof Outcome.Refused<?>) {
                            st.turn.lose();
                            log.warn("tollgate session lease of {} lost: its fence {} is stale",
                                st.turn.sessionId(), st.turn.fence());
                          }
                        }));
  }

  /**
   * Frees what the turn holds, once: the renewal, the session lease, the plugin's run (lease and
   * open reservations) and the slot. Completes when the sidecar has answered; faults are logged.
   */
  private Completable finish(State st) {
    if (!st.finished.compareAndSet(false, true)) {
      return Completable.complete();
    }
    List<Completable> done = new ArrayList<>();
    try {
      synchronized (st) {
        st.closed = true;
        if (st.renewer != null) {
          st.renewer.dispose();
        }
        turns.remove(st.turn.sessionId(), st.turn);
        if (st.leased) {
          done.add(Completable.fromCompletionStage(releaseLease(st)));
        }
      }
      if (plugin != null) {
        done.add(plugin.releaseSession(st.turn.userId(), st.turn.sessionId()));
      }
    } finally {
      slots.release();
    }
    return Completable.merge(done)
        .doOnError(e -> log.warn("tollgate release of a turn of {} failed: {}", st.turn.sessionId(), e.toString()))
        .onErrorComplete();
  }

  private java.util.concurrent.CompletableFuture<?> releaseLease(State st) {
    st.leased = false;
    return st.user
        .releaseSessionLease(st.turn.sessionId(), st.turn.holder())
        .whenComplete(
            (out, fault) -> {
              if (fault != null) {
                log.warn("tollgate session release of {} failed: {}", st.turn.sessionId(),
                    TollgatePlugin.cause(fault).toString());
              }
            });
  }
}
