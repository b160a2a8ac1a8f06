package dev.tollgate.client;

import java.util.Objects;
import java.util.Optional;
import java.util.OptionalLong;

/**
 * What {@code POST /admin/providers/{provider}/{model}/clear} cleared.
 *
 * @param provider the provider
 * @param model the model
 * @param cooldownUntilMs the end of the cooldown that was cleared (absent: none was live)
 * @param effectivePermille the rate before ({@code 1000}: AIMD was at full rate)
 * @param exhausted this replica's exhaustion hold that was cleared (absent: none)
 */
public record ProviderCleared(
    String provider,
    String model,
    OptionalLong cooldownUntilMs,
    int effectivePermille,
    Optional<Exhaustion> exhausted) {
  /**
   * Checks the components.
   *
   * @param provider the provider
   * @param model the model
   * @param cooldownUntilMs the end of the cooldown that was cleared (absent: none was live)
   * @param effectivePermille the rate before ({@code 1000}: AIMD was at full rate)
   * @param exhausted this replica's exhaustion hold that was cleared (absent: none)
   */
  public ProviderCleared {
    Objects.requireNonNull(provider, "provider");
    Objects.requireNonNull(model, "model");
    Objects.requireNonNull(cooldownUntilMs, "cooldownUntilMs");
    Objects.requireNonNull(exhausted, "exhausted");
  }
}
