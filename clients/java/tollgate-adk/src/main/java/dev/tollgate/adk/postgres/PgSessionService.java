package dev.tollgate.adk.postgres;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.core.type.TypeReference;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import com.google.adk.JsonBaseModel;
import com.google.adk.events.Event;
import com.google.adk.events.EventActions;
import com.google.adk.sessions.BaseSessionService;
import com.google.adk.sessions.GetSessionConfig;
import com.google.adk.sessions.ListEventsResponse;
import com.google.adk.sessions.ListSessionsResponse;
import com.google.adk.sessions.Session;
import com.google.adk.sessions.SessionNotFoundException;
import com.google.adk.sessions.State;
import io.reactivex.rxjava3.core.Completable;
import io.reactivex.rxjava3.core.Maybe;
import io.reactivex.rxjava3.core.Scheduler;
import io.reactivex.rxjava3.core.Single;
import io.reactivex.rxjava3.schedulers.Schedulers;
import java.sql.Array;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.time.Clock;
import java.time.Duration;
import java.time.Instant;
import java.time.OffsetDateTime;
import java.time.ZoneOffset;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Optional;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentMap;
import org.jspecify.annotations.Nullable;
import javax.sql.DataSource;

/**
 * ADK Java sessions in PostgreSQL whose writes are fenced by the database (docs/spec.md §4,
 * <i>Sessions in PostgreSQL</i>): a turn's {@link #appendEvent appendEvent} lands only in a
 * transaction that first reads the session's row of {@code tollgate_session_fences} {@code FOR
 * SHARE} and finds the turn's {@link DbFence} still current; otherwise nothing is written and the
 * append fails with {@link StaleFenceException} (or {@link FenceNotHeldException} without a fence).
 *
 * <p>A turn's fence is taken by {@link #takeFence} — the {@link dev.tollgate.adk.TurnExecutor}
 * given this service does it at the start of each turn, after the session lease — and travels in
 * the session the runner loads for the turn, under the state key {@link #FENCE_KEY} (a {@code
 * temp:} key: never stored). So each turn's appends carry its own fence, whatever thread runs them.
 *
 * <p>The tables ({@code tollgate_java_sessions}, {@code _events}, {@code _app_states}, {@code
 * _user_states}, {@code tollgate_session_fences}) are tollgate's, created by {@link #migrate()}
 * ({@link Migrations}); events are kept as ADK's own JSON ({@code Event.toJson()}). Behaviour is
 * {@code InMemorySessionService}'s (the shared scenario of the tests checks both) except: a read
 * answers at most the {@code maxEvents} most recent events (default {@value #DEFAULT_MAX_EVENTS}),
 * {@code listSessions} at most {@value #MAX_LIST} sessions (most recently updated first), {@code
 * temp:} keys are never stored, {@code app:} and {@code user:} keys of a new session's state go to
 * the app's and user's state, creating a session that exists fails ({@code
 * session.already_exists}) instead of replacing it, and an event already appended (same id) is not
 * appended again. Every operation runs on the service's scheduler (default {@link
 * Schedulers#io()}), never the caller's; a failed operation is a {@link SessionDatabaseException},
 * transient when the database is unreachable.
 */
public final class PgSessionService implements BaseSessionService, AutoCloseable {
  /** The session state key a turn's {@link DbFence} travels under (a {@code temp:} key). */
  public static final String FENCE_KEY = State.TEMP_PREFIX + "tollgate_db_fence";

  /** The most events a read answers by default: the most recent. */
  public static final int DEFAULT_MAX_EVENTS = 10_000;

  /** The most sessions {@link #listSessions} answers: the most recently updated. */
  public static final int MAX_LIST = 1_000;

  private static final ObjectMapper JSON = JsonBaseModel.getMapper();
  private static final TypeReference<LinkedHashMap<String, Object>> MAP = new TypeReference<>() {};

  private final DataSource dataSource;
  @Nullable private final AutoCloseable owned;
  private final Scheduler scheduler;
  private final Clock clock;
  private final int maxEvents;

  private PgSessionService(Builder b, @Nullable AutoCloseable owned) {
    this.dataSource = b.dataSource;
    this.owned = owned;
    this.scheduler = b.scheduler;
    this.clock = b.clock;
    this.maxEvents = b.maxEvents;
  }

