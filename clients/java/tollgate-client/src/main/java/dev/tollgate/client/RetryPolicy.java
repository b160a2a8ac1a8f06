package dev.tollgate.client;

import java.time.Duration;
import java.util.Objects;

/**
 * Retries of 503 answers ({@code store_unavailable}, {@code store_full}) and 429 {@code
 * overloaded}, and of nothing else: a refusal is a decision, not a fault.
 *
 * <p>Retry {@code n} (from 0) waits full jitter, a uniform draw from {@code [0, min(maxBackoff,
 * baseDelay * 2^n)]}, raised to the sidecar's hint ({@code retry_after_ms} or {@code Retry-After})
 * when it gives one. A hint longer than {@code maxDelay} is not waited out: the fault is raised at
 * once. Provider permits, provider feedback, budget top-ups and reloads are never retried (a
 * repeat could take or grant twice); a reserve always carries a request id, so its retry never
 * charges twice.
 *
 * @param maxRetries retries after the first attempt (0: none)
 * @param baseDelay the first backoff's ceiling
 * @param maxBackoff the ceiling of any backoff
 * @param maxDelay the longest single delay, a hint included
 */
public record RetryPolicy(
    int maxRetries, Duration baseDelay, Duration maxBackoff, Duration maxDelay) {

  /**
   * Checks the components.
   *
   * @param maxRetries retries after the first attempt (0: none)
   * @param baseDelay the first backoff's ceiling
   * @param maxBackoff the ceiling of any backoff
   * @param maxDelay the longest single delay, a hint included
   */
  public RetryPolicy {
    if (maxRetries < 0) {
      throw new IllegalArgumentException("maxRetries must not be negative, got " + maxRetries);
    }
    for (Duration d : new Duration[] {baseDelay, maxBackoff, maxDelay}) {
      Objects.requireNonNull(d, "delay");
      if (d.isNegative()) {
        throw new IllegalArgumentException("retry delays must not be negative, got " + d);
      }
    }
  }

  /**
   * Two retries, backoff from 100 ms up to 2 s, hints waited out up to 5 s.
   *
   * @return the default policy
   */
  public static RetryPolicy defaults() {
    return new RetryPolicy(2, Duration.ofMillis(100), Duration.ofSeconds(2), Duration.ofSeconds(5));
  }

  /**
   * No retries: every 503 and 429 {@code overloaded} is raised at once.
   *
   * @return the policy
   */
  public static RetryPolicy none() {
    return new RetryPolicy(0, Duration.ZERO, Duration.ZERO, Duration.ZERO);
  }

  /**
   * The delay before retry {@code attempt}, or {@code -1} when a hint is beyond {@code
   * maxDelay}.
   *
   * @param attempt the retry's number, from 0
   * @param hintMs the sidecar's hint, or {@code -1}
   * @param uniform a uniform draw from [0, 1)
   * @return milliseconds, or {@code -1}: do not retry
   */
  long delayMs(int attempt, long hintMs, double uniform) {
    long max = maxDelay.toMillis();
    if (hintMs > max) {
      return -1;
    }
    long ceiling = maxBackoff.toMillis();
    long base = baseDelay.toMillis();
    if (attempt < 62 && base <= (ceiling >> Math.min(attempt, 62))) {
      ceiling = Math.min(ceiling, base << attempt);
    }
    long jitter = (long) (uniform * ceiling);
    return Math.min(Math.max(hintMs, jitter), max);
  }
}
