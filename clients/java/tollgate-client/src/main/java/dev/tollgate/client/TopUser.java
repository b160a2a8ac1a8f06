package dev.tollgate.client;

import java.util.Objects;

/**
 * One row of {@code GET /admin/top}.
 *
 * @param user the user id
 * @param tokensLastMinute the tokens the user was charged over the last minute
 */
public record TopUser(String user, long tokensLastMinute) {
  /**
   * Checks the components.
   *
   * @param user the user id
   * @param tokensLastMinute the tokens the user was charged over the last minute
   */
  public TopUser {
    Objects.requireNonNull(user, "user");
  }
}