  /**
   * The bounds of the pool {@link #connect} makes.
   *
   * @param maxConnections most connections open at once
   * @param acquireTimeout longest wait for a connection before an operation fails as unavailable
   * @param statementTimeout longest a statement may run before PostgreSQL cancels it (the write
   *     then fails whole)
   */
  public record PoolBounds(int maxConnections, Duration acquireTimeout, Duration statementTimeout) {
    /** 16 connections, 5 s to get one, 10 s per statement (adk-rust's defaults). */
    public static final PoolBounds DEFAULT =
        new PoolBounds(16, Duration.ofSeconds(5), Duration.ofSeconds(10));

    /**
     * Bounds.
     *
     * @param maxConnections at least 1
     * @param acquireTimeout positive
     * @param statementTimeout positive
     */
    public PoolBounds {
      if (maxConnections < 1) {
        throw new IllegalArgumentException("maxConnections must be at least 1");
      }
      if (acquireTimeout.isNegative() || acquireTimeout.isZero()) {
        throw new IllegalArgumentException("acquireTimeout must be positive");
      }
      if (statementTimeout.isNegative() || statementTimeout.isZero()) {
        throw new IllegalArgumentException("statementTimeout must be positive");
      }
    }
  }

  /**
   * A service on a HikariCP pool of {@code jdbcUrl} with these bounds, closed with the service.
   * Needs {@code org.postgresql:postgresql} and {@code com.zaxxer:HikariCP} on the class path.
   *
   * @param jdbcUrl {@code jdbc:postgresql://host:port/db?user=…}
   * @param bounds the pool's bounds
   * @return the service (not yet migrated: {@link #migrate()})
   */
  public static PgSessionService connect(String jdbcUrl, PoolBounds bounds) {
    Objects.requireNonNull(jdbcUrl, "jdbcUrl");
    if (!jdbcUrl.startsWith("jdbc:postgresql:")) {
      throw new IllegalArgumentException("not a PostgreSQL JDBC URL (jdbc:postgresql://…)");
    }
    var pool = Pools.hikari(jdbcUrl, Objects.requireNonNull(bounds, "bounds"));
    return new PgSessionService(new Builder(pool), pool);
  }

  /**
   * Starts configuring a service over {@code dataSource} (a bounded pool of the caller's, which
   * the service does not close).
   *
   * @param dataSource the session database
   * @return the builder
   */
  public static Builder builder(DataSource dataSource) {
    return new Builder(dataSource);
  }

  /** Configures a {@link PgSessionService}. */
  public static final class Builder {
    private final DataSource dataSource;
    private Scheduler scheduler = Schedulers.io();
    private Clock clock = Clock.systemUTC();
    private int maxEvents = DEFAULT_MAX_EVENTS;

    private Builder(DataSource dataSource) {
      this.dataSource = Objects.requireNonNull(dataSource, "dataSource");
    }

    /**
     * Where the database calls run (default {@link Schedulers#io()}).
     *
     * @param scheduler the scheduler
     * @return this builder
     */
    public Builder scheduler(Scheduler scheduler) {
      this.scheduler = Objects.requireNonNull(scheduler, "scheduler");
      return this;
    }

    /**
     * The clock of sessions' creation times and of retention's cutoff (default UTC system).
     *
     * @param clock the clock
     * @return this builder
     */
    public Builder clock(Clock clock) {
      this.clock = Objects.requireNonNull(clock, "clock");
      return this;
    }

    /**
     * The most events a read answers (the most recent; default {@value #DEFAULT_MAX_EVENTS}).
     *
     * @param maxEvents at least 1
     * @return this builder
     */
    public Builder maxEvents(int maxEvents) {
      if (maxEvents < 1) {
        throw new IllegalArgumentException("maxEvents must be at least 1, got " + maxEvents);
      }
      this.maxEvents = maxEvents;
      return this;
    }

    /**
     * The service.
     *
     * @return a new service (not yet migrated: {@link #migrate()})
     */
    public PgSessionService build() {
      return new PgSessionService(this, null);
    }
  }

