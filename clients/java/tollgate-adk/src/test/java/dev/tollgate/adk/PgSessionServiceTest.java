package dev.tollgate.adk;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.adk.events.Event;
import com.google.adk.sessions.GetSessionConfig;
import com.google.adk.sessions.Session;
import com.google.adk.sessions.SessionNotFoundException;
import dev.tollgate.adk.postgres.DbFence;
import dev.tollgate.adk.postgres.FenceNotHeldException;
import dev.tollgate.adk.postgres.Migrations;
import dev.tollgate.adk.postgres.PgSessionService;
import dev.tollgate.adk.postgres.SessionDatabaseException;
import dev.tollgate.adk.postgres.StaleFenceException;
import dev.tollgate.client.testing.Processes;
import io.reactivex.rxjava3.schedulers.Schedulers;
import java.io.PrintWriter;
import java.nio.file.Files;
import java.nio.file.Path;
import java.sql.Connection;
import java.sql.SQLException;
import java.sql.SQLFeatureNotSupportedException;
import java.time.Clock;
import java.time.Duration;
import java.time.Instant;
import java.time.ZoneOffset;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.logging.Logger;
import java.util.stream.Collectors;
import java.util.stream.Stream;
import javax.sql.DataSource;
import org.junit.jupiter.api.Test;

/** {@link PgSessionService} and {@link Migrations} in a real PostgreSQL, a database per test. */
class PgSessionServiceTest {
  static final String APP = Adk.APP;

  static PgSessionService service(PgDatabase db) {
    PgSessionService s = PgSessionService.builder(db.pool(8)).build();
    s.migrate().blockingGet();
    return s;
  }

  static Session fenced(PgSessionService s, String user, String id) {
    Session session = s.getSession(APP, user, id, Optional.empty()).blockingGet();
    session.state().put(PgSessionService.FENCE_KEY, s.takeFence(APP, user, id).blockingGet());
    return session;
  }

  static Event event(String id, long at) {
    return SessionScenarioTest.event(id, "helper", "text " + id, at, Map.of());
  }

  static List<String> ids(PgSessionService s, String user, String id) {
    return s.getSession(APP, user, id, Optional.empty()).blockingGet().events().stream()
        .map(Event::id)
        .collect(Collectors.toList());
  }

  @Test
  void migrationsApplyOnceAndAreTheRepositorysFiles() throws Exception {
    try (PgDatabase db = PgDatabase.create()) {
      DataSource ds = db.pool(2);
      assertEquals(0, Migrations.schemaVersion(ds));
      assertEquals(List.of(1L, 2L), Migrations.migrate(ds));
      assertEquals(List.of(), Migrations.migrate(ds));
      assertEquals(2, Migrations.schemaVersion(ds));
      assertEquals(
          Set.copyOf(Migrations.TABLES),
          Set.copyOf(
              tables(db)),
          "tollgate's tables and nothing else");
      // The files every client applies: the Rust crate's directory, packaged in this jar.
      Path dir = Processes.repoRoot().resolve("crates/tollgate-adk/migrations");
      try (Stream<Path> files = Files.list(dir)) {
        assertEquals(
            files.map(p -> p.getFileName().toString()).sorted().collect(Collectors.toList()),
            Migrations.ALL.stream().map(Migrations.Migration::file).collect(Collectors.toList()));
      }
      for (Migrations.Migration m : Migrations.ALL) {
        assertEquals(Files.readString(dir.resolve(m.file())), m.sql());
      }
    }
  }

  static List<String> tables(PgDatabase db) throws SQLException {
    List<String> out = new ArrayList<>();
    try (Connection c = db.pool(1).getConnection();
        var rs = c.createStatement().executeQuery(
            "SELECT table_name::text FROM information_schema.tables WHERE table_schema = 'public'")) {
      while (rs.next()) {
        out.add(rs.getString(1));
      }
    }
    return out;
  }

  @Test
  void replicasMigratingTogetherDoNotRace() throws Exception {
    try (PgDatabase db = PgDatabase.create()) {
      ExecutorService pool = Executors.newFixedThreadPool(6);
      List<Future<List<Long>>> runs = new ArrayList<>();
      for (int i = 0; i < 6; i++) {
        DataSource ds = db.pool(1);
        runs.add(pool.submit(() -> Migrations.migrate(ds)));
      }
      List<Long> applied = new ArrayList<>();
      for (Future<List<Long>> run : runs) {
        applied.addAll(run.get());
      }
      pool.shutdown();
      applied.sort(null);
      assertEquals(List.of(1L, 2L), applied, "each version applied once, by one of them");
      assertEquals(2, db.count("SELECT count(*) FROM tollgate_schema_migrations"));
    }
  }

