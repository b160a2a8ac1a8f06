package dev.tollgate.client;

import java.util.Objects;
import java.util.OptionalLong;

/**
 * The answer to a settle or a refund.
 *
 * @param balance the user's token level after it, in whole tokens (negative while in debt);
 *     absent when the close is pending
 * @param pending the sidecar's store failed: the close is journalled and applied when the store
 *     answers again. Treat it as done.
 */
public record Closed(OptionalLong balance, boolean pending) {
  /**
   * Checks the components.
   *
   * @param balance the user's token level after it, in whole tokens (negative while in debt); absent when the close is pending
   * @param pending the sidecar's store failed: the close is journalled and applied when the store answers again. Treat it as done.
   */
  public Closed {
    Objects.requireNonNull(balance, "balance");
  }

  /**
   * Always {@code true}: a pending close is as good as a done one.
   *
   * @return {@code true}
   */
  public boolean done() {
    return true;
  }
}