  /**
   * Brings tollgate's tables to this version's schema ({@link Migrations#migrate}).
   *
   * @return the versions applied now
   */
  public Single<List<Long>> migrate() {
    return Single.fromCallable(() -> Migrations.migrate(dataSource)).subscribeOn(scheduler);
  }

  /**
   * Takes the session's next database fence, making it current: every write carrying an earlier
   * one is refused from now on. The session need not exist.
   *
   * @param appName the app
   * @param userId the user
   * @param sessionId the session
   * @return the new fence
   */
  public Single<DbFence> takeFence(String appName, String userId, String sessionId) {
    Key k = new Key(appName, userId, sessionId);
    return write("take a fence", c -> take(c, k));
  }

  /**
   * Retention: deletes every session not updated for {@code idle} (by the service's clock) with its
   * events, at most {@code batch} sessions per transaction, until none is left; then, in batches
   * too, the fence rows not taken for {@code idle} (the database's clock) of sessions that no
   * longer exist here. The host schedules it (clients/java/README.md gives the same in SQL).
   *
   * @param idle the age past which a session goes
   * @param batch sessions per transaction, at least 1
   * @return how many sessions it deleted
   */
  public Single<Long> deleteIdle(Duration idle, int batch) {
    Objects.requireNonNull(idle, "idle");
    int per = Math.max(1, batch);
    return Single.fromCallable(
            () -> {
              OffsetDateTime cutoff = at(clock.instant().minus(idle));
              long deleted = 0;
              while (true) {
                int n =
                    inTransaction(
                        "delete idle sessions",
                        c -> {
                          try (PreparedStatement st =
                              c.prepareStatement(
                                  "DELETE FROM tollgate_java_sessions WHERE (app_name, user_id,"
                                      + " session_id) IN (SELECT app_name, user_id, session_id FROM"
                                      + " tollgate_java_sessions WHERE updated_at < ? LIMIT ? FOR"
                                      + " UPDATE SKIP LOCKED)")) {
                            st.setObject(1, cutoff);
                            st.setInt(2, per);
                            return st.executeUpdate();
                          }
                        });
                deleted += n;
                if (n < per) {
                  break;
                }
              }
              while (true) {
                int n =
                    inTransaction(
                        "delete idle fences",
                        c -> {
                          try (PreparedStatement st =
                              c.prepareStatement(
                                  "DELETE FROM tollgate_session_fences WHERE (app_name, user_id,"
                                      + " session_id) IN (SELECT app_name, user_id, session_id FROM"
                                      + " tollgate_session_fences f WHERE f.updated_at < now() - ?"
                                      + " * interval '1 millisecond' AND NOT EXISTS (SELECT 1 FROM"
                                      + " tollgate_java_sessions s WHERE s.app_name = f.app_name"
                                      + " AND s.user_id = f.user_id AND s.session_id ="
                                      + " f.session_id) LIMIT ? FOR UPDATE SKIP LOCKED)")) {
                            st.setLong(1, idle.toMillis());
                            st.setInt(2, per);
                            return st.executeUpdate();
                          }
                        });
                if (n < per) {
                  return deleted;
                }
              }
            })
        .subscribeOn(scheduler);
  }

  /**
   * Erasure: deletes every session of ({@code appName}, {@code userId}) with its events, the user's
   * state and the sessions' fence rows, in one transaction (the app's state, shared by all its
   * users, stays).
   *
   * @param appName the app
   * @param userId the user
   * @return how many sessions it deleted
   */
  public Single<Integer> eraseUser(String appName, String userId) {
    Objects.requireNonNull(appName, "appName");
    Objects.requireNonNull(userId, "userId");
    return write(
        "erase a user",
        c -> {
          int sessions;
          try (PreparedStatement st =
              c.prepareStatement(
                  "DELETE FROM tollgate_java_sessions WHERE app_name = ? AND user_id = ?")) {
            st.setString(1, appName);
            st.setString(2, userId);
            sessions = st.executeUpdate();
          }
          for (String table : List.of("tollgate_java_user_states", "tollgate_session_fences")) {
            try (PreparedStatement st =
                c.prepareStatement("DELETE FROM " + table + " WHERE app_name = ? AND user_id = ?")) {
              st.setString(1, appName);
              st.setString(2, userId);
              st.executeUpdate();
            }
          }
          return sessions;
        });
  }

