package dev.tollgate.client;

import java.util.Objects;
import java.util.OptionalDouble;
import java.util.OptionalInt;

/**
 * A tenant of a provider key in its admin view (docs/spec.md §5, <i>Fair sharing</i>).
 *
 * @param name the tenant ({@code {others}}: unconfigured tenants past the key's 64; {@code
 *     {none}}: permits naming none)
 * @param weight its configured weight, if any
 * @param share its configured ceiling, a fraction of the pool, if any
 * @param active whether it asked within the key's {@code max_wait_ms}
 * @param bookedAheadMs how far ahead of its weighted share it has booked, ms at the current
 *     sharing ({@code 0}: not ahead)
 * @param recentShare a configured tenant's part of the permits granted on that replica in the last
 *     minute, if any were
 */
public record ProviderTenant(
    String name,
    OptionalInt weight,
    OptionalDouble share,
    boolean active,
    long bookedAheadMs,
    OptionalDouble recentShare) {
  /**
   * Checks the components.
   *
   * @param name the tenant
   * @param weight its configured weight, if any
   * @param share its configured ceiling, if any
   * @param active whether it asked within the key's {@code max_wait_ms}
   * @param bookedAheadMs how far ahead of its weighted share it has booked, ms
   * @param recentShare its recent part of the permits granted, if any
   */
  public ProviderTenant {
    Objects.requireNonNull(name, "name");
    Objects.requireNonNull(weight, "weight");
    Objects.requireNonNull(share, "share");
    Objects.requireNonNull(recentShare, "recentShare");
  }
}
