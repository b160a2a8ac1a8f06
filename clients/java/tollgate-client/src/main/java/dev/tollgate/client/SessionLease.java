package dev.tollgate.client;

/**
 * A session lease: the holder's fencing number and the lease's expiry (docs/spec.md §4).
 *
 * @param fence the fencing number: every session write of the holder carries it, and a store that
 *     checks it refuses a stale holder's writes
 * @param expiresAtMs when the lease expires unless renewed, ms since the Unix epoch
 */
public record SessionLease(long fence, long expiresAtMs) {}