  /** Closes the pool {@link #connect} made (a no-op for a caller's data source). */
  @Override
  public void close() {
    if (owned != null) {
      try {
        owned.close();
      } catch (Exception e) {
        throw new IllegalStateException("closing the pool", e);
      }
    }
  }

  @Override
  @Deprecated
  @SuppressWarnings("deprecation")
  public Single<Session> createSession(
      String appName,
      String userId,
      @Nullable ConcurrentMap<String, Object> state,
      @Nullable String sessionId) {
    return createSession(appName, userId, (Map<String, Object>) state, sessionId);
  }

  /**
   * Creates the session with a new database fence held by no one; fails with {@link
   * SessionDatabaseException} {@code session.already_exists} if it exists.
   */
  @Override
  public Single<Session> createSession(
      String appName,
      String userId,
      @Nullable Map<String, Object> state,
      @Nullable String sessionId) {
    Objects.requireNonNull(appName, "appName cannot be null");
    Objects.requireNonNull(userId, "userId cannot be null");
    String id =
        Optional.ofNullable(sessionId)
            .map(String::trim)
            .filter(s -> !s.isEmpty())
            .orElseGet(() -> UUID.randomUUID().toString());
    Key k = new Key(appName, userId, id);
    Deltas d = Deltas.of(state == null ? Map.of() : state);
    return write(
        "create",
        c -> {
          Instant now = clock.instant();
          Map<String, Object> app = scope(c, d.app, now, APP_UPSERT, APP_READ, appName);
          Map<String, Object> user = scope(c, d.user, now, USER_UPSERT, USER_READ, appName, userId);
          try (PreparedStatement st =
              c.prepareStatement(
                  "INSERT INTO tollgate_java_sessions (app_name, user_id, session_id, state,"
                      + " created_at, updated_at) VALUES (?, ?, ?, ?::jsonb, ?, ?) ON CONFLICT DO"
                      + " NOTHING")) {
            k.bind(st, 1);
            st.setString(4, json(d.session.set));
            st.setObject(5, at(now));
            st.setObject(6, at(now));
            if (st.executeUpdate() == 0) {
              throw new SessionDatabaseException(
                  "session.already_exists",
                  "session '" + id + "' already exists for app '" + appName + "' and user '" + userId
                      + "'",
                  null);
            }
          }
          take(c, k);
          return session(k, merged(d.session.set, app, user), new ArrayList<>(), now);
        });
  }

  @Override
  public Maybe<Session> getSession(
      String appName, String userId, String sessionId, Optional<GetSessionConfig> configOpt) {
    Key k = new Key(appName, userId, sessionId);
    Objects.requireNonNull(configOpt, "configOpt cannot be null");
    int limit =
        configOpt
            .flatMap(GetSessionConfig::numRecentEvents)
            .map(
                n -> {
                  if (n < 0) {
                    throw new IllegalArgumentException("numRecentEvents must not be negative");
                  }
                  return Math.min(n, maxEvents);
                })
            .orElse(maxEvents);
    long after = configOpt.flatMap(GetSessionConfig::afterTimestamp).map(PgSessionService::ceilMillis)
        .orElse(Long.MIN_VALUE);
    return Maybe.fromCallable(() -> inRead("get", c -> load(c, k, limit, after)))
        .subscribeOn(scheduler);
  }

  @Override
  public Single<ListSessionsResponse> listSessions(String appName, String userId) {
    Objects.requireNonNull(appName, "appName cannot be null");
    Objects.requireNonNull(userId, "userId cannot be null");
    return Single.fromCallable(
            () ->
                inRead(
                    "list",
                    c -> {
                      Map<String, Object> app = read(c, APP_READ, appName);
                      Map<String, Object> user = read(c, USER_READ, appName, userId);
                      List<Session> sessions = new ArrayList<>();
                      try (PreparedStatement st =
                          c.prepareStatement(
                              "SELECT session_id, state::text, updated_at FROM"
                                  + " tollgate_java_sessions WHERE app_name = ? AND user_id = ?"
                                  + " ORDER BY updated_at DESC, session_id LIMIT ?")) {
                        st.setString(1, appName);
                        st.setString(2, userId);
                        st.setInt(3, MAX_LIST);
                        try (ResultSet rs = st.executeQuery()) {
                          while (rs.next()) {
                            sessions.add(
                                session(
                                    new Key(appName, userId, rs.getString(1)),
                                    merged(map(rs.getString(2)), app, user),
                                    new ArrayList<>(),
                                    rs.getObject(3, OffsetDateTime.class).toInstant()));
                          }
                        }
                      }
                      return ListSessionsResponse.builder().sessions(sessions).build();
                    }))
        .subscribeOn(scheduler);
  }

