package dev.tollgate.client;

import java.util.List;

/**
 * The answer to {@code POST /admin/reload}: plans, users, overrides, providers and RLS rules were
 * applied. A config the sidecar refuses is {@link TollgateException.InvalidRequest} ({@code
 * invalid_config}), and the old config keeps serving.
 *
 * @param reloaded always {@code true}
 * @param needsRestart settings changed since start that keep their running values until a
 *     restart ({@code listen}, {@code store}, ...)
 */
public record Reloaded(boolean reloaded, List<String> needsRestart) {
  /**
   * Checks and copies the components.
   *
   * @param reloaded always {@code true}
   * @param needsRestart settings changed since start that keep their running values until a restart ({@code listen}, {@code store}, ...)
   */
  public Reloaded {
    needsRestart = List.copyOf(needsRestart);
  }
}
