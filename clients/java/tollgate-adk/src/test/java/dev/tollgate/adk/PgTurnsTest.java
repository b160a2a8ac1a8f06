package dev.tollgate.adk;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.adk.events.Event;
import com.google.adk.runner.Runner;
import dev.tollgate.adk.postgres.PgSessionService;
import dev.tollgate.adk.postgres.SessionDatabaseException;
import dev.tollgate.client.TollgateClient;
import dev.tollgate.client.testing.Processes;
import dev.tollgate.client.testing.Sidecar;
import io.reactivex.rxjava3.core.Flowable;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.stream.Collectors;
import org.junit.jupiter.api.Test;

/** Real ADK turns through a {@link TurnExecutor} keeping their sessions in PostgreSQL. */
class PgTurnsTest {
  @Test
  void eachTurnRunsUnderADatabaseFenceOfItsOwn() {
    try (Sidecar sc = Sidecar.start("");
        PgDatabase db = PgDatabase.create()) {
      TollgateClient client = sc.client();
      PgSessionService sessions = PgSessionService.builder(db.pool(4)).build();
      sessions.migrate().blockingGet();
      List<Long> seen = new ArrayList<>();
      TurnExecutor[] executor = new TurnExecutor[1];
      ScriptedLlm model =
          new ScriptedLlm(
              (req, n) -> {
                seen.add(executor[0].turn("s-pia").orElseThrow().db().orElseThrow().number());
                return Flowable.just(ScriptedLlm.text("answer " + n, 10));
              });
      Runner runner = Adk.runner(Adk.agent("helper", model), sessions, TollgatePlugin.builder(client).build());
      executor[0] = TurnExecutor.builder(runner, client).postgresSessions(sessions).build();
      sessions.createSession(Adk.APP, "pia", Map.of(), "s-pia").blockingGet();

      assertEquals("answer 0", Adk.text(Adk.turn(executor[0].runAsync("pia", "s-pia", Adk.user("one")))));
      assertEquals("answer 1", Adk.text(Adk.turn(executor[0].runAsync("pia", "s-pia", Adk.user("two")))));
      assertEquals(List.of(2L, 3L), seen, "the create took 1; each turn the next");
      List<Event> history = sessions.getSession(Adk.APP, "pia", "s-pia", Optional.empty()).blockingGet().events();
      assertEquals(
          List.of("user: one", "helper: answer 0", "user: two", "helper: answer 1"),
          history.stream().map(e -> e.author() + ": " + Adk.text(List.of(e))).collect(Collectors.toList()));
      assertEquals(0, db.count("SELECT count(*) FROM tollgate_java_events WHERE event::text LIKE '%tollgate_db_fence%'"),
          "the fence is never stored");
      assertEquals(0, executor[0].inFlight());
    }
  }

  @Test
  void aDatabaseThatCannotIssueTheFenceFailsTheTurnAndFreesTheLease() {
    try (Sidecar sc = Sidecar.start("");
        PgSessionService down =
            PgSessionService.connect(
                "jdbc:postgresql://127.0.0.1:" + Processes.freePort() + "/none?user=x",
                new PgSessionService.PoolBounds(1, Duration.ofMillis(300), Duration.ofSeconds(1)))) {
      TollgateClient client = sc.client();
      Runner runner = Adk.runner(Adk.agent("helper", ScriptedLlm.answering("answered", 10)),
          TollgatePlugin.builder(client).build());
      Adk.session(runner, "ola", "s-ola");
      TurnExecutor fenced = TurnExecutor.builder(runner, client).postgresSessions(down).build();
      SessionDatabaseException e =
          assertThrows(SessionDatabaseException.class,
              () -> Adk.turn(fenced.runAsync("ola", "s-ola", Adk.user("hi"))));
      assertTrue(e.isTransient());
      assertEquals(0, fenced.inFlight());
      // The session lease went with it: the next turn is admitted at once.
      TurnExecutor plain = TurnExecutor.builder(runner, client).build();
      assertEquals("answered", Adk.text(Adk.turn(plain.runAsync("ola", "s-ola", Adk.user("again")))));
    }
  }
}
