package dev.tollgate.adk;

import dev.tollgate.client.Feedback;
import dev.tollgate.client.Outcome;
import dev.tollgate.client.Permit;
import dev.tollgate.client.ProviderPermit;
import dev.tollgate.client.TollgateClient;
import dev.tollgate.client.UserClient;
import io.reactivex.rxjava3.core.Completable;
import io.reactivex.rxjava3.core.Maybe;
import io.reactivex.rxjava3.core.Scheduler;
import io.reactivex.rxjava3.core.Single;
import io.reactivex.rxjava3.schedulers.Schedulers;
import java.util.Objects;
import java.util.concurrent.TimeUnit;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * One provider key's permits and feedback (docs/spec.md §5), the fleet-wide quota every replica
 * shares: {@link #permit(long)} before a model call, {@link #report(ProviderAnswer)} of the
 * provider's failed answer after it.
 *
 * <pre>{@code
 * ProviderGate gate = ProviderGate.builder(tollgate, "gemini", "gemini-2.5-flash")
 *     .caller("support-agent")                      // whose credential takes permits
 *     .feedback(privileged, "support-agent")        // a credential with the tollgate:feedback scope
 *     .build();
 * }</pre>
 */
public final class ProviderGate {
  private static final Logger log = LoggerFactory.getLogger(ProviderGate.class);

  private final String provider;
  private final String model;
  private final UserClient caller;
  private final UserClient feedback;
  private final String tenant;
  private final long maxWaitMs;
  private final Scheduler scheduler;

  private ProviderGate(Builder b) {
    this.provider = b.provider;
    this.model = b.model;
    this.caller = b.client.forUser(b.caller);
    this.feedback = b.feedbackClient == null ? null : b.feedbackClient.forUser(b.feedbackUser);
    this.tenant = b.tenant;
    this.maxWaitMs = b.maxWaitMs;
    this.scheduler = b.scheduler;
  }

  /**
   * Starts configuring the gate of the config's key {@code provider:model}.
   *
   * @param client the sidecar's client
   * @param provider the provider, e.g. {@code "gemini"}
   * @param model the model as the config names the key
   * @return the builder
   */
  public static Builder builder(TollgateClient client, String provider, String model) {
    return new Builder(client, provider, model);
  }

  /** Configures a {@link ProviderGate}. */
  public static final class Builder {
    private final TollgateClient client;
    private final String provider;
    private final String model;
    private String caller = "provider-gate";
    private TollgateClient feedbackClient;
    private String feedbackUser;
    private String tenant;
    private long maxWaitMs = -1;
    private Scheduler scheduler = Schedulers.computation();

    private Builder(TollgateClient client, String provider, String model) {
      this.client = Objects.requireNonNull(client, "client");
      this.provider = Objects.requireNonNull(provider, "provider");
      this.model = Objects.requireNonNull(model, "model");
    }

    /**
     * The user id whose credential (from the client's {@code Credentials}) takes the permits: the
     * agent service's own identity (default {@code "provider-gate"}).
     *
     * @param userId the user id
     * @return this builder
     */
    public Builder caller(String userId) {
      this.caller = Objects.requireNonNull(userId, "userId");
      return this;
    }

    /**
     * The privileged credential that reports provider answers: a client whose credentials for
     * {@code userId} carry the sidecar's feedback scope ({@code tollgate:feedback}). Without it,
     * answers are not reported.
     *
     * @param client the client with the privileged credentials
     * @param userId the user id to ask them for
     * @return this builder
     */
    public Builder feedback(TollgateClient client, String userId) {
      this.feedbackClient = Objects.requireNonNull(client, "client");
      this.feedbackUser = Objects.requireNonNull(userId, "userId");
      return this;
    }

    /**
     * The tenant the permits are charged to, when the sidecar does not take it from the
     * credential.
     *
     * @param tenant the tenant
     * @return this builder
     */
    public Builder tenant(String tenant) {
      this.tenant = Objects.requireNonNull(tenant, "tenant");
      return this;
    }

    /**
     * The longest a call waits for a permit (default: the key's {@code max_wait_ms}); the wait is
     * a timer, never a blocked thread.
     *
     * @param maxWaitMs milliseconds, not negative
     * @return this builder
     */
    public Builder maxWaitMs(long maxWaitMs) {
      if (maxWaitMs < 0) {
        throw new IllegalArgumentException("maxWaitMs must not be negative");
      }
      this.maxWaitMs = maxWaitMs;
      return this;
    }

    /**
     * The scheduler of the waits (default {@link Schedulers#computation()}).
     *
     * @param scheduler the scheduler
     * @return this builder
     */
    public Builder scheduler(Scheduler scheduler) {
      this.scheduler = Objects.requireNonNull(scheduler, "scheduler");
      return this;
    }

    /**
     * The gate.
     *
     * @return a new gate
     */
    public ProviderGate build() {
      return new ProviderGate(this);
    }
  }

  /**
   * The provider.
   *
   * @return e.g. {@code "gemini"}
   */
  public String provider() {
    return provider;
  }

  /**
   * The model of the key.
   *
   * @return the model
   */
  public String model() {
    return model;
  }

  /**
   * Takes a permit for a call of {@code tokens} and waits out the wait it comes with (on a timer).
   *
   * @param tokens the call's tokens
   * @return the permit, or the refusal ({@code ProviderLimited}, {@code ProviderExhausted},
   *     {@code ExceedsCapacity}); a fault fails the {@code Single}
   */
  public Single<Outcome<ProviderPermit>> permit(long tokens) {
    Permit p = Permit.of(model, Math.max(1, tokens));
    if (tenant != null) {
      p = p.withTenant(tenant);
    }
    if (maxWaitMs >= 0) {
      p = p.withMaxWaitMs(maxWaitMs);
    }
    Permit request = p;
    return Single.defer(() -> Single.fromCompletionStage(caller.providerPermit(provider, request)))
        .flatMap(
            out -> {
              long wait = out.granted().map(ProviderPermit::waitMs).orElse(0L);
              return wait > 0
                  ? Completable.timer(wait, TimeUnit.MILLISECONDS, scheduler).andThen(Single.just(out))
                  : Single.just(out);
            });
  }

  /**
   * Reports a provider's failed answer with the privileged credential (a 429 pauses the key
   * fleet-wide and halves its rate; an exhausted quota makes permits fail fast). Faults are logged,
   * never raised.
   *
   * @param answer the provider's answer
   * @return the sidecar's classification, or empty without a feedback credential or on a fault
   */
  public Maybe<Feedback> report(ProviderAnswer answer) {
    if (feedback == null) {
      return Maybe.empty();
    }
    return Maybe.defer(
            () ->
                Maybe.fromCompletionStage(
                    feedback.providerFeedback(
                        provider, model, answer.status(), answer.headers(), answer.body().orElse(null))))
        .doOnError(e -> log.warn("tollgate provider feedback for {}:{} failed: {}", provider, model,
            TollgatePlugin.cause(e).toString()))
        .onErrorComplete();
  }
}
