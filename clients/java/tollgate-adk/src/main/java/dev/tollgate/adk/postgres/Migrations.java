package dev.tollgate.adk.postgres;

import com.google.adk.sessions.SessionException;
import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.List;
import javax.sql.DataSource;

/**
 * tollgate's versioned schema in a session database: the migrations every tollgate client applies
 * (Rust, Java, Python: the files of {@code crates/tollgate-adk/migrations}, packaged in this jar),
 * each once, in order, in its own transaction, under the session-level advisory lock {@link
 * #LOCK_KEY}, so replicas starting together do not race: one migrates, the others find it done.
 */
public final class Migrations {
  /** The advisory lock the migrations are applied under: the bytes of "tollgate". */
  public static final long LOCK_KEY = 0x746f6c6c67617465L;

  /** This version's migrations, in order. */
  public static final List<Migration> ALL =
      List.of(new Migration(1, "session fences"), new Migration(2, "java sessions"));

  /** The tables tollgate owns in a session database, the registry first. */
  public static final List<String> TABLES =
      List.of(
          "tollgate_schema_migrations",
          "tollgate_session_fences",
          "tollgate_java_sessions",
          "tollgate_java_events",
          "tollgate_java_app_states",
          "tollgate_java_user_states");

  private static final String REGISTRY =
      "CREATE TABLE IF NOT EXISTS tollgate_schema_migrations ("
          + " version BIGINT PRIMARY KEY, description TEXT NOT NULL,"
          + " applied_at TIMESTAMPTZ NOT NULL DEFAULT now())";

  private Migrations() {}

  /**
   * One schema change.
   *
   * @param version the version it brings the schema to (from 1, consecutive)
   * @param description what it does, recorded with it
   */
  public record Migration(long version, String description) {
    /**
     * Its file: {@code NNNN_words.sql}.
     *
     * @return the file name
     */
    public String file() {
      return String.format("%04d_%s.sql", version, description.replace(' ', '_'));
    }

    /**
     * Its statements, from the jar.
     *
     * @return the SQL
     */
    public String sql() {
      try (InputStream in = Migrations.class.getResourceAsStream("migrations/" + file())) {
        if (in == null) {
          throw new IllegalStateException("migration " + file() + " is missing from the jar");
        }
        return new String(in.readAllBytes(), StandardCharsets.UTF_8);
      } catch (IOException e) {
        throw new UncheckedIOException(e);
      }
    }
  }

  /**
   * The database was migrated by a newer tollgate: this one does not know its schema and will not
   * write to it.
   */
  public static final class SchemaTooNewException extends SessionException {
    private static final long serialVersionUID = 1L;

    private final long found;
    private final long known;

    SchemaTooNewException(long found, long known) {
      super(
          "the session database's schema is at version "
              + found
              + ", newer than this tollgate knows ("
              + known
              + "): upgrade tollgate");
      this.found = found;
      this.known = known;
    }

    /**
     * The database's version.
     *
     * @return the version
     */
    public long found() {
      return found;
    }

    /**
     * The newest this tollgate knows.
     *
     * @return the version
     */
    public long known() {
      return known;
    }
  }

  /**
   * Brings tollgate's tables to this version's schema (blocking).
   *
   * @param dataSource the session database
   * @return the versions applied now (empty when the schema was current)
   * @throws SessionDatabaseException the database failed (nothing of a failed migration is applied)
   * @throws SchemaTooNewException a newer tollgate migrated the database
   */
  public static List<Long> migrate(DataSource dataSource) {
    try (Connection c = dataSource.getConnection()) {
      c.setAutoCommit(true);
      try (PreparedStatement lock = c.prepareStatement("SELECT pg_advisory_lock(?)")) {
        lock.setLong(1, LOCK_KEY);
        lock.execute();
      }
      try {
        return apply(c);
      } finally {
        try (PreparedStatement unlock = c.prepareStatement("SELECT pg_advisory_unlock(?)")) {
          unlock.setLong(1, LOCK_KEY);
          unlock.execute();
        } catch (SQLException e) {
          // It may still hold the lock: never give it back to a pool.
          c.abort(Runnable::run);
        }
      }
    } catch (SQLException e) {
      throw SessionDatabaseException.of("migrate", e);
    }
  }

  private static List<Long> apply(Connection c) throws SQLException {
    try (Statement st = c.createStatement()) {
      st.execute(REGISTRY);
    }
    List<Long> applied = new ArrayList<>();
    try (Statement st = c.createStatement();
        ResultSet rs = st.executeQuery("SELECT version FROM tollgate_schema_migrations")) {
      while (rs.next()) {
        applied.add(rs.getLong(1));
      }
    }
    long known = ALL.get(ALL.size() - 1).version();
    long found = applied.stream().mapToLong(Long::longValue).max().orElse(0);
    if (found > known) {
      throw new SchemaTooNewException(found, known);
    }
    List<Long> done = new ArrayList<>();
    for (Migration m : ALL) {
      if (applied.contains(m.version())) {
        continue;
      }
      c.setAutoCommit(false);
      try (Statement st = c.createStatement();
          PreparedStatement record =
              c.prepareStatement(
                  "INSERT INTO tollgate_schema_migrations (version, description) VALUES (?, ?)")) {
        st.execute(m.sql());
        record.setLong(1, m.version());
        record.setString(2, m.description());
        record.executeUpdate();
        c.commit();
      } catch (SQLException | RuntimeException e) {
        c.rollback();
        throw e;
      } finally {
        c.setAutoCommit(true);
      }
      done.add(m.version());
    }
    return done;
  }

  /**
   * The newest version applied to the database (0: none).
   *
   * @param dataSource the session database
   * @return the version
   * @throws SessionDatabaseException the database failed
   */
  public static long schemaVersion(DataSource dataSource) {
    try (Connection c = dataSource.getConnection();
        Statement st = c.createStatement();
        ResultSet exists =
            st.executeQuery("SELECT to_regclass('tollgate_schema_migrations') IS NOT NULL")) {
      exists.next();
      if (!exists.getBoolean(1)) {
        return 0;
      }
      try (Statement max = c.createStatement();
          ResultSet rs =
              max.executeQuery("SELECT COALESCE(MAX(version), 0) FROM tollgate_schema_migrations")) {
        rs.next();
        return rs.getLong(1);
      }
    } catch (SQLException e) {
      throw SessionDatabaseException.of("schema version", e);
    }
  }
}