  /** Deletes the session and its events (a missing one is no error); its fence row stays. */
  @Override
  public Completable deleteSession(String appName, String userId, String sessionId) {
    Key k = new Key(appName, userId, sessionId);
    return write(
            "delete",
            c -> {
              try (PreparedStatement st =
                  c.prepareStatement(
                      "DELETE FROM tollgate_java_sessions WHERE app_name = ? AND user_id = ? AND"
                          + " session_id = ?")) {
                k.bind(st, 1);
                return st.executeUpdate();
              }
            })
        .ignoreElement();
  }

  /** The session's events, at most the {@code maxEvents} most recent (none if it is missing). */
  @Override
  public Single<ListEventsResponse> listEvents(String appName, String userId, String sessionId) {
    Key k = new Key(appName, userId, sessionId);
    return Single.fromCallable(
            () ->
                inRead(
                    "list events",
                    c -> ListEventsResponse.builder().events(events(c, k, maxEvents, Long.MIN_VALUE)).build()))
        .subscribeOn(scheduler);
  }

  /**
   * Appends the event (a partial one is not stored) and applies its state delta, in one
   * transaction that writes only if the session's database fence is still the one the session
   * carries under {@link #FENCE_KEY}: else nothing is written and it fails with {@link
   * StaleFenceException}; without a fence, {@link FenceNotHeldException}; a deleted session, {@link
   * SessionNotFoundException}. An event whose id was appended before is not appended again.
   */
  @Override
  public Single<Event> appendEvent(Session session, Event event) {
    Objects.requireNonNull(session, "session cannot be null");
    Objects.requireNonNull(event, "event cannot be null");
    if (event.partial().orElse(false)) {
      return Single.just(event);
    }
    Key k = new Key(session.appName(), session.userId(), session.id());
    if (!(session.state().get(FENCE_KEY) instanceof DbFence fence)) {
      return Single.error(new FenceNotHeldException(k.toString()));
    }
    if (event.id() == null || event.id().isBlank()) {
      event.setId(Event.generateEventId());
    }
    Map<String, Object> delta =
        Optional.ofNullable(event.actions())
            .map(EventActions::stateDelta)
            .<Map<String, Object>>map(LinkedHashMap::new)
            .orElseGet(LinkedHashMap::new);
    Deltas d = Deltas.of(delta);
    String stored = stored(event);
    Instant time = Instant.ofEpochMilli(event.timestamp());
    return write(
            "append",
            c -> {
              check(c, k, fence);
              try (PreparedStatement st =
                  c.prepareStatement(
                      "SELECT 1 FROM tollgate_java_sessions WHERE app_name = ? AND user_id = ? AND"
                          + " session_id = ? FOR UPDATE")) {
                k.bind(st, 1);
                try (ResultSet rs = st.executeQuery()) {
                  if (!rs.next()) {
                    throw new SessionNotFoundException("session " + k + " not found");
                  }
                }
              }
              try (PreparedStatement st =
                  c.prepareStatement(
                      "SELECT 1 FROM tollgate_java_events WHERE app_name = ? AND user_id = ? AND"
                          + " session_id = ? AND event_id = ?")) {
                k.bind(st, 1);
                st.setString(4, event.id());
                try (ResultSet rs = st.executeQuery()) {
                  if (rs.next()) {
                    return false;
                  }
                }
              }
              Instant now = clock.instant();
              scope(c, d.app, now, APP_UPSERT, null, k.app);
              scope(c, d.user, now, USER_UPSERT, null, k.app, k.user);
              try (PreparedStatement st =
                  c.prepareStatement(
                      "UPDATE tollgate_java_sessions SET state = (state || ?::jsonb) - ?::text[],"
                          + " updated_at = ? WHERE app_name = ? AND user_id = ? AND session_id ="
                          + " ?")) {
                st.setString(1, json(d.session.set));
                st.setArray(2, textArray(c, d.session.removed));
                st.setObject(3, at(time));
                k.bind(st, 4);
                st.executeUpdate();
              }
              try (PreparedStatement st =
                  c.prepareStatement(
                      "INSERT INTO tollgate_java_events (app_name, user_id, session_id, event_id,"
                          + " invocation_id, timestamp_ms, event) VALUES (?, ?, ?, ?, ?, ?,"
                          + " ?::jsonb)")) {
                k.bind(st, 1);
                st.setString(4, event.id());
                st.setString(5, Objects.requireNonNullElse(event.invocationId(), ""));
                st.setLong(6, event.timestamp());
                st.setString(7, stored);
                st.executeUpdate();
              }
              return true;
            })
        .map(
            appended -> {
              if (appended) {
                applyTo(session, delta);
                session.events().add(event);
                session.lastUpdateTime(time);
              }
              return event;
            });
  }