  @Test
  void aNewerSchemaIsRefused() {
    try (PgDatabase db = PgDatabase.create()) {
      DataSource ds = db.pool(1);
      Migrations.migrate(ds);
      db.execute("INSERT INTO tollgate_schema_migrations (version, description) VALUES (99, 'later')");
      Migrations.SchemaTooNewException e =
          assertThrows(Migrations.SchemaTooNewException.class, () -> Migrations.migrate(ds));
      assertEquals(99, e.found());
      assertEquals(2, e.known());
    }
  }

  @Test
  void appendsAreCheckedAgainstTheDatabaseFence() {
    try (PgDatabase db = PgDatabase.create()) {
      PgSessionService s = service(db);
      s.createSession(APP, "u1", Map.of(), "s1").blockingGet();

      // No fence: refused, nothing written.
      Session bare = s.getSession(APP, "u1", "s1", Optional.empty()).blockingGet();
      FenceNotHeldException none =
          assertThrows(FenceNotHeldException.class, () -> s.appendEvent(bare, event("e0", 1)).blockingGet());
      assertEquals("session.fence_not_held", none.code());

      // The current fence: written, once per event id.
      Session a = fenced(s, "u1", "s1");
      DbFence aFence = (DbFence) a.state().get(PgSessionService.FENCE_KEY);
      assertEquals(2, aFence.number(), "the create took 1");
      s.appendEvent(a, event("e1", 1_000)).blockingGet();
      s.appendEvent(a, event("e1", 1_000)).blockingGet();
      assertEquals(List.of("e1"), ids(s, "u1", "s1"));

      // Another take: a's fence is stale, its write refused whole.
      Session b = fenced(s, "u1", "s1");
      StaleFenceException stale =
          assertThrows(
              StaleFenceException.class,
              () -> s.appendEvent(a, SessionScenarioTest.event("e2", "helper", "late", 2_000,
                  Map.of("k", "v", "app:x", 1, "user:y", 2))).blockingGet());
      assertEquals("session.fence_stale", stale.code());
      assertEquals(2, stale.fence());
      assertEquals(3, stale.latest());
      assertEquals(List.of("e1"), ids(s, "u1", "s1"));
      assertEquals(0, db.count("SELECT count(*) FROM tollgate_java_app_states"), "no app state written");
      assertEquals(0, db.count("SELECT count(*) FROM tollgate_java_user_states"), "no user state written");
      assertFalse(s.getSession(APP, "u1", "s1", Optional.empty()).blockingGet().state().containsKey("k"));
      s.appendEvent(b, event("e3", 3_000)).blockingGet();
      assertEquals(List.of("e1", "e3"), ids(s, "u1", "s1"));

      // The same number with another token (a row erased and taken again) is not current.
      Session forged = s.getSession(APP, "u1", "s1", Optional.empty()).blockingGet();
      DbFence current = (DbFence) b.state().get(PgSessionService.FENCE_KEY);
      forged.state().put(PgSessionService.FENCE_KEY, new DbFence(current.number(), UUID.randomUUID()));
      assertThrows(StaleFenceException.class, () -> s.appendEvent(forged, event("e4", 4_000)).blockingGet());

      // A deleted session: refused even with the current fence, which the delete kept.
      s.deleteSession(APP, "u1", "s1").blockingAwait();
      assertThrows(SessionNotFoundException.class, () -> s.appendEvent(b, event("e5", 5_000)).blockingGet());
      // Created again: a new fence, held by no one; b's is stale.
      s.createSession(APP, "u1", Map.of(), "s1").blockingGet();
      assertThrows(StaleFenceException.class, () -> s.appendEvent(b, event("e6", 6_000)).blockingGet());
      assertEquals(List.of(), ids(s, "u1", "s1"));

      // An event without an id gets one.
      Session c = fenced(s, "u1", "s1");
      Event anonymous = event("x", 7_000);
      anonymous.setId("");
      s.appendEvent(c, anonymous).blockingGet();
      assertEquals(1, ids(s, "u1", "s1").size());
      assertFalse(ids(s, "u1", "s1").get(0).isEmpty());

      // temp: keys, the fence's among them, are never stored.
      assertEquals(0, db.count("SELECT count(*) FROM tollgate_java_events WHERE event::text LIKE '%temp:%'"));
    }
  }

