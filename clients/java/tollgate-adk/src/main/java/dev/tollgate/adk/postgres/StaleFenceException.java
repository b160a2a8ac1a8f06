package dev.tollgate.adk.postgres;

/**
 * The write carried a database fence that is no longer the session's: another turn took the
 * session since (its lease expired under this one, or the lease store lost its data). The turn that
 * holds it must stop; nothing of the write was written.
 */
public final class StaleFenceException extends FenceException {
  private static final long serialVersionUID = 1L;

  private final long fence;
  private final long latest;

  StaleFenceException(String session, long fence, long latest) {
    super(
        "fence "
            + fence
            + " of session "
            + session
            + " is stale: the session was taken again (latest fence "
            + latest
            + ")");
    this.fence = fence;
    this.latest = latest;
  }

  /**
   * The fence number the write carried.
   *
   * @return the number
   */
  public long fence() {
    return fence;
  }

  /**
   * The session's current fence number (0 when its fence row is gone: the session was erased).
   *
   * @return the number
   */
  public long latest() {
    return latest;
  }

  @Override
  public String code() {
    return "session.fence_stale";
  }
}
