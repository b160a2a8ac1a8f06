package dev.tollgate.client;

/**
 * The answer to a release (of a run, a session lease, or an admin's force release).
 *
 * @param released whether a lease was released ({@code false}: it held nothing, which is not an
 *     error, or the release is pending)
 * @param pending the sidecar's store failed: the release is journalled and applied when the store
 *     answers again. Treat it as done.
 */
public record Released(boolean released, boolean pending) {
  /**
   * Always {@code true}: a pending release is as good as a done one.
   *
   * @return {@code true}
   */
  public boolean done() {
    return true;
  }
}
