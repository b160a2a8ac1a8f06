package dev.tollgate.adk.postgres;

import com.google.adk.sessions.SessionException;
import java.sql.SQLException;
import java.sql.SQLTransientException;

/**
 * The session database failed an operation; nothing of a failed write was written. {@link
 * #isTransient()} says whether retrying later can help (the database unreachable, the pool out of
 * connections for its timeout, a statement cancelled at its timeout, a serialization failure).
 */
public final class SessionDatabaseException extends SessionException {
  private static final long serialVersionUID = 1L;

  private final String code;

  SessionDatabaseException(String code, String message, Throwable cause) {
    super(message, cause);
    this.code = code;
  }

  static SessionDatabaseException of(String what, SQLException e) {
    boolean transientFault = isTransient(e);
    return new SessionDatabaseException(
        transientFault ? "session.database_unavailable" : "session.database_error",
        "session database: " + what + ": " + e.getMessage(),
        e);
  }

  /** Connection failures (08), resources (53), operator intervention (57: shutdown, statement
   * timeout), serialization failure and deadlock (40001, 40P01). */
  private static boolean isTransient(SQLException e) {
    if (e instanceof SQLTransientException) {
      return true;
    }
    String state = e.getSQLState();
    if (state == null) {
      return false;
    }
    return state.startsWith("08")
        || state.startsWith("53")
        || state.startsWith("57")
        || state.equals("40001")
        || state.equals("40P01");
  }

  /**
   * The error's code: {@code session.database_unavailable} (transient), {@code
   * session.database_error} or {@code session.already_exists}.
   *
   * @return the code
   */
  public String code() {
    return code;
  }

  /**
   * Whether retrying later can succeed.
   *
   * @return {@code true} for {@code session.database_unavailable}
   */
  public boolean isTransient() {
    return code.equals("session.database_unavailable");
  }
}
