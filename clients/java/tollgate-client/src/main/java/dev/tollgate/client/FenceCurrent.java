package dev.tollgate.client;

/**
 * A fence check that passed: the fence is the session's latest. A stale one is the refusal
 * {@link Refusal.StaleFence}.
 *
 * @param current always {@code true}
 */
public record FenceCurrent(boolean current) {}
