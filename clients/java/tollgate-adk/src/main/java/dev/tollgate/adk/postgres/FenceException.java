package dev.tollgate.adk.postgres;

import com.google.adk.sessions.SessionException;

/**
 * A write refused because it did not carry the session's current database fence: nothing of it was
 * written. {@link #code()} tells the two cases apart, as the sidecar's and adk-rust's errors do.
 */
public abstract sealed class FenceException extends SessionException
    permits StaleFenceException, FenceNotHeldException {
  private static final long serialVersionUID = 1L;

  FenceException(String message) {
    super(message);
  }

  /**
   * The error's code: {@code session.fence_stale} or {@code session.fence_not_held}.
   *
   * @return the code
   */
  public abstract String code();
}