  // ---- the database ----

  @FunctionalInterface
  private interface Work<T> {
    T run(Connection c) throws SQLException;
  }

  private <T> Single<T> write(String what, Work<T> work) {
    return Single.fromCallable(() -> inTransaction(what, work)).subscribeOn(scheduler);
  }

  private <T> T inTransaction(String what, Work<T> work) {
    try (Connection c = dataSource.getConnection()) {
      c.setAutoCommit(false);
      try {
        T out = work.run(c);
        c.commit();
        return out;
      } catch (SQLException | RuntimeException e) {
        try {
          c.rollback();
        } catch (SQLException rollback) {
          e.addSuppressed(rollback);
        }
        throw e;
      }
    } catch (SQLException e) {
      throw SessionDatabaseException.of(what, e);
    }
  }

  /** A read in one snapshot (repeatable read, read only). */
  @Nullable
  private <T> T inRead(String what, Work<T> work) {
    return inTransaction(
        what,
        c -> {
          try (var st = c.createStatement()) {
            st.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY");
          }
          return work.run(c);
        });
  }

  private static DbFence take(Connection c, Key k) throws SQLException {
    try (PreparedStatement st =
        c.prepareStatement(
            "INSERT INTO tollgate_session_fences AS f (app_name, user_id, session_id, fence, token)"
                + " VALUES (?, ?, ?, 1, gen_random_uuid()) ON CONFLICT (app_name, user_id,"
                + " session_id) DO UPDATE SET fence = f.fence + 1, token = gen_random_uuid(),"
                + " updated_at = now() RETURNING fence, token")) {
      k.bind(st, 1);
      try (ResultSet rs = st.executeQuery()) {
        rs.next();
        return new DbFence(rs.getLong(1), rs.getObject(2, UUID.class));
      }
    }
  }

  /** Reads the fence row {@code FOR SHARE}: a take waits for this transaction, and vice versa. */
  private static void check(Connection c, Key k, DbFence fence) throws SQLException {
    try (PreparedStatement st =
        c.prepareStatement(
            "SELECT fence, token FROM tollgate_session_fences WHERE app_name = ? AND user_id = ?"
                + " AND session_id = ? FOR SHARE")) {
      k.bind(st, 1);
      try (ResultSet rs = st.executeQuery()) {
        if (!rs.next()) {
          throw new StaleFenceException(k.toString(), fence.number(), 0);
        }
        long latest = rs.getLong(1);
        UUID token = rs.getObject(2, UUID.class);
        if (latest != fence.number() || !token.equals(fence.token())) {
          throw new StaleFenceException(k.toString(), fence.number(), latest);
        }
      }
    }
  }

