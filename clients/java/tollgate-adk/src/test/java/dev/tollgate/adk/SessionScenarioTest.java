package dev.tollgate.adk;

import static org.junit.jupiter.api.Assertions.assertEquals;

import com.google.adk.events.Event;
import com.google.adk.events.EventActions;
import com.google.adk.sessions.BaseSessionService;
import com.google.adk.sessions.GetSessionConfig;
import com.google.adk.sessions.InMemorySessionService;
import com.google.adk.sessions.Session;
import com.google.adk.sessions.State;
import com.google.genai.types.Content;
import com.google.genai.types.Part;
import dev.tollgate.adk.postgres.DbFence;
import dev.tollgate.adk.postgres.PgSessionService;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.TreeMap;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;
import java.util.function.Consumer;
import java.util.stream.Collectors;
import org.junit.jupiter.api.Test;

/**
 * One scenario of creates, appends with state deltas in every scope, reads with and without
 * {@code GetSessionConfig}, lists and deletes, run on ADK's {@code InMemorySessionService} and on
 * {@link PgSessionService}: both must tell the same story (docs/spec.md §4 keeps the rest).
 */
class SessionScenarioTest {
  static final String APP = Adk.APP;

  @Test
  void postgresBehavesAsInMemory() {
    List<String> memory =
        scenario(
            new InMemorySessionService(),
            // Its appends check nothing; the key is there so both sessions hold the same state.
            s -> s.state().put(PgSessionService.FENCE_KEY, new DbFence(1, UUID.randomUUID())));
    try (PgDatabase db = PgDatabase.create()) {
      PgSessionService pg = PgSessionService.builder(db.pool(4)).build();
      pg.migrate().blockingGet();
      List<String> postgres =
          scenario(
              pg,
              s ->
                  s.state()
                      .put(
                          PgSessionService.FENCE_KEY,
                          pg.takeFence(s.appName(), s.userId(), s.id()).blockingGet()));
      assertEquals(String.join("\n", memory), String.join("\n", postgres));
      assertEquals(28, postgres.size(), "the whole scenario ran");
    }
  }

