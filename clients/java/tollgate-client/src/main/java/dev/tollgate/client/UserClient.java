package dev.tollgate.client;

import java.util.Map;
import java.util.Objects;
import java.util.Optional;
import java.util.OptionalLong;
import java.util.concurrent.CompletableFuture;

/**
 * The sidecar's operations as one user: every request carries the token {@link Credentials} gives
 * for {@link #userId()}, and the sidecar takes the user from it. Made by {@link
 * TollgateClient#forUser(String)}; cheap, immutable and safe to share.
 *
 * <p>Every method returns at once. A limit's refusal completes the future with {@link
 * Outcome.Refused}; a fault fails it with a {@link TollgateException}. {@link #blocking()} has the
 * same operations waiting for their answers.
 */
public final class UserClient {
  private final Transport transport;
  private final String userId;

  UserClient(Transport transport, String userId) {
    this.transport = transport;
    this.userId = Objects.requireNonNull(userId, "userId");
  }

  /**
   * The user whose credentials the requests carry.
   *
   * @return the user id given to {@link TollgateClient#forUser(String)}
   */
  public String userId() {
    return userId;
  }

  /**
   * The same operations, each waiting for its answer and throwing its fault.
   *
   * @return the blocking view
   */
  public Blocking blocking() {
    return new Blocking(this);
  }

  private <R> CompletableFuture<R> send(Call<R> call) {
    return transport.send(call, userId, true);
  }

  // Runs ------------------------------------------------------------------------

  /**
   * Admits a turn ({@code POST /v1/runs}): the turn rate and a run lease. Retrying with the same
   * invocation id is idempotent.
   *
   * @param invocationId the run, chosen by the caller
   * @return {@link Admitted}, or refused {@link Refusal.TurnRateLimited}, {@link
   *     Refusal.ConcurrencyLimited}, {@link Refusal.BudgetExhausted}
   */
  public CompletableFuture<Outcome<Admitted>> admitRun(String invocationId) {
    return send(Ops.admitRun(invocationId, Optional.empty(), OptionalLong.empty()));
  }

  /**
   * Admits a turn of a session: the session's lease first (holder: the invocation id), then the
   * turn; a refused admission releases the session lease again.
   *
   * @param invocationId the run
   * @param sessionId the conversation
   * @param sessionTtlMs the session lease's TTL (the sidecar's default is 30,000 ms)
   * @return {@link Admitted} with its {@link SessionLease}, or refused as {@link
   *     #admitRun(String)}, or {@link Refusal.SessionBusy}, {@link Refusal.SessionsLimited}
   */
  public CompletableFuture<Outcome<Admitted>> admitRun(
      String invocationId, String sessionId, long sessionTtlMs) {
    return send(
        Ops.admitRun(
            invocationId,
            Optional.of(Objects.requireNonNull(sessionId, "sessionId")),
            OptionalLong.of(sessionTtlMs)));
  }

  /**
   * Renews a run lease; a long run renews every third of {@link Admitted#leaseTtlMs()}.
   *
   * @param invocationId the run
   * @return {@link Renewed}, or refused {@link Refusal.LeaseLost}
   */
  public CompletableFuture<Outcome<Renewed>> renewRun(String invocationId) {
    return send(Ops.renewRun(invocationId));
  }

  /**
   * Releases a run lease.
   *
   * @param invocationId the run
   * @return {@link Released} ({@code released} false: it held nothing; {@code pending}:
   *     journalled while the store fails, done)
   */
  public CompletableFuture<Released> releaseRun(String invocationId) {
    return send(Ops.releaseRun(invocationId, Optional.empty()));
  }

  /**
   * Releases a run lease and the session lease the run holds.
   *
   * @param invocationId the run
   * @param sessionId the session admitted with it
   * @return {@link Released} for the run lease
   */
  public CompletableFuture<Released> releaseRun(String invocationId, String sessionId) {
    return send(
        Ops.releaseRun(invocationId, Optional.of(Objects.requireNonNull(sessionId, "sessionId"))));
  }

  // Tokens ----------------------------------------------------------------------

  /**
   * Reserves tokens for one model call. The request always carries a request id, and a retry
   * reuses it, so it never charges twice.
   *
   * @param reserve the reservation
   * @return {@link Reservation}, or refused {@link Refusal.TokenRateLimited}, {@link
   *     Refusal.BudgetExhausted}, {@link Refusal.MaxLlmCalls}, {@link Refusal.ExceedsCapacity},
   *     {@link Refusal.TooManyWaits}
   */
  public CompletableFuture<Outcome<Reservation>> reserve(Reserve reserve) {
    return send(Ops.reserve(Objects.requireNonNull(reserve, "reserve")));
  }

  /**
   * Reserves {@code estimate} tokens for one model call of {@code invocationId}, decide-only.
   *
   * @param invocationId the run
   * @param estimate the tokens to reserve, at least 1
   * @return as {@link #reserve(Reserve)}
   */
  public CompletableFuture<Outcome<Reservation>> reserve(String invocationId, long estimate) {
    return reserve(Reserve.of(invocationId, estimate));
  }

