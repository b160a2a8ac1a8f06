package dev.tollgate.adk;

import dev.tollgate.adk.postgres.DbFence;
import java.util.Optional;

/**
 * The session lease a turn of {@link TurnExecutor} runs under: code the runner calls (a session
 * service that checks fences) reads it with {@link TurnExecutor#turn(String)}.
 */
public final class Turn {
  private final String userId;
  private final String sessionId;
  private final String holder;
  private volatile long fence;
  private volatile DbFence db;
  private volatile boolean lost;

  Turn(String userId, String sessionId, String holder) {
    this.userId = userId;
    this.sessionId = sessionId;
    this.holder = holder;
  }

  /**
   * The turn's user.
   *
   * @return the user id
   */
  public String userId() {
    return userId;
  }

  /**
   * The session.
   *
   * @return the session id
   */
  public String sessionId() {
    return sessionId;
  }

  /**
   * The lease's holder, a token of this turn's own.
   *
   * @return the holder
   */
  public String holder() {
    return holder;
  }

  /**
   * The fencing number the lease was taken with: a write to the session store carries it, and a
   * store that checks it refuses a stale turn's writes.
   *
   * @return the fence
   */
  public long fence() {
    return fence;
  }

  /**
   * The database fence the turn's appends carry, when sessions live in PostgreSQL ({@link
   * TurnExecutor.Builder#postgresSessions}): the one the session service checks. {@link #fence()}
   * is the lease's, which the sidecar's fence check answers for.
   *
   * @return the database fence, once taken
   */
  public Optional<DbFence> db() {
    return Optional.ofNullable(db);
  }

  /**
   * Whether a renewal found the lease gone (taken over after it expired): the fence is then stale.
   *
   * @return {@code true} once lost
   */
  public boolean lost() {
    return lost;
  }

  void fence(long fence) {
    this.fence = fence;
  }

  void db(DbFence db) {
    this.db = db;
  }

  void lose() {
    this.lost = true;
  }
}
