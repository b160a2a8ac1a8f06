package dev.tollgate.adk.postgres;

import com.zaxxer.hikari.HikariConfig;
import com.zaxxer.hikari.HikariDataSource;

/** The HikariCP pool {@link PgSessionService#connect} makes (the one class that names HikariCP). */
final class Pools {
  private Pools() {}

  static HikariDataSource hikari(String jdbcUrl, PgSessionService.PoolBounds bounds) {
    HikariConfig config = new HikariConfig();
    config.setJdbcUrl(jdbcUrl);
    config.setPoolName("tollgate-sessions");
    config.setMaximumPoolSize(bounds.maxConnections());
    config.setMinimumIdle(Math.min(2, bounds.maxConnections()));
    config.setConnectionTimeout(Math.max(250, bounds.acquireTimeout().toMillis()));
    // PostgreSQL cancels a statement past it: the write fails whole.
    config.addDataSourceProperty(
        "options", "-c statement_timeout=" + bounds.statementTimeout().toMillis());
    config.addDataSourceProperty("connectTimeout", Math.max(1, bounds.acquireTimeout().toSeconds()));
    // Start without the database: an outage is each operation's transient error, not the
    // constructor's.
    config.setInitializationFailTimeout(-1);
    return new HikariDataSource(config);
  }
}
