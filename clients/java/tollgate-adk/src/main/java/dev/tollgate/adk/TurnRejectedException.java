package dev.tollgate.adk;

import dev.tollgate.client.Refusal;
import java.util.Optional;
import java.util.OptionalLong;

/**
 * A turn {@link TurnExecutor} did not start: the process is at its in-flight cap ({@link
 * #status()} 429, {@code error} {@code overloaded}), or the session's lease is held by another turn
 * ({@link Refusal.SessionBusy}, 409, {@link #retryAfterMs()} its remaining TTL) or the user has too
 * many sessions ({@link Refusal.SessionsLimited}, 429). Nothing was taken. Map it to the HTTP
 * status it carries, with {@code Retry-After}.
 */
public final class TurnRejectedException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  private final String error;
  private final int status;
  private final long retryAfterMs;
  private final transient Refusal refusal;

  TurnRejectedException(String error, int status, long retryAfterMs, Refusal refusal, String message) {
    super(message);
    this.error = error;
    this.status = status;
    this.retryAfterMs = retryAfterMs;
    this.refusal = refusal;
  }

  static TurnRejectedException overloaded(int inFlight, int cap, long retryAfterMs) {
    return new TurnRejectedException(
        "overloaded",
        429,
        retryAfterMs,
        null,
        inFlight + " turns in flight in this process (cap " + cap + "): retry in " + retryAfterMs + " ms");
  }

  static TurnRejectedException refused(Refusal refusal) {
    int status = refusal instanceof Refusal.SessionBusy ? 409 : 429;
    return new TurnRejectedException(
        refusal.error(), status, refusal.retryAfterMs().orElse(-1), refusal, refusal.message());
  }

  /**
   * Why: {@code overloaded}, or the sidecar's refusal code ({@code session_busy}, {@code
   * sessions}).
   *
   * @return the code
   */
  public String error() {
    return error;
  }

  /**
   * The HTTP status to answer the turn's caller with: 429, or 409 for a busy session.
   *
   * @return the status
   */
  public int status() {
    return status;
  }

  /**
   * When a retry may succeed.
   *
   * @return milliseconds, when known
   */
  public OptionalLong retryAfterMs() {
    return retryAfterMs < 0 ? OptionalLong.empty() : OptionalLong.of(retryAfterMs);
  }

  /**
   * The sidecar's refusal, when the session lease was refused.
   *
   * @return the refusal, absent for the process's cap
   */
  public Optional<Refusal> refusal() {
    return Optional.ofNullable(refusal);
  }
}