  /**
   * Settles a reservation at the tokens the call used; a repeat changes nothing.
   *
   * @param reservationId the reservation
   * @param actual the tokens used
   * @return {@link Closed} (its balance, or {@code pending}: done), or refused {@link
   *     Refusal.UnknownReservation}
   */
  public CompletableFuture<Outcome<Closed>> settle(String reservationId, long actual) {
    return send(Ops.settle(reservationId, actual, TokenSplit.NONE));
  }

  /**
   * Settles a reservation with the usage's split, which prices the call for cost budgets.
   *
   * @param reservationId the reservation
   * @param actual the tokens used
   * @param split the usage by kind
   * @return as {@link #settle(String, long)}
   */
  public CompletableFuture<Outcome<Closed>> settle(
      String reservationId, long actual, TokenSplit split) {
    return send(Ops.settle(reservationId, actual, Objects.requireNonNull(split, "split")));
  }

  /**
   * Gives a reservation back whole (the call was not made); a repeat changes nothing.
   *
   * @param reservationId the reservation
   * @return {@link Closed}, or refused {@link Refusal.UnknownReservation}
   */
  public CompletableFuture<Outcome<Closed>> refund(String reservationId) {
    return send(Ops.refund(reservationId));
  }

  // Sessions --------------------------------------------------------------------

  /**
   * Acquires a session lease, or refreshes it for the same holder; a new holder gets the next
   * fence.
   *
   * @param sessionId the session
   * @param holder who holds it (a turn's invocation id)
   * @param ttlMs the lease's TTL, 1 to 3,600,000 ms
   * @return {@link SessionLease}, or refused {@link Refusal.SessionBusy} ({@code retryAfterMs}
   *     the lease's remaining TTL), {@link Refusal.SessionsLimited}
   */
  public CompletableFuture<Outcome<SessionLease>> acquireSessionLease(
      String sessionId, String holder, long ttlMs) {
    return send(Ops.acquireSessionLease(sessionId, holder, ttlMs));
  }

  /**
   * Renews a session lease.
   *
   * @param sessionId the session
   * @param holder its holder
   * @param ttlMs the new TTL
   * @return {@link SessionLease}, or refused {@link Refusal.NotHolder}
   */
  public CompletableFuture<Outcome<SessionLease>> renewSessionLease(
      String sessionId, String holder, long ttlMs) {
    return send(Ops.renewSessionLease(sessionId, holder, ttlMs));
  }

  /**
   * Releases a session lease.
   *
   * @param sessionId the session
   * @param holder its holder
   * @return {@link Released}, or refused {@link Refusal.NotHolder}
   */
  public CompletableFuture<Outcome<Released>> releaseSessionLease(
      String sessionId, String holder) {
    return send(Ops.releaseSessionLease(sessionId, holder));
  }

  /**
   * Checks that {@code fence} is the session's latest.
   *
   * @param sessionId the session
   * @param fence the holder's fence
   * @return {@link FenceCurrent}, or refused {@link Refusal.StaleFence} (with the latest fence)
   */
  public CompletableFuture<Outcome<FenceCurrent>> checkFence(String sessionId, long fence) {
    return send(Ops.checkFence(sessionId, fence));
  }

  // Providers -------------------------------------------------------------------

  /**
   * Asks for a permit to call a model provider, against the fleet-wide quota of the config's
   * {@code provider:model} key. Never retried: a permit is a take.
   *
   * @param provider the provider, e.g. {@code "openai"}
   * @param permit the request
   * @return {@link ProviderPermit}, or refused {@link Refusal.ProviderLimited}, {@link
   *     Refusal.ProviderExhausted}, {@link Refusal.ExceedsCapacity}, {@link Refusal.TooManyWaits};
   *     a key not configured fails with {@link TollgateException.NotFound}
   */
  public CompletableFuture<Outcome<ProviderPermit>> providerPermit(
      String provider, Permit permit) {
    return send(Ops.providerPermit(provider, Objects.requireNonNull(permit, "permit")));
  }

  /**
   * Reports a provider's answer, which the sidecar classifies and applies (a 429 pauses the key
   * fleet-wide and halves its rate). Needs a credential with the feedback scope ({@link
   * TollgateException.Forbidden} without). Never retried.
   *
   * @param provider the provider
   * @param model the model
   * @param status the provider's HTTP status, 100 to 599
   * @param headers the provider's headers (e.g. {@code retry-after})
   * @param body the provider's body, or {@code null}
   * @return the classification
   */
  public CompletableFuture<Feedback> providerFeedback(
      String provider, String model, int status, Map<String, String> headers, String body) {
    return send(
        Ops.providerFeedback(
            provider, model, status, Objects.requireNonNull(headers, "headers"), body));
  }

  /** {@link UserClient}'s operations, each waiting for its answer and throwing its fault. */
  public static final class Blocking {
    private final UserClient async;

    Blocking(UserClient async) {
      this.async = async;
    }

    /**
     * The asynchronous operations.
     *
     * @return the client this view waits on
     */
    public UserClient async() {
      return async;
    }

