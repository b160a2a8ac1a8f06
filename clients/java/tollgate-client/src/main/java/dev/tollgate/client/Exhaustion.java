package dev.tollgate.client;

import java.util.Objects;

/**
 * A replica's exhaustion hold on a provider key: its permits fail fast until {@code untilMs}.
 *
 * @param untilMs until when permits fail fast on the replica, ms since the Unix epoch
 * @param remainingMs how long that is from the answer
 * @param reason what the provider said
 */
public record Exhaustion(long untilMs, long remainingMs, String reason) {
  /**
   * Checks the components.
   *
   * @param untilMs until when permits fail fast on the replica, ms since the Unix epoch
   * @param remainingMs how long that is from the answer
   * @param reason what the provider said
   */
  public Exhaustion {
    Objects.requireNonNull(reason, "reason");
  }
}
