package dev.tollgate.adk;

import com.google.adk.agents.CallbackContext;
import com.google.adk.agents.InvocationContext;
import com.google.adk.models.LlmRequest;
import com.google.adk.models.LlmResponse;
import com.google.adk.plugins.BasePlugin;
import com.google.genai.types.Content;
import com.google.genai.types.GenerateContentResponseUsageMetadata;
import com.google.genai.types.Part;
import dev.tollgate.client.Admitted;
import dev.tollgate.client.Outcome;
import dev.tollgate.client.Refusal;
import dev.tollgate.client.Reservation;
import dev.tollgate.client.Reserve;
import dev.tollgate.client.TokenSplit;
import dev.tollgate.client.TollgateClient;
import dev.tollgate.client.UserClient;
import io.reactivex.rxjava3.core.Completable;
import io.reactivex.rxjava3.core.Flowable;
import io.reactivex.rxjava3.core.Maybe;
import io.reactivex.rxjava3.core.Scheduler;
import io.reactivex.rxjava3.disposables.Disposable;
import io.reactivex.rxjava3.schedulers.Schedulers;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * ADK Java's runs under tollgate, registered in one line:
 *
 * <pre>{@code
 * Runner runner = Runner.builder().agent(agent).appName("support")
 *     .sessionService(sessions).artifactService(artifacts)
 *     .plugins(TollgatePlugin.builder(tollgate).build())
 *     .build();
 * }</pre>
 *
 * <ul>
 *   <li>{@code beforeRunCallback} admits the run (turn rate, concurrent runs); a refusal ends it
 *       with one plain model-authored message ({@link Messages#denied}) naming the limit and when to
 *       retry. The run lease is renewed every third of the plan's {@code lease_ttl_ms} while the run
 *       lasts.
 *   <li>{@code beforeModelCallback} reserves the call's estimate ({@link Estimator}); a wait the
 *       sidecar asks for happens on an RxJava timer, never on a blocked thread; a refusal answers the
 *       call with {@link Messages#stopped}, so the run stops early.
 *   <li>{@code afterModelCallback} settles the call exactly once, on its final (non-partial)
 *       response, from its {@code usageMetadata} (prompt, candidates, cached); {@code
 *       onModelErrorCallback} refunds it.
 *   <li>{@code afterRunCallback} and {@code onRunErrorCallback} release the run, refunding the calls
 *       that never answered. A run whose {@code Flowable} is disposed gets neither callback: run it
 *       with {@link TurnExecutor}, which releases it then.
 * </ul>
 *
 * <p>Everything is keyed by invocation id (never by user), and the sidecar's user is the verified
 * token the client's {@code Credentials} give for the run's user id. A denied run holds nothing
 * and releases nothing. When the sidecar cannot decide, {@code failOpen(false)} (the default)
 * answers {@link Messages#UNAVAILABLE}, {@code failOpen(true)} lets the run go on unmetered; both
 * are logged.
 *
 * <p>Register it on {@code Runner.builder().plugins(...)} or on an {@code App}'s plugin list, not
 * both: ADK's builder throws {@code IllegalStateException}.
 */
public final class TollgatePlugin extends BasePlugin {
  private static final Logger log = LoggerFactory.getLogger(TollgatePlugin.class);

  /** The plugin's name in ADK's plugin manager. */
  public static final String NAME = "tollgate";

  private final TollgateClient client;
  private final boolean failOpen;
  private final Estimator estimator;
  private final Scheduler scheduler;
  private final ConcurrentHashMap<String, Run> runs = new ConcurrentHashMap<>();

  private TollgatePlugin(Builder b) {
    super(NAME);
    this.client = b.client;
    this.failOpen = b.failOpen;
    this.estimator = b.estimator;
    this.scheduler = b.scheduler;
  }

  /**
   * Starts configuring a plugin over {@code client}.
   *
   * @param client the sidecar's client; its credentials give each run's user a token
   * @return the builder
   */
  public static Builder builder(TollgateClient client) {
    return new Builder(client);
  }

  /** Configures a {@link TollgatePlugin}. */
  public static final class Builder {
    private final TollgateClient client;
    private boolean failOpen;
    private Estimator estimator = Estimator.defaults();
    private Scheduler scheduler = Schedulers.computation();

    private Builder(TollgateClient client) {
      this.client = Objects.requireNonNull(client, "client");
    }

    /**
     * What to do when the sidecar cannot decide (unreachable, its store down): {@code false} (the
     * default) stops the run with {@link Messages#UNAVAILABLE}; {@code true} lets it go on
     * unmetered. Both are logged.
     *
     * @param failOpen whether to go on unmetered
     * @return this builder
     */
    public Builder failOpen(boolean failOpen) {
      this.failOpen = failOpen;
      return this;
    }

    /**
     * How a model call's reservation is estimated (default {@link Estimator#defaults()}).
     *
     * @param estimator the estimator
     * @return this builder
     */
    public Builder estimator(Estimator estimator) {
      this.estimator = Objects.requireNonNull(estimator, "estimator");
      return this;
    }

    /**
     * The scheduler of the waits and the lease renewals (default {@link Schedulers#computation()}).
     *
     * @param scheduler the scheduler
     * @return this builder
     */
    public Builder scheduler(Scheduler scheduler) {
      this.scheduler = Objects.requireNonNull(scheduler, "scheduler");
      return this;
    }

    /**
     * The plugin.
     *
     * @return a new plugin
     */
    public TollgatePlugin build() {
      return new TollgatePlugin(this);
    }
  }

  /** One run: what it was admitted with and what it holds. Guarded by itself. */
  private static final class Run {
    final String invocationId;
    final String userId;
    final String sessionId;
    final UserClient user;
    Admitted plan;
    boolean metered = true;
    boolean closed;
    Disposable renewer;
    final Map<String, Call> calls = new ConcurrentHashMap<>();

    Run(String invocationId, String userId, String sessionId, UserClient user) {
      this.invocationId = invocationId;
      this.userId = userId;
      this.sessionId = sessionId;
      this.user = user;
    }
  }

  /** One model call's reservation, until it is settled or refunded. */
  private static final class Call {
    final String reservationId;
    final long estimate;
    final String agent;
    final AtomicReference<GenerateContentResponseUsageMetadata> usage = new AtomicReference<>();

    Call(String reservationId, long estimate, String agent) {
      this.reservationId = reservationId;
      this.estimate = estimate;
      this.agent = agent;
    }
  }

  /**
   * Runs of this plugin admitted and not yet released (tests and metrics).
   *
   * @return how many
   */
  public int openRuns() {
    return runs.size();
  }

  // Runs ----------------------------------------------------------------------------

  @Override
  public Maybe<Content> beforeRunCallback(InvocationContext ctx) {
    String inv = ctx.invocationId();
    Run run = new Run(inv, ctx.userId(), ctx.session().id(), client.forUser(ctx.userId()));
    runs.put(inv, run);
    CompletableFuture<Optional<Content>> decided =
        run.user
            .admitRun(inv)
            .handle(
                (out, fault) -> {
                  synchronized (run) {
                    if (fault != null) {
                      log.warn("tollgate admission of {} failed ({}): {}", inv,
                          failOpen ? "running unmetered" : "refused", cause(fault).toString());
                      if (failOpen) {
                        run.metered = false;
                        return Optional.<Content>empty();
                      }
                      runs.remove(inv, run);
                      return Optional.of(text(Messages.UNAVAILABLE));
                    }
                    if (out instanceof Outcome.Refused<Admitted> r) {
                      log.info("tollgate refused invocation {}: {}", inv, r.refusal().error());
                      runs.remove(inv, run);
                      return Optional.of(text(Messages.denied(r.refusal())));
                    }
                    run.plan = out.granted().orElseThrow();
                    if (run.closed) {
                      // Released (disposed) while the admission was on its way.
                      run.user.releaseRun(inv);
                    } else {
                      run.renewer = renewer(run);
                    }
                    return Optional.<Content>empty();
                  }
                });
    return Maybe.fromCompletionStage(decided).flatMap(o -> o.map(Maybe::just).orElse(Maybe.empty()));
  }

  private Disposable renewer(Run run) {
    long period = Math.max(1, run.plan.leaseTtlMs() / 3);
    return Flowable.interval(period, period, TimeUnit.MILLISECONDS, scheduler)
        .subscribe(
            tick ->
                run.user
                    .renewRun(run.invocationId)
                    .whenComplete(
                        (out, fault) -> {
                          if (fault != null) {
                            log.warn("tollgate renew of {} failed: {}", run.invocationId, cause(fault).toString());
                          } else if (out instanceof Outcome.Refused<?> lost) {
                            log.warn("tollgate lease of {} lost: {}", run.invocationId, lost.refusal().message());
                          }
                        }));
  }

  @Override
  public Completable afterRunCallback(InvocationContext ctx) {
    return release(ctx.invocationId());
  }

  @Override
  public Completable onRunErrorCallback(InvocationContext ctx, Throwable error) {
    return release(ctx.invocationId());
  }

  /**
   * Releases a run: its open reservations refunded (or, answered without usage, settled at their
   * estimate), its lease released. A run not held (denied, unknown, already released) is nothing
   * to do. {@link TurnExecutor} calls it when a run's {@code Flowable} ends any other way.
   *
   * @param invocationId the run
   * @return completes when the sidecar has answered (faults are logged, never raised)
   */
  public Completable release(String invocationId) {
    Run run = runs.remove(invocationId);
    if (run == null) {
      return Completable.complete();
    }
    return Completable.defer(() -> Completable.fromCompletionStage(close(run)));
  }

  /**
   * Releases every run of {@code userId}'s session {@code sessionId} this plugin holds: what a
   * disposed run leaves behind.
   *
   * @param userId the user
   * @param sessionId the session
   * @return completes when the sidecar has answered
   */
  public Completable releaseSession(String userId, String sessionId) {
    List<Completable> done = new ArrayList<>();
    for (Run run : runs.values()) {
      if (run.userId.equals(userId) && run.sessionId.equals(sessionId)) {
        done.add(release(run.invocationId));
      }
    }
    return Completable.merge(done);
  }

  private CompletableFuture<Void> close(Run run) {
    List<CompletableFuture<?>> pending = new ArrayList<>();
    synchronized (run) {
      run.closed = true;
      if (run.renewer != null) {
        run.renewer.dispose();
      }
      if (run.plan == null || !run.metered) {
        // Nothing held yet (the admission answers later and releases), or unmetered.
        return CompletableFuture.completedFuture(null);
      }
      for (String key : List.copyOf(run.calls.keySet())) {
        Call c = run.calls.remove(key);
        if (c != null) {
          pending.add(closeCall(run, c).exceptionally(e -> null));
        }
      }
    }
    return CompletableFuture.allOf(pending.toArray(CompletableFuture[]::new))
        .thenCompose(v -> run.user.releaseRun(run.invocationId))
        .handle(
            (r, fault) -> {
              if (fault != null) {
                log.warn("tollgate release of {} failed: {}", run.invocationId, cause(fault).toString());
              }
              return null;
            });
  }

  /** A call left open at the run's end: settled at its usage if it answered, else refunded. */
  private CompletableFuture<?> closeCall(Run run, Call c) {
    GenerateContentResponseUsageMetadata seen = c.usage.get();
    if (seen != null) {
      return run.user.settle(c.reservationId, actual(seen, c.estimate), split(seen));
    }
    return run.user.refund(c.reservationId);
  }

  // Model calls ---------------------------------------------------------------------

  @Override
  public Maybe<LlmResponse> beforeModelCallback(CallbackContext ctx, LlmRequest.Builder request) {
    Run run = runs.get(ctx.invocationId());
    if (run == null) {
      return Maybe.empty();
    }
    Admitted plan;
    synchronized (run) {
      if (!run.metered || run.plan == null || run.closed) {
        return Maybe.empty();
      }
      plan = run.plan;
    }
    String agent = ctx.agentName();
    long estimate = estimator.estimate(agent, request.build(), plan.estimateTokens());
    String key = ctx.eventId();
    Reserve reserve =
        Reserve.of(run.invocationId, estimate).withRequestId(run.invocationId + "/" + key);
    CompletableFuture<Object> decided =
        run.user
            .reserve(reserve)
            .handle(
                (out, fault) -> {
                  if (fault != null) {
                    log.warn("tollgate reserve for {} failed ({}): {}", run.invocationId,
                        failOpen ? "unmetered" : "stopped", cause(fault).toString());
                    return failOpen ? (Object) 0L : response(Messages.UNAVAILABLE);
                  }
                  if (out instanceof Outcome.Refused<Reservation> r) {
                    log.info("tollgate stopped invocation {} before a model call: {}", run.invocationId, r.refusal().error());
                    return response(Messages.stopped(r.refusal()));
                  }
                  Reservation granted = out.granted().orElseThrow();
                  synchronized (run) {
                    if (run.closed) {
                      run.user.refund(granted.reservationId());
                      return (Object) 0L;
                    }
                    run.calls.put(key, new Call(granted.reservationId(), estimate, agent));
                  }
                  return (Object) granted.waitMs();
                });
    return Maybe.fromCompletionStage(decided)
        .flatMap(
            d -> {
              if (d instanceof LlmResponse stop) {
                return Maybe.just(stop);
              }
              long waitMs = (Long) d;
              return waitMs > 0
                  ? Completable.timer(waitMs, TimeUnit.MILLISECONDS, scheduler).andThen(Maybe.<LlmResponse>empty())
                  : Maybe.<LlmResponse>empty();
            });
  }

  @Override
  public Maybe<LlmResponse> afterModelCallback(CallbackContext ctx, LlmResponse response) {
    Run run = runs.get(ctx.invocationId());
    if (run == null) {
      return Maybe.empty();
    }
    String key = ctx.eventId();
    if (response.partial().orElse(false)) {
      Call c = run.calls.get(key);
      if (c != null && response.usageMetadata().isPresent()) {
        c.usage.set(response.usageMetadata().get());
      }
      return Maybe.empty();
    }
    Call c = run.calls.remove(key);
    if (c == null) {
      return Maybe.empty();
    }
    GenerateContentResponseUsageMetadata usage = response.usageMetadata().orElse(c.usage.get());
    long used = usage == null ? c.estimate : actual(usage, c.estimate);
    Admitted plan = run.plan;
    if (usage != null && plan != null) {
      estimator.observe(c.agent, used, plan.estimateTokens());
    }
    TokenSplit split = usage == null ? TokenSplit.NONE : split(usage);
    return Completable.fromCompletionStage(run.user.settle(c.reservationId, used, split))
        .doOnError(e -> log.warn("tollgate settle of {} failed: {}", c.reservationId, cause(e).toString()))
        .onErrorComplete()
        .andThen(Maybe.empty());
  }

  @Override
  public Maybe<LlmResponse> onModelErrorCallback(
      CallbackContext ctx, LlmRequest.Builder request, Throwable error) {
    Run run = runs.get(ctx.invocationId());
    Call c = run == null ? null : run.calls.remove(ctx.eventId());
    Completable refund =
        c == null
            ? Completable.complete()
            : Completable.fromCompletionStage(run.user.refund(c.reservationId))
                .doOnError(e -> log.warn("tollgate refund of {} failed: {}", c.reservationId, cause(e).toString()))
                .onErrorComplete();
    if (error instanceof ProviderRefusedException refused) {
      // QuotaGatedLlm's refusal: the call was not made; the run goes on with the plain message.
      return refund.andThen(Maybe.just(response(Messages.stopped(refused.refusal()))));
    }
    return refund.andThen(Maybe.empty());
  }

  @Override
  public Completable close() {
    List<Completable> all = new ArrayList<>();
    for (String inv : List.copyOf(runs.keySet())) {
      all.add(release(inv));
    }
    return Completable.merge(all);
  }

  // Helpers -------------------------------------------------------------------------

  static long actual(GenerateContentResponseUsageMetadata u, long fallback) {
    if (u.totalTokenCount().isPresent()) {
      return u.totalTokenCount().get();
    }
    long sum =
        u.promptTokenCount().orElse(0)
            + u.candidatesTokenCount().orElse(0)
            + u.thoughtsTokenCount().orElse(0)
            + u.toolUsePromptTokenCount().orElse(0);
    return sum > 0 ? sum : fallback;
  }

  static TokenSplit split(GenerateContentResponseUsageMetadata u) {
    if (u.promptTokenCount().isEmpty() && u.candidatesTokenCount().isEmpty()) {
      return TokenSplit.NONE;
    }
    long cached = u.cachedContentTokenCount().orElse(0);
    long prompt = u.promptTokenCount().orElse(0);
    long out = u.candidatesTokenCount().orElse(0) + u.thoughtsTokenCount().orElse(0);
    // Gemini counts cached tokens inside the prompt; the split prices them apart.
    return TokenSplit.of(Math.max(0, prompt - cached), out, cached);
  }

  static Content text(String text) {
    return Content.builder().role("model").parts(List.of(Part.fromText(text))).build();
  }

  static LlmResponse response(String text) {
    return LlmResponse.builder().content(text(text)).turnComplete(true).build();
  }

  static Throwable cause(Throwable t) {
    while ((t instanceof java.util.concurrent.CompletionException
            || t instanceof java.util.concurrent.ExecutionException)
        && t.getCause() != null) {
      t = t.getCause();
    }
    return t;
  }
}
