package dev.tollgate.client;

import java.util.Objects;
import java.util.Optional;

/**
 * A turn admitted ({@code POST /v1/runs}), with the numbers of the user's plan a client needs, as
 * in force when the turn was admitted.
 *
 * @param leaseExpiresAtMs the run lease's expiry, ms since the Unix epoch
 * @param leaseTtlMs the plan's run lease TTL: renew the run every third of it
 * @param estimateTokens what to reserve for a model call before anything is known of it
 * @param maxWaitMs the longest wait a reservation is granted with
 * @param maxLlmCalls how many reservations one run may make
 * @param session the session lease, when the admission named a session
 */
public record Admitted(
    long leaseExpiresAtMs,
    long leaseTtlMs,
    long estimateTokens,
    long maxWaitMs,
    long maxLlmCalls,
    Optional<SessionLease> session) {
  /**
   * Checks the components.
   *
   * @param leaseExpiresAtMs the run lease's expiry, ms since the Unix epoch
   * @param leaseTtlMs the plan's run lease TTL: renew the run every third of it
   * @param estimateTokens what to reserve for a model call before anything is known of it
   * @param maxWaitMs the longest wait a reservation is granted with
   * @param maxLlmCalls how many reservations one run may make
   * @param session the session lease, when the admission named a session
   */
  public Admitted {
    Objects.requireNonNull(session, "session");
  }
}