  @Test
  void readsAreBoundedToTheMostRecentEvents() {
    try (PgDatabase db = PgDatabase.create()) {
      PgSessionService s = PgSessionService.builder(db.pool(2)).maxEvents(3).build();
      s.migrate().blockingGet();
      s.createSession(APP, "u1", Map.of(), "s1").blockingGet();
      Session turn = fenced(s, "u1", "s1");
      for (int i = 1; i <= 5; i++) {
        s.appendEvent(turn, event("e" + i, i * 1_000L)).blockingGet();
      }
      assertEquals(List.of("e3", "e4", "e5"), ids(s, "u1", "s1"));
      assertEquals(
          List.of("e4", "e5"),
          s.getSession(APP, "u1", "s1", Optional.of(GetSessionConfig.builder().numRecentEvents(2).build()))
              .blockingGet().events().stream().map(Event::id).collect(Collectors.toList()));
      assertEquals(
          List.of("e3", "e4", "e5"),
          s.getSession(APP, "u1", "s1", Optional.of(GetSessionConfig.builder().numRecentEvents(50).build()))
              .blockingGet().events().stream().map(Event::id).collect(Collectors.toList()));
      assertEquals(3, s.listEvents(APP, "u1", "s1").blockingGet().events().size());
      assertThrows(
          IllegalArgumentException.class,
          () -> s.getSession(APP, "u1", "s1", Optional.of(GetSessionConfig.builder().numRecentEvents(-1).build())));
    }
  }

  @Test
  void everyCallRunsOnTheServicesScheduler() {
    try (PgDatabase db = PgDatabase.create()) {
      Set<String> threads = ConcurrentHashMap.newKeySet();
      DataSource pool = db.pool(2);
      DataSource recording = new Recording(pool, threads);
      ExecutorService own = Executors.newSingleThreadExecutor(r -> new Thread(r, "pg-sessions"));
      PgSessionService s = PgSessionService.builder(recording).scheduler(Schedulers.from(own)).build();
      s.migrate().blockingGet();
      s.createSession(APP, "u1", Map.of(), "s1").blockingGet();
      Session turn = fenced(s, "u1", "s1");
      s.appendEvent(turn, event("e1", 1)).blockingGet();
      s.listSessions(APP, "u1").blockingGet();
      s.listEvents(APP, "u1", "s1").blockingGet();
      s.deleteSession(APP, "u1", "s1").blockingAwait();
      own.shutdown();
      assertEquals(Set.of("pg-sessions"), threads, "never the caller's thread");
    }
  }

  @Test
  void anUnreachableDatabaseIsATransientError() {
    int port = Processes.freePort();
    try (PgSessionService s =
        PgSessionService.connect(
            "jdbc:postgresql://127.0.0.1:" + port + "/none?user=x",
            new PgSessionService.PoolBounds(2, Duration.ofMillis(500), Duration.ofSeconds(1)))) {
      SessionDatabaseException e =
          assertThrows(SessionDatabaseException.class,
              () -> s.getSession(APP, "u1", "s1", Optional.empty()).blockingGet());
      assertEquals("session.database_unavailable", e.code());
      assertTrue(e.isTransient());
      SessionDatabaseException take =
          assertThrows(SessionDatabaseException.class, () -> s.takeFence(APP, "u1", "s1").blockingGet());
      assertTrue(take.isTransient());
    }
    assertThrows(IllegalArgumentException.class,
        () -> PgSessionService.connect("jdbc:mysql://x/y", PgSessionService.PoolBounds.DEFAULT));
  }

  @Test
  void creatingASessionThatExistsFails() {
    try (PgDatabase db = PgDatabase.create()) {
      PgSessionService s = service(db);
      s.createSession(APP, "u1", Map.of("k", 1), "s1").blockingGet();
      SessionDatabaseException e =
          assertThrows(SessionDatabaseException.class,
              () -> s.createSession(APP, "u1", Map.of("k", 2), "s1").blockingGet());
      assertEquals("session.already_exists", e.code());
      assertFalse(e.isTransient());
      assertEquals(1, s.getSession(APP, "u1", "s1", Optional.empty()).blockingGet().state().get("k"));
    }
  }

