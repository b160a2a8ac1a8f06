package dev.tollgate.client;

import java.util.Objects;
import java.util.Optional;
import java.util.OptionalLong;

/**
 * A decision the sidecar made against a request: a value the caller branches on, never thrown.
 *
 * <p>Each record is one of the sidecar's refusal codes (docs/spec.md §8). {@link #retryAfterMs()}
 * is present when a retry after that long may succeed, and absent when it cannot ({@link
 * MaxLlmCalls}, {@link ExceedsCapacity}, {@link StaleFence}, ...). {@link #limit()} names the limit
 * that refused when the sidecar names one ({@code turn_rate}, {@code token_rate}, {@code
 * budget_daily}, ...).
 *
 * <pre>{@code
 * Outcome<Admitted> out = alice.admitRun("inv-1").join();
 * if (out instanceof Outcome.Refused<Admitted> r) {
 *     if (r.refusal() instanceof Refusal.TurnRateLimited t) {
 *         System.out.println("retry in " + t.retryAfterMs().getAsLong() + " ms");
 *     }
 * }
 * }</pre>
 */
public sealed interface Refusal
    permits Refusal.TurnRateLimited,
        Refusal.ConcurrencyLimited,
        Refusal.SessionsLimited,
        Refusal.SessionBusy,
        Refusal.TokenRateLimited,
        Refusal.BudgetExhausted,
        Refusal.MaxLlmCalls,
        Refusal.ExceedsCapacity,
        Refusal.TooManyWaits,
        Refusal.ProviderLimited,
        Refusal.ProviderExhausted,
        Refusal.StaleFence,
        Refusal.LeaseLost,
        Refusal.NotHolder,
        Refusal.UnknownReservation {

  /**
   * The sidecar's {@code error} code.
   *
   * @return the code, e.g. {@code "turn_rate"}
   */
  String error();

  /**
   * The sidecar's message, written for the end user.
   *
   * @return the message
   */
  String message();

  /**
   * The limit that refused, when the sidecar names one.
   *
   * @return the limit, e.g. {@code "turn_rate"} or {@code "budget_daily"}
   */
  Optional<String> limit();

  /**
   * When a retry may succeed.
   *
   * @return milliseconds to wait, absent when a retry cannot succeed
   */
  OptionalLong retryAfterMs();

  /**
   * Whether a retry after {@link #retryAfterMs()} may succeed.
   *
   * @return {@code true} when the sidecar gave a retry hint
   */
  default boolean retryable() {
    return retryAfterMs().isPresent();
  }

  /**
   * The user's turn rate is spent (429 {@code turn_rate}).
   *
   * @param message the sidecar's message
   * @param limit the limit named
   * @param retryAfterMs when the next turn fits
   */
  record TurnRateLimited(String message, Optional<String> limit, OptionalLong retryAfterMs)
      implements Refusal {
    /**
     * Checks the components.
     *
     * @param message the sidecar's message
     * @param limit the limit named
     * @param retryAfterMs when the next turn fits
     */
    public TurnRateLimited {
      Checks.refusal(message, limit, retryAfterMs);
    }

    @Override
    public String error() {
      return "turn_rate";
    }
  }

  /**
   * The user runs as many turns at once as the plan allows (429 {@code concurrency}).
   *
   * @param message the sidecar's message
   * @param limit the limit named
   * @param retryAfterMs when the earliest run lease expires
   */
  record ConcurrencyLimited(String message, Optional<String> limit, OptionalLong retryAfterMs)
      implements Refusal {
    /**
     * Checks the components.
     *
     * @param message the sidecar's message
     * @param limit the limit named
     * @param retryAfterMs when the earliest run lease expires
     */
    public ConcurrencyLimited {
      Checks.refusal(message, limit, retryAfterMs);
    }

    @Override
    public String error() {
      return "concurrency";
    }
  }

  /**
   * A new session past the plan's {@code max_sessions} (429 {@code sessions}).
   *
   * @param message the sidecar's message
   * @param limit the limit named
   * @param retryAfterMs when the user's earliest session claim ends
   */
  record SessionsLimited(String message, Optional<String> limit, OptionalLong retryAfterMs)
      implements Refusal {
    /**
     * Checks the components.
     *
     * @param message the sidecar's message
     * @param limit the limit named
     * @param retryAfterMs when the user's earliest session claim ends
     */
    public SessionsLimited {
      Checks.refusal(message, limit, retryAfterMs);
    }

    @Override
    public String error() {
      return "sessions";
    }
  }

  /**
   * Another holder has the session's lease (409 {@code session_busy}).
   *
   * @param message the sidecar's message
   * @param limit the limit named
   * @param retryAfterMs the lease's remaining time to live
   */
  record SessionBusy(String message, Optional<String> limit, OptionalLong retryAfterMs)
      implements Refusal {
    /**
     * Checks the components.
     *
     * @param message the sidecar's message
     * @param limit the limit named
     * @param retryAfterMs the lease's remaining time to live
     */
    public SessionBusy {
      Checks.refusal(message, limit, retryAfterMs);
    }

    @Override
    public String error() {
      return "session_busy";
    }
  }

  /**
   * The call's tokens do not fit the token rate within the plan's max wait (429 {@code
   * token_rate}); nothing was taken.
   *
   * @param message the sidecar's message
   * @param limit the limit named
   * @param retryAfterMs when the call would fit
   */
  record TokenRateLimited(String message, Optional<String> limit, OptionalLong retryAfterMs)
      implements Refusal {
    /**
     * Checks the components.
     *
     * @param message the sidecar's message
     * @param limit the limit named
     * @param retryAfterMs when the call would fit
     */
    public TokenRateLimited {
      Checks.refusal(message, limit, retryAfterMs);
    }

    @Override
    public String error() {
      return "token_rate";
    }
  }

  /**
   * A spend budget of the user is spent (429 {@code budget_exhausted}): {@link #limit()} names
   * its window ({@code budget_daily}, {@code budget_weekly}, {@code budget_monthly}) and {@link
   * #retryAfterMs()} runs to its end.
   *
   * @param message the sidecar's message, saying which budget and when it resets
   * @param limit the budget's window
   * @param retryAfterMs the time to the window's end
   * @param resetsAtMs when the window ends, ms since the Unix epoch (the sidecar's clock)
   */
  record BudgetExhausted(
      String message, Optional<String> limit, OptionalLong retryAfterMs, OptionalLong resetsAtMs)
      implements Refusal {
    /**
     * Checks the components.
     *
     * @param message the sidecar's message, saying which budget and when it resets
     * @param limit the budget's window
     * @param retryAfterMs the time to the window's end
     * @param resetsAtMs when the window ends, ms since the Unix epoch (the sidecar's clock)
     */
    public BudgetExhausted {
      Checks.refusal(message, limit, retryAfterMs);
      Objects.requireNonNull(resetsAtMs, "resetsAtMs");
    }

    @Override
    public String error() {
      return "budget_exhausted";
    }
  }

  /**
   * The run made the plan's {@code max_llm_calls} model calls (429 {@code max_llm_calls}; not
   * retryable).
   *
   * @param message the sidecar's message
   * @param limit the limit named
   * @param retryAfterMs always absent
   */
  record MaxLlmCalls(String message, Optional<String> limit, OptionalLong retryAfterMs)
      implements Refusal {
    /**
     * Checks the components.
     *
     * @param message the sidecar's message
     * @param limit the limit named
     * @param retryAfterMs always absent
     */
    public MaxLlmCalls {
      Checks.refusal(message, limit, retryAfterMs);
    }

    @Override
    public String error() {
      return "max_llm_calls";
    }
  }

  /**
   * The request can never fit: it asks more than the limit's whole capacity (400 {@code
   * exceeds_capacity}; not retryable). {@link #limit()} names the limit ({@code token_rate}, a
   * budget, a provider's).
   *
   * @param message the sidecar's message
   * @param limit the limit named
   * @param retryAfterMs always absent
   */
  record ExceedsCapacity(String message, Optional<String> limit, OptionalLong retryAfterMs)
      implements Refusal {
    /**
     * Checks the components.
     *
     * @param message the sidecar's message
     * @param limit the limit named
     * @param retryAfterMs always absent
     */
    public ExceedsCapacity {
      Checks.refusal(message, limit, retryAfterMs);
    }

    @Override
    public String error() {
      return "exceeds_capacity";
    }
  }

  /**
   * Too many {@code wait=true} requests of the user, or of the replica, wait at once (429 {@code
   * too_many_waits}); nothing was decided or charged.
   *
   * @param message the sidecar's message
   * @param limit the limit named
   * @param retryAfterMs when to try again
   */
  record TooManyWaits(String message, Optional<String> limit, OptionalLong retryAfterMs)
      implements Refusal {
    /**
     * Checks the components.
     *
     * @param message the sidecar's message
     * @param limit the limit named
     * @param retryAfterMs when to try again
     */
    public TooManyWaits {
      Checks.refusal(message, limit, retryAfterMs);
    }

    @Override
    public String error() {
      return "too_many_waits";
    }
  }

  /**
   * The provider key's rate ({@code provider_rate}) or its shared cooldown after a provider 429
   * ({@code provider_cooldown}) refuses the call (429).
   *
   * @param error {@code provider_rate} or {@code provider_cooldown}
   * @param message the sidecar's message
   * @param limit the limit named
   * @param retryAfterMs when the call would fit
   */
  record ProviderLimited(
      String error, String message, Optional<String> limit, OptionalLong retryAfterMs)
      implements Refusal {
    /**
     * Checks the components.
     *
     * @param error {@code provider_rate} or {@code provider_cooldown}
     * @param message the sidecar's message
     * @param limit the limit named
     * @param retryAfterMs when the call would fit
     */
    public ProviderLimited {
      Objects.requireNonNull(error, "error");
      Checks.refusal(message, limit, retryAfterMs);
    }
  }

  /**
   * The provider's quota is exhausted (per day, billing): permits fail fast on this replica for
   * {@link #retryAfterMs()} (403 {@code provider_exhausted}).
   *
   * @param message the sidecar's message
   * @param limit the limit named
   * @param retryAfterMs how long this replica fails fast
   */
  record ProviderExhausted(String message, Optional<String> limit, OptionalLong retryAfterMs)
      implements Refusal {
    /**
     * Checks the components.
     *
     * @param message the sidecar's message
     * @param limit the limit named
     * @param retryAfterMs how long this replica fails fast
     */
    public ProviderExhausted {
      Checks.refusal(message, limit, retryAfterMs);
    }

    @Override
    public String error() {
      return "provider_exhausted";
    }
  }

  /**
   * A newer holder took the session: the fence checked is not the latest (409 {@code
   * stale_fence}); the turn holding it must stop writing.
   *
   * @param message the sidecar's message
   * @param limit the limit named
   * @param retryAfterMs always absent
   * @param latestFence the session's latest issued fence
   */
  record StaleFence(
      String message, Optional<String> limit, OptionalLong retryAfterMs, long latestFence)
      implements Refusal {
    /**
     * Checks the components.
     *
     * @param message the sidecar's message
     * @param limit the limit named
     * @param retryAfterMs always absent
     * @param latestFence the session's latest issued fence
     */
    public StaleFence {
      Checks.refusal(message, limit, retryAfterMs);
    }

    @Override
    public String error() {
      return "stale_fence";
    }
  }

  /**
   * The run lease is gone: expired or released (404 {@code lease_lost}).
   *
   * @param message the sidecar's message
   * @param limit the limit named
   * @param retryAfterMs always absent
   */
  record LeaseLost(String message, Optional<String> limit, OptionalLong retryAfterMs)
      implements Refusal {
    /**
     * Checks the components.
     *
     * @param message the sidecar's message
     * @param limit the limit named
     * @param retryAfterMs always absent
     */
    public LeaseLost {
      Checks.refusal(message, limit, retryAfterMs);
    }

    @Override
    public String error() {
      return "lease_lost";
    }
  }

  /**
   * The session lease is not held by this holder (404 {@code not_holder}).
   *
   * @param message the sidecar's message
   * @param limit the limit named
   * @param retryAfterMs always absent
   */
  record NotHolder(String message, Optional<String> limit, OptionalLong retryAfterMs)
      implements Refusal {
    /**
     * Checks the components.
     *
     * @param message the sidecar's message
     * @param limit the limit named
     * @param retryAfterMs always absent
     */
    public NotHolder {
      Checks.refusal(message, limit, retryAfterMs);
    }

    @Override
    public String error() {
      return "not_holder";
    }
  }

  /**
   * No such reservation (404 {@code unknown_reservation}).
   *
   * @param message the sidecar's message
   * @param limit the limit named
   * @param retryAfterMs always absent
   */
  record UnknownReservation(String message, Optional<String> limit, OptionalLong retryAfterMs)
      implements Refusal {
    /**
     * Checks the components.
     *
     * @param message the sidecar's message
     * @param limit the limit named
     * @param retryAfterMs always absent
     */
    public UnknownReservation {
      Checks.refusal(message, limit, retryAfterMs);
    }

    @Override
    public String error() {
      return "unknown_reservation";
    }
  }
}
