package dev.tollgate.adk;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import com.google.adk.events.Event;
import com.google.adk.runner.Runner;
import dev.tollgate.adk.postgres.FenceException;
import dev.tollgate.adk.postgres.PgSessionService;
import dev.tollgate.adk.postgres.StaleFenceException;
import dev.tollgate.client.TollgateClient;
import dev.tollgate.client.testing.Tokens;
import io.reactivex.rxjava3.core.Flowable;
import io.reactivex.rxjava3.schedulers.Schedulers;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.concurrent.atomic.AtomicReference;

/**
 * One replica of the takeover test across JVMs, running one real ADK turn through a {@link
 * TurnExecutor} whose leases come from the sidecar and whose sessions live in PostgreSQL: {@code
 * ChildPgTurn <sidecar url> <jdbc url> <user> <session> <session ttl ms> held|free <text>}.
 *
 * <p>Reports on stdout in lines {@code REPORT <json>}: {@code in_model} (a held replica, once its
 * model was called; its model answers after a line on stdin) and {@code done} (the turn's fences,
 * attempts, answer or error). A free replica retries while the session is busy, by the refusal's
 * hint, for at most 30 s.
 */
public final class ChildPgTurn {
  private static final ObjectMapper JSON = new ObjectMapper();

  private ChildPgTurn() {}

  public static void main(String[] args) throws Exception {
    String user = args[2];
    String session = args[3];
    boolean held = args[5].equals("held");
    String text = args[6];
    TollgateClient client = TollgateClient.builder(args[0]).credentials(Tokens::token).build();
    PgSessionService sessions =
        PgSessionService.connect(args[1], PgSessionService.PoolBounds.DEFAULT);
    sessions.migrate().blockingGet();

    AtomicReference<TurnExecutor> executor = new AtomicReference<>();
    AtomicReference<Turn> running = new AtomicReference<>();
    CountDownLatch reached = new CountDownLatch(1);
    CountDownLatch answer = new CountDownLatch(held ? 1 : 0);
    ScriptedLlm model =
        new ScriptedLlm(
            (req, n) ->
                Flowable.fromCallable(
                        () -> {
                          running.set(executor.get().turn(session).orElseThrow());
                          reached.countDown();
                          answer.await();
                          return ScriptedLlm.text("answer to " + text, 10);
                        })
                    .subscribeOn(Schedulers.io()));
    Runner runner = Adk.runner(Adk.agent("helper", model), sessions, TollgatePlugin.builder(client).build());
    executor.set(
        TurnExecutor.builder(runner, client)
            .sessionTtlMs(Long.parseLong(args[4]))
            .postgresSessions(sessions)
            .build());
    if (held) {
      Thread reader =
          new Thread(
              () -> {
                try {
                  new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8)).readLine();
                } catch (java.io.IOException e) {
                  // The parent is gone: answer anyway, the test has failed.
                }
                answer.countDown();
              });
      reader.setDaemon(true);
      reader.start();
    }

    int attempts = 0;
    Future<List<Event>> turn;
    while (true) {
      attempts++;
      try {
        // Started (lease, fence) before the first event: a busy session fails here.
        turn = executor.get().runAsync(user, session, Adk.user(text)).toList().toFuture();
        if (!held) {
          turn.get();
        }
        break;
      } catch (ExecutionException e) {
        if (e.getCause() instanceof TurnRejectedException busy
            && busy.error().equals("session_busy")
            && attempts < 300) {
          Thread.sleep(Math.min(200, Math.max(10, busy.retryAfterMs().orElse(100))));
          continue;
        }
        if (!held) {
          report("done", running.get(), attempts, null, e.getCause());
          return;
        }
        throw e;
      }
    }
    if (held) {
      reached.await();
      report("in_model", running.get(), attempts, null, null);
    }
    try {
      report("done", running.get(), attempts, Adk.text(turn.get()), null);
    } catch (ExecutionException e) {
      report("done", running.get(), attempts, null, e.getCause());
    }
    System.exit(0);
  }

  private static void report(String event, Turn turn, int attempts, String answer, Throwable error) {
    ObjectNode r = JSON.createObjectNode();
    r.put("event", event);
    r.put("attempts", attempts);
    if (turn != null) {
      r.put("lease_fence", turn.fence());
      r.put("db_fence", turn.db().orElseThrow().number());
    }
    r.put("answer", answer);
    for (Throwable t = error; t != null; t = t.getCause()) {
      if (t instanceof FenceException f) {
        r.put("error", f.code());
        if (f instanceof StaleFenceException s) {
          r.put("fence", s.fence());
          r.put("latest", s.latest());
        }
        break;
      }
      if (t.getCause() == null) {
        r.put("error", t.toString());
      }
    }
    System.out.println("REPORT " + r);
    System.out.flush();
  }
}
