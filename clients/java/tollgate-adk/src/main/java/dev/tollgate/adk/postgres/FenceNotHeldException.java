package dev.tollgate.adk.postgres;

/**
 * The write carried no database fence: it was not made by a turn of a {@link
 * dev.tollgate.adk.TurnExecutor} given this session service (nor with a fence put in the session's
 * state under {@link PgSessionService#FENCE_KEY}).
 */
public final class FenceNotHeldException extends FenceException {
  private static final long serialVersionUID = 1L;

  FenceNotHeldException(String session) {
    super("no database fence is held on session " + session + ": appends are made by a fenced turn");
  }

  @Override
  public String code() {
    return "session.fence_not_held";
  }
}