  @Test
  void idleSessionsAreDeletedInBatchesAndAUserIsErased() {
    try (PgDatabase db = PgDatabase.create()) {
      MovableClock clock = new MovableClock(Instant.parse("2026-01-01T00:00:00Z"));
      PgSessionService s = PgSessionService.builder(db.pool(4)).clock(clock).build();
      s.migrate().blockingGet();
      for (String id : List.of("old1", "old2", "old3")) {
        s.createSession(APP, "u1", Map.of(), id).blockingGet();
      }
      clock.now = clock.now.plus(Duration.ofDays(10));
      s.createSession(APP, "u1", Map.of("user:lang", "en", "app:theme", "dark"), "new").blockingGet();
      s.createSession(APP, "u2", Map.of("user:lang", "fr"), "other").blockingGet();
      Session turn = fenced(s, "u1", "new");
      s.appendEvent(turn, event("e1", clock.now.toEpochMilli())).blockingGet();
      // The fence rows' times are the database's: those of the old sessions were taken ten days
      // ago too.
      db.execute("UPDATE tollgate_session_fences SET updated_at = updated_at - interval '10 days'"
          + " WHERE session_id LIKE 'old%'");

      assertEquals(3L, s.deleteIdle(Duration.ofDays(7), 2).blockingGet());
      assertEquals(List.of("new"),
          s.listSessions(APP, "u1").blockingGet().sessions().stream().map(Session::id).collect(Collectors.toList()));
      assertEquals(0, db.count("SELECT count(*) FROM tollgate_session_fences WHERE session_id LIKE 'old%'"));
      assertEquals(2, db.count("SELECT count(*) FROM tollgate_session_fences"), "new and other keep theirs");
      assertEquals(0L, s.deleteIdle(Duration.ofDays(7), 2).blockingGet());

      assertEquals(1, s.eraseUser(APP, "u1").blockingGet());
      assertNull(s.getSession(APP, "u1", "new", Optional.empty()).blockingGet());
      assertEquals(0, db.count("SELECT count(*) FROM tollgate_java_events"));
      assertEquals(0, db.count("SELECT count(*) FROM tollgate_java_user_states WHERE user_id = 'u1'"));
      assertEquals(0, db.count("SELECT count(*) FROM tollgate_session_fences WHERE user_id = 'u1'"));
      Session kept = s.getSession(APP, "u2", "other", Optional.empty()).blockingGet();
      assertEquals("fr", kept.state().get("user:lang"));
      assertEquals("dark", kept.state().get("app:theme"), "the app's state stays");
      // The erased user's fence holder can never write again.
      s.createSession(APP, "u1", Map.of(), "new").blockingGet();
      assertInstanceOf(StaleFenceException.class,
          assertThrows(StaleFenceException.class, () -> s.appendEvent(turn, event("e2", 1)).blockingGet()));
    }
  }

  /** A clock the test moves. */
  static final class MovableClock extends Clock {
    volatile Instant now;

    MovableClock(Instant now) {
      this.now = now;
    }

    @Override
    public ZoneOffset getZone() {
      return ZoneOffset.UTC;
    }

    @Override
    public Clock withZone(java.time.ZoneId zone) {
      return this;
    }

    @Override
    public Instant instant() {
      return now;
    }
  }

  /** A data source recording the threads that ask it for connections. */
  static final class Recording implements DataSource {
    private final DataSource inner;
    private final Set<String> threads;

    Recording(DataSource inner, Set<String> threads) {
      this.inner = inner;
      this.threads = threads;
    }

    @Override
    public Connection getConnection() throws SQLException {
      threads.add(Thread.currentThread().getName());
      return inner.getConnection();
    }

    @Override
    public Connection getConnection(String user, String password) throws SQLException {
      threads.add(Thread.currentThread().getName());
      return inner.getConnection(user, password);
    }

    @Override
    public PrintWriter getLogWriter() throws SQLException {
      return inner.getLogWriter();
    }

    @Override
    public void setLogWriter(PrintWriter out) throws SQLException {
      inner.setLogWriter(out);
    }

    @Override
    public void setLoginTimeout(int seconds) throws SQLException {
      inner.setLoginTimeout(seconds);
    }

    @Override
    public int getLoginTimeout() throws SQLException {
      return inner.getLoginTimeout();
    }

    @Override
    public Logger getParentLogger() throws SQLFeatureNotSupportedException {
      return inner.getParentLogger();
    }

    @Override
    public <T> T unwrap(Class<T> iface) throws SQLException {
      return inner.unwrap(iface);
    }

    @Override
    public boolean isWrapperFor(Class<?> iface) throws SQLException {
      return inner.isWrapperFor(iface);
    }
  }
}