  private static final String APP_UPSERT =
      "INSERT INTO tollgate_java_app_states AS s (app_name, state, updated_at) VALUES (?, ?::jsonb,"
          + " ?) ON CONFLICT (app_name) DO UPDATE SET state = (s.state || EXCLUDED.state) -"
          + " ?::text[], updated_at = EXCLUDED.updated_at RETURNING state::text";
  private static final String USER_UPSERT =
      "INSERT INTO tollgate_java_user_states AS s (app_name, user_id, state, updated_at) VALUES (?,"
          + " ?, ?::jsonb, ?) ON CONFLICT (app_name, user_id) DO UPDATE SET state = (s.state ||"
          + " EXCLUDED.state) - ?::text[], updated_at = EXCLUDED.updated_at RETURNING state::text";
  private static final String APP_READ =
      "SELECT state::text FROM tollgate_java_app_states WHERE app_name = ?";
  private static final String USER_READ =
      "SELECT state::text FROM tollgate_java_user_states WHERE app_name = ? AND user_id = ?";

  /**
   * Merges a scope's delta into its row in one statement (so concurrent writers of one app's state
   * lose nothing) and answers the row's state; with an empty delta, reads it ({@code read} given)
   * or does nothing.
   */
  private static Map<String, Object> scope(
      Connection c, Scope delta, Instant now, String upsert, @Nullable String read, String... keys)
      throws SQLException {
    if (delta.isEmpty()) {
      return read == null ? Map.of() : read(c, read, keys);
    }
    try (PreparedStatement st = c.prepareStatement(upsert)) {
      int i = 1;
      for (String key : keys) {
        st.setString(i++, key);
      }
      st.setString(i++, json(delta.set));
      st.setObject(i++, at(now));
      st.setArray(i, textArray(c, delta.removed));
      try (ResultSet rs = st.executeQuery()) {
        rs.next();
        return map(rs.getString(1));
      }
    }
  }

  private static Map<String, Object> read(Connection c, String sql, String... keys)
      throws SQLException {
    try (PreparedStatement st = c.prepareStatement(sql)) {
      for (int i = 0; i < keys.length; i++) {
        st.setString(i + 1, keys[i]);
      }
      try (ResultSet rs = st.executeQuery()) {
        return rs.next() ? map(rs.getString(1)) : Map.of();
      }
    }
  }

  @Nullable
  private static Session load(Connection c, Key k, int limit, long after) throws SQLException {
    Map<String, Object> state;
    Instant updated;
    try (PreparedStatement st =
        c.prepareStatement(
            "SELECT state::text, updated_at FROM tollgate_java_sessions WHERE app_name = ? AND"
                + " user_id = ? AND session_id = ?")) {
      k.bind(st, 1);
      try (ResultSet rs = st.executeQuery()) {
        if (!rs.next()) {
          return null;
        }
        state = map(rs.getString(1));
        updated = rs.getObject(2, OffsetDateTime.class).toInstant();
      }
    }
    Map<String, Object> app = read(c, APP_READ, k.app);
    Map<String, Object> user = read(c, USER_READ, k.app, k.user);
    return session(k, merged(state, app, user), events(c, k, limit, after), updated);
  }

  /** The session's {@code limit} most recent events, then those at or after {@code after} ms. */
  private static List<Event> events(Connection c, Key k, int limit, long after)
      throws SQLException {
    List<Event> events = new ArrayList<>();
    try (PreparedStatement st =
        c.prepareStatement(
            "SELECT event::text FROM (SELECT event, seq, timestamp_ms FROM tollgate_java_events"
                + " WHERE app_name = ? AND user_id = ? AND session_id = ? ORDER BY seq DESC LIMIT"
                + " ?) recent WHERE timestamp_ms >= ? ORDER BY seq")) {
      k.bind(st, 1);
      st.setInt(4, limit);
      st.setLong(5, after);
      try (ResultSet rs = st.executeQuery()) {
        while (rs.next()) {
          events.add(Event.fromJson(rs.getString(1)));
        }
      }
    }
    return events;
  }

  // ---- values ----

  /** (app, user, session), checked not null. */
  private record Key(String app, String user, String session) {
    Key {
      Objects.requireNonNull(app, "appName cannot be null");
      Objects.requireNonNull(user, "userId cannot be null");
      Objects.requireNonNull(session, "sessionId cannot be null");
    }

    void bind(PreparedStatement st, int from) throws SQLException {
      st.setString(from, app);
      st.setString(from + 1, user);
      st.setString(from + 2, session);
    }

    @Override
    public String toString() {
      return app + "/" + user + "/" + session;
    }
  }

