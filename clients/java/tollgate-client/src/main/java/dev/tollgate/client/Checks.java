package dev.tollgate.client;

import java.util.Objects;
import java.util.Optional;
import java.util.OptionalLong;

/** Argument checks shared by the records. */
final class Checks {
  private Checks() {}

  static void refusal(String message, Optional<String> limit, OptionalLong retryAfterMs) {
    Objects.requireNonNull(message, "message");
    Objects.requireNonNull(limit, "limit");
    Objects.requireNonNull(retryAfterMs, "retryAfterMs");
  }

  static String id(String value, String name) {
    Objects.requireNonNull(value, name);
    return value;
  }
}
