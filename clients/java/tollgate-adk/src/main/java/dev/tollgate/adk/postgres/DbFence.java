package dev.tollgate.adk.postgres;

import java.util.Objects;
import java.util.UUID;

/**
 * A session's database fence (docs/spec.md §4, <i>Sessions in PostgreSQL</i>): the number
 * PostgreSQL issued with the take that made it current, and the token it drew with it. A write
 * carrying it lands only while the session's row in {@code tollgate_session_fences} still holds
 * both.
 *
 * @param number the fence number, from 1, growing with each take
 * @param token the random token drawn with the number: equal numbers from two histories of the row
 *     never carry equal tokens
 */
public record DbFence(long number, UUID token) {
  /**
   * A fence.
   *
   * @param number from 1
   * @param token the token
   */
  public DbFence {
    if (number < 1) {
      throw new IllegalArgumentException("a fence number is at least 1, got " + number);
    }
    Objects.requireNonNull(token, "token");
  }
}