  /** One scope's part of a state delta: keys set, keys removed. */
  private static final class Scope {
    final Map<String, Object> set = new LinkedHashMap<>();
    final List<String> removed = new ArrayList<>();

    void put(String key, @Nullable Object value) {
      if (value == null || value == State.REMOVED) {
        set.remove(key);
        removed.add(key);
      } else {
        removed.remove(key);
        set.put(key, value);
      }
    }

    boolean isEmpty() {
      return set.isEmpty() && removed.isEmpty();
    }
  }

  /** A state delta split by scope; {@code temp:} keys are never stored. */
  private record Deltas(Scope app, Scope user, Scope session) {
    static Deltas of(Map<String, Object> delta) {
      Deltas d = new Deltas(new Scope(), new Scope(), new Scope());
      delta.forEach(
          (key, value) -> {
            if (key.startsWith(State.TEMP_PREFIX)) {
              return;
            }
            if (key.startsWith(State.APP_PREFIX)) {
              d.app.put(key.substring(State.APP_PREFIX.length()), value);
            } else if (key.startsWith(State.USER_PREFIX)) {
              d.user.put(key.substring(State.USER_PREFIX.length()), value);
            } else {
              d.session.put(key, value);
            }
          });
      return d;
    }
  }

  /** The delta on the session the caller holds, as {@code InMemorySessionService} applies it. */
  private static void applyTo(Session session, Map<String, Object> delta) {
    delta.forEach(
        (key, value) -> {
          if (value == null || value == State.REMOVED) {
            session.state().remove(key);
          } else {
            session.state().put(key, value);
          }
        });
  }

  private static Session session(
      Key k, Map<String, Object> state, List<Event> events, Instant updated) {
    return Session.builder(k.session)
        .appName(k.app)
        .userId(k.user)
        .state(state)
        .events(events)
        .lastUpdateTime(updated)
        .build();
  }

  /** Session state with the app's ({@code app:}) and the user's ({@code user:}) merged in. */
  private static ConcurrentMap<String, Object> merged(
      Map<String, Object> session, Map<String, Object> app, Map<String, Object> user) {
    ConcurrentMap<String, Object> out = new ConcurrentHashMap<>();
    session.forEach((k, v) -> putIfValue(out, k, v));
    app.forEach((k, v) -> putIfValue(out, State.APP_PREFIX + k, v));
    user.forEach((k, v) -> putIfValue(out, State.USER_PREFIX + k, v));
    return out;
  }

  private static void putIfValue(Map<String, Object> out, String key, @Nullable Object value) {
    if (value != null) {
      out.put(key, value);
    }
  }

  /** The event as stored: ADK's JSON, without {@code temp:} keys in its state delta. */
  private static String stored(Event event) {
    JsonNode node = JSON.valueToTree(event);
    if (node.path("actions").path("stateDelta") instanceof ObjectNode delta) {
      Iterator<String> names = delta.fieldNames();
      List<String> temp = new ArrayList<>();
      names.forEachRemaining(
          n -> {
            if (n.startsWith(State.TEMP_PREFIX)) {
              temp.add(n);
            }
          });
      delta.remove(temp);
    }
    try {
      return JSON.writeValueAsString(node);
    } catch (JsonProcessingException e) {
      throw new IllegalArgumentException("the event cannot be written as JSON", e);
    }
  }

  private static String json(Map<String, Object> values) {
    try {
      return JSON.writeValueAsString(values);
    } catch (JsonProcessingException e) {
      throw new IllegalArgumentException("a state value cannot be written as JSON", e);
    }
  }

  private static Map<String, Object> map(String json) {
    try {
      return JSON.readValue(json, MAP);
    } catch (JsonProcessingException e) {
      throw new IllegalStateException("a stored state is not a JSON object", e);
    }
  }

  private static Array textArray(Connection c, List<String> values) throws SQLException {
    return c.createArrayOf("text", values.toArray());
  }

  private static OffsetDateTime at(Instant instant) {
    return OffsetDateTime.ofInstant(instant, ZoneOffset.UTC);
  }

  /** The first whole millisecond at or after {@code t}. */
  private static long ceilMillis(Instant t) {
    long ms = t.toEpochMilli();
    return t.getNano() % 1_000_000 == 0 ? ms : ms + 1;
  }
}