    /**
     * See {@link UserClient#admitRun(String)}.
     *
     * @param invocationId the run
     * @return the outcome
     */
    public Outcome<Admitted> admitRun(String invocationId) {
      return Await.result(async.admitRun(invocationId));
    }

    /**
     * See {@link UserClient#admitRun(String, String, long)}.
     *
     * @param invocationId the run
     * @param sessionId the conversation
     * @param sessionTtlMs the session lease's TTL
     * @return the outcome
     */
    public Outcome<Admitted> admitRun(String invocationId, String sessionId, long sessionTtlMs) {
      return Await.result(async.admitRun(invocationId, sessionId, sessionTtlMs));
    }

    /**
     * See {@link UserClient#renewRun(String)}.
     *
     * @param invocationId the run
     * @return the outcome
     */
    public Outcome<Renewed> renewRun(String invocationId) {
      return Await.result(async.renewRun(invocationId));
    }

    /**
     * See {@link UserClient#releaseRun(String)}.
     *
     * @param invocationId the run
     * @return the answer
     */
    public Released releaseRun(String invocationId) {
      return Await.result(async.releaseRun(invocationId));
    }

    /**
     * See {@link UserClient#releaseRun(String, String)}.
     *
     * @param invocationId the run
     * @param sessionId the session admitted with it
     * @return the answer
     */
    public Released releaseRun(String invocationId, String sessionId) {
      return Await.result(async.releaseRun(invocationId, sessionId));
    }

    /**
     * See {@link UserClient#reserve(Reserve)}.
     *
     * @param reserve the reservation
     * @return the outcome
     */
    public Outcome<Reservation> reserve(Reserve reserve) {
      return Await.result(async.reserve(reserve));
    }

    /**
     * See {@link UserClient#reserve(String, long)}.
     *
     * @param invocationId the run
     * @param estimate the tokens to reserve
     * @return the outcome
     */
    public Outcome<Reservation> reserve(String invocationId, long estimate) {
      return Await.result(async.reserve(invocationId, estimate));
    }

    /**
     * See {@link UserClient#settle(String, long)}.
     *
     * @param reservationId the reservation
     * @param actual the tokens used
     * @return the outcome
     */
    public Outcome<Closed> settle(String reservationId, long actual) {
      return Await.result(async.settle(reservationId, actual));
    }

    /**
     * See {@link UserClient#settle(String, long, TokenSplit)}.
     *
     * @param reservationId the reservation
     * @param actual the tokens used
     * @param split the usage by kind
     * @return the outcome
     */
    public Outcome<Closed> settle(String reservationId, long actual, TokenSplit split) {
      return Await.result(async.settle(reservationId, actual, split));
    }

    /**
     * See {@link UserClient#refund(String)}.
     *
     * @param reservationId the reservation
     * @return the outcome
     */
    public Outcome<Closed> refund(String reservationId) {
      return Await.result(async.refund(reservationId));
    }

    /**
     * See {@link UserClient#acquireSessionLease(String, String, long)}.
     *
     * @param sessionId the session
     * @param holder who holds it
     * @param ttlMs the lease's TTL
     * @return the outcome
     */
    public Outcome<SessionLease> acquireSessionLease(String sessionId, String holder, long ttlMs) {
      return Await.result(async.acquireSessionLease(sessionId, holder, ttlMs));
    }

    /**
     * See {@link UserClient#renewSessionLease(String, String, long)}.
     *
     * @param sessionId the session
     * @param holder its holder
     * @param ttlMs the new TTL
     * @return the outcome
     */
    public Outcome<SessionLease> renewSessionLease(String sessionId, String holder, long ttlMs) {
      return Await.result(async.renewSessionLease(sessionId, holder, ttlMs));
    }

    /**
     * See {@link UserClient#releaseSessionLease(String, String)}.
     *
     * @param sessionId the session
     * @param holder its holder
     * @return the outcome
     */
    public Outcome<Released> releaseSessionLease(String sessionId, String holder) {
      return Await.result(async.releaseSessionLease(sessionId, holder));
    }

    /**
     * See {@link UserClient#checkFence(String, long)}.
     *
     * @param sessionId the session
     * @param fence the holder's fence
     * @return the outcome
     */
    public Outcome<FenceCurrent> checkFence(String sessionId, long fence) {
      return Await.result(async.checkFence(sessionId, fence));
    }

    /**
     * See {@link UserClient#providerPermit(String, Permit)}.
     *
     * @param provider the provider
     * @param permit the request
     * @return the outcome
     */
    public Outcome<ProviderPermit> providerPermit(String provider, Permit permit) {
      return Await.result(async.providerPermit(provider, permit));
    }

    /**
     * See {@link UserClient#providerFeedback(String, String, int, Map, String)}.
     *
     * @param provider the provider
     * @param model the model
     * @param status the provider's HTTP status
     * @param headers the provider's headers
     * @param body the provider's body, or {@code null}
     * @return the classification
     */
    public Feedback providerFeedback(
        String provider, String model, int status, Map<String, String> headers, String body) {
      return Await.result(async.providerFeedback(provider, model, status, headers, body));
    }
  }
}
