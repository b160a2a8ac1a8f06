package dev.tollgate.client;

/**
 * A run lease renewed.
 *
 * @param leaseExpiresAtMs the lease's new expiry, ms since the Unix epoch
 */
public record Renewed(long leaseExpiresAtMs) {}