  static List<String> scenario(BaseSessionService s, Consumer<Session> fence) {
    List<String> out = new ArrayList<>();
    Session created = s.createSession(APP, "u1", Map.of("topic", "billing", "n", 1), "s1").blockingGet();
    out.add("create " + describe(created));
    s.createSession(APP, "u1", Map.of(), "s2").blockingGet();
    s.createSession(APP, "u2", Map.of(), "s3").blockingGet();

    Session turn = s.getSession(APP, "u1", "s1", Optional.empty()).blockingGet();
    fence.accept(turn);
    s.appendEvent(
            turn,
            event("e1", "user", "hello", 1_000,
                Map.of("topic", "refunds", "app:theme", "dark", "user:lang", "en", "temp:scratch", "x")))
        .blockingGet();
    s.appendEvent(turn, event("e2", "helper", "hi", 2_000, Map.of("n", State.REMOVED, "step", 2, "user:tier", "gold")))
        .blockingGet();
    Event partial = event("p1", "helper", "h", 2_500, Map.of());
    partial.setPartial(true);
    s.appendEvent(turn, partial).blockingGet();
    s.appendEvent(turn, event("e3", "helper", "done", 3_000, Map.of("user:lang", State.REMOVED)))
        .blockingGet();
    out.add("the turn's session " + describe(turn));

    out.add("get " + describe(get(s, "u1", "s1", null)));
    out.add("get last 2 " + describe(get(s, "u1", "s1", GetSessionConfig.builder().numRecentEvents(2).build())));
    out.add("get last 0 " + describe(get(s, "u1", "s1", GetSessionConfig.builder().numRecentEvents(0).build())));
    out.add("get last 10 " + describe(get(s, "u1", "s1", GetSessionConfig.builder().numRecentEvents(10).build())));
    out.add("get after 2 s " + describe(get(s, "u1", "s1",
        GetSessionConfig.builder().afterTimestamp(Instant.ofEpochMilli(2_000)).build())));
    out.add("get after 1.5 s " + describe(get(s, "u1", "s1",
        GetSessionConfig.builder().afterTimestamp(Instant.ofEpochMilli(1_500)).build())));
    out.add("get last 2 after 2.5 s " + describe(get(s, "u1", "s1",
        GetSessionConfig.builder().numRecentEvents(2).afterTimestamp(Instant.ofEpochMilli(2_500)).build())));
    out.add("another session of u1 " + describe(get(s, "u1", "s2", null)));
    out.add("a session of u2 " + describe(get(s, "u2", "s3", null)));
    list(s, "u1", out);
    list(s, "u2", out);
    list(s, "nobody", out);
    out.add("events " + ids(s.listEvents(APP, "u1", "s1").blockingGet().events()));
    out.add("events of a missing session " + ids(s.listEvents(APP, "u1", "nope").blockingGet().events()));

    // A second turn on the session as read again.
    Session again = s.getSession(APP, "u1", "s1", Optional.empty()).blockingGet();
    fence.accept(again);
    s.appendEvent(again, event("e4", "user", "more", 4_000, Map.of("app:theme", "light"))).blockingGet();
    out.add("second turn " + describe(again));
    out.add("u2 sees the app's state " + describe(get(s, "u2", "s3", null)));

    s.deleteSession(APP, "u1", "s2").blockingAwait();
    s.deleteSession(APP, "u1", "never").blockingAwait();
    out.add("deleted " + (s.getSession(APP, "u1", "s2", Optional.empty()).blockingGet() == null));
    list(s, "u1", out);
    out.add("missing " + (s.getSession(APP, "u1", "nope", Optional.empty()).blockingGet() == null));
    out.add("other app " + (s.getSession("other", "u1", "s1", Optional.empty()).blockingGet() == null));
    Session generated = s.createSession(APP, "u3", (Map<String, Object>) null, null).blockingGet();
    out.add("generated id " + (generated.id().length() == 36) + " " + describe(get(s, "u3", generated.id(), null)).replace(generated.id(), "<id>"));
    Session trimmed = s.createSession(APP, "u3", Map.of(), "  padded  ").blockingGet();
    out.add("trimmed " + trimmed.id());
    return out;
  }

  static Session get(BaseSessionService s, String user, String id, GetSessionConfig config) {
    return s.getSession(APP, user, id, Optional.ofNullable(config)).blockingGet();
  }

  static void list(BaseSessionService s, String user, List<String> out) {
    List<Session> sessions = new ArrayList<>(s.listSessions(APP, user).blockingGet().sessions());
    sessions.sort(Comparator.comparing(Session::id));
    out.add("list " + user + " " + sessions.size());
    sessions.forEach(x -> out.add("  " + describe(x)));
  }

  /** Id, app, user, state without temp: keys (sorted), events (id:author:text). */
  static String describe(Session s) {
    if (s == null) {
      return "none";
    }
    Map<String, Object> state = new TreeMap<>();
    s.state().forEach((k, v) -> {
      if (!k.startsWith(State.TEMP_PREFIX)) {
        state.put(k, v);
      }
    });
    return s.id() + " " + s.appName() + "/" + s.userId() + " " + state + " " + ids(s.events());
  }

  static String ids(List<Event> events) {
    return events.stream()
        .map(e -> e.id() + ":" + e.author() + ":" + Adk.text(List.of(e)))
        .collect(Collectors.joining(",", "[", "]"));
  }

  static Event event(String id, String author, String text, long at, Map<String, Object> delta) {
    return Event.builder()
        .id(id)
        .invocationId("inv-1")
        .author(author)
        .content(Content.builder().role(author.equals("user") ? "user" : "model")
            .parts(List.of(Part.fromText(text))).build())
        .actions(EventActions.builder().stateDelta(new ConcurrentHashMap<>(delta)).build())
        .timestamp(at)
        .build();
  }
}
