package dev.tollgate.client;

import java.util.Objects;

/**
 * One live run lease in a user's admin view.
 *
 * @param invocationId the run
 * @param expiresAtMs when the lease expires, ms since the Unix epoch
 */
public record LeaseView(String invocationId, long expiresAtMs) {
  /**
   * Checks the components.
   *
   * @param invocationId the run
   * @param expiresAtMs when the lease expires, ms since the Unix epoch
   */
  public LeaseView {
    Objects.requireNonNull(invocationId, "invocationId");
  }
}
