package dev.tollgate.client;

/**
 * A permit to call a model provider.
 *
 * @param waitMs how long to wait before calling the provider ({@code 0} when the sidecar already
 *     waited)
 * @param effectivePermille the provider key's current rate, permille of the configured one (AIMD)
 */
public record ProviderPermit(long waitMs, int effectivePermille) {}
