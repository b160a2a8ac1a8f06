package dev.tollgate.adk;

import com.zaxxer.hikari.HikariConfig;
import com.zaxxer.hikari.HikariDataSource;
import java.net.URI;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Assertions;
import org.junit.jupiter.api.Assumptions;

/**
 * A fresh, empty database in the suite's PostgreSQL ({@code TOLLGATE_TEST_PG_URL}, which {@code
 * ./scripts/test} sets to a cluster of its own), dropped on close. Without the variable the test is
 * skipped, or fails when {@code TOLLGATE_TEST_REQUIRE_PG} is set (as the suite does).
 */
final class PgDatabase implements AutoCloseable {
  private static final AtomicInteger N = new AtomicInteger();

  private final String base;
  private final String user;
  private final String name;
  private final List<HikariDataSource> pools = new ArrayList<>();

  private PgDatabase(String base, String user, String name) {
    this.base = base;
    this.user = user;
    this.name = name;
  }

  static PgDatabase create() {
    String url = System.getenv("TOLLGATE_TEST_PG_URL");
    if (url == null || url.isEmpty()) {
      if (System.getenv("TOLLGATE_TEST_REQUIRE_PG") != null) {
        Assertions.fail("TOLLGATE_TEST_PG_URL is not set (TOLLGATE_TEST_REQUIRE_PG is set)");
      }
      Assumptions.abort("TOLLGATE_TEST_PG_URL is not set: run ./scripts/test");
    }
    URI u = URI.create(url);
    String base = "jdbc:postgresql://" + u.getHost() + ":" + u.getPort() + "/";
    String user = u.getUserInfo();
    String name = "tg_java_" + ProcessHandle.current().pid() + "_" + N.getAndIncrement();
    PgDatabase db = new PgDatabase(base, user, name);
    db.admin("CREATE DATABASE " + name, u.getPath().substring(1));
    return db;
  }

  /** The database's JDBC URL. */
  String jdbcUrl() {
    return base + name + "?user=" + user;
  }

  /** A pool of {@code max} connections on the database, closed with it. */
  HikariDataSource pool(int max) {
    HikariConfig config = new HikariConfig();
    config.setJdbcUrl(jdbcUrl());
    config.setMaximumPoolSize(max);
    config.setConnectionTimeout(5_000);
    HikariDataSource pool = new HikariDataSource(config);
    pools.add(pool);
    return pool;
  }

  /** Runs one statement on the database. */
  void execute(String sql) {
    try (Connection c = DriverManager.getConnection(jdbcUrl());
        Statement st = c.createStatement()) {
      st.execute(sql);
    } catch (SQLException e) {
      throw new IllegalStateException(sql, e);
    }
  }

  /** The first column of the first row of {@code sql}, as a long. */
  long count(String sql) {
    try (Connection c = DriverManager.getConnection(jdbcUrl());
        Statement st = c.createStatement();
        var rs = st.executeQuery(sql)) {
      rs.next();
      return rs.getLong(1);
    } catch (SQLException e) {
      throw new IllegalStateException(sql, e);
    }
  }

  private void admin(String sql, String adminDb) {
    try (Connection c = DriverManager.getConnection(base + adminDb + "?user=" + user);
        Statement st = c.createStatement()) {
      st.execute(sql);
    } catch (SQLException e) {
      throw new IllegalStateException(sql, e);
    }
  }

  @Override
  public void close() {
    pools.forEach(HikariDataSource::close);
    admin("DROP DATABASE " + name + " WITH (FORCE)", "postgres");
  }
}
