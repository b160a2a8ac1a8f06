package dev.tollgate.client;

import java.util.List;
import java.util.Objects;
import java.util.Optional;
import java.util.OptionalLong;

/**
 * A provider key's state ({@code GET /admin/providers}).
 *
 * @param provider the provider
 * @param model the model
 * @param cooldownUntilMs the end of the fleet-wide cooldown, ms since the Unix epoch, if one runs
 * @param cooldownRemainingMs how long the cooldown still runs ({@code 0}: none)
 * @param effectivePermille the rate after AIMD, permille of the configured one
 * @param exhausted this replica's exhaustion hold, if any
 * @param tenants its configured tenants and those its fair sharing holds, by name
 */
public record ProviderView(
    String provider,
    String model,
    OptionalLong cooldownUntilMs,
    long cooldownRemainingMs,
    int effectivePermille,
    Optional<Exhaustion> exhausted,
    List<ProviderTenant> tenants) {
  /**
   * Checks the components.
   *
   * @param provider the provider
   * @param model the model
   * @param cooldownUntilMs the end of the fleet-wide cooldown, ms since the Unix epoch, if one runs
   * @param cooldownRemainingMs how long the cooldown still runs ({@code 0}: none)
   * @param effectivePermille the rate after AIMD, permille of the configured one
   * @param exhausted this replica's exhaustion hold, if any
   * @param tenants its configured tenants and those its fair sharing holds, by name
   */
  public ProviderView {
    Objects.requireNonNull(provider, "provider");
    Objects.requireNonNull(model, "model");
    Objects.requireNonNull(cooldownUntilMs, "cooldownUntilMs");
    Objects.requireNonNull(exhausted, "exhausted");
    tenants = List.copyOf(tenants);
  }
}
