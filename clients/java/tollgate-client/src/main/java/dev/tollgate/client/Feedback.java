package dev.tollgate.client;

import java.util.Objects;
import java.util.Optional;
import java.util.OptionalInt;
import java.util.OptionalLong;

/**
 * How the sidecar classified and applied a provider's answer ({@code POST
 * /v1/providers/{provider}/feedback}).
 *
 * @param classification {@code success}, {@code throttled} (a per-minute 429), {@code exhausted}
 *     (per-day or billing: permits now fail with {@link Refusal.ProviderExhausted}), {@code
 *     server_error} (retry with backoff) or {@code client_error} (do not retry); the wire field
 *     {@code class}
 * @param retryable whether the provider call may be retried
 * @param retryAfterMs the provider's hint as clamped, if it gave one
 * @param cooldownUntilMs the provider key's cooldown end after it, when it set or extended one
 * @param effectivePermille the rate after it, when it changed
 * @param reason why permits fail fast, for {@code exhausted}
 */
public record Feedback(
    String classification,
    boolean retryable,
    OptionalLong retryAfterMs,
    OptionalLong cooldownUntilMs,
    OptionalInt effectivePermille,
    Optional<String> reason) {
  /**
   * Checks the components.
   *
   * @param classification {@code success}, {@code throttled} (a per-minute 429), {@code exhausted} (per-day or billing: permits now fail with {@link Refusal.ProviderExhausted}), {@code server_error} (retry with backoff) or {@code client_error} (do not retry); the wire field {@code class}
   * @param retryable whether the provider call may be retried
   * @param retryAfterMs the provider's hint as clamped, if it gave one
   * @param cooldownUntilMs the provider key's cooldown end after it, when it set or extended one
   * @param effectivePermille the rate after it, when it changed
   * @param reason why permits fail fast, for {@code exhausted}
   */
  public Feedback {
    Objects.requireNonNull(classification, "classification");
    Objects.requireNonNull(retryAfterMs, "retryAfterMs");
    Objects.requireNonNull(cooldownUntilMs, "cooldownUntilMs");
    Objects.requireNonNull(effectivePermille, "effectivePermille");
    Objects.requireNonNull(reason, "reason");
  }
}
