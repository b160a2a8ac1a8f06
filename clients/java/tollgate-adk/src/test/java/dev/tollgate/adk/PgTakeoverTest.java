package dev.tollgate.adk;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.google.adk.events.Event;
import dev.tollgate.adk.postgres.PgSessionService;
import dev.tollgate.client.testing.Processes;
import dev.tollgate.client.testing.RedisServer;
import dev.tollgate.client.testing.Sidecar;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.io.Writer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.stream.Collectors;
import org.junit.jupiter.api.Test;

/**
 * Two replica JVMs ({@link ChildPgTurn}) share a sidecar on Redis for their session leases and
 * PostgreSQL for their sessions (docs/spec.md §4, <i>Sessions in PostgreSQL</i>): A is SIGSTOPped in
 * its model call past its lease; B takes the session once the lease has run out (retrying while
 * it is busy) and completes a real ADK
 * turn; A, resumed, has its late append refused by the database with the stale-fence error. The
 * history is A's message, then B's whole turn: nothing interleaved, nothing of B's lost.
 */
class PgTakeoverTest {
  static final long TTL_MS = 3_000;
  static final ObjectMapper JSON = new ObjectMapper();

  @Test
  void aPausedJvmsLateAppendIsRefusedByTheDatabase() throws Exception {
    try (RedisServer redis = RedisServer.start();
        Sidecar sc = Sidecar.start("", Sidecar.redisStore(redis, "fail_closed"));
        PgDatabase db = PgDatabase.create()) {
      PgSessionService sessions = PgSessionService.builder(db.pool(2)).build();
      sessions.migrate().blockingGet();
      sessions.createSession(Adk.APP, "tara", Map.of(), "s-tara").blockingGet();

      try (Replica a = new Replica(sc.url(), db.jdbcUrl(), "held", "from A")) {
        JsonNode aIn = a.next("in_model");
        a.signal("STOP");
        JsonNode bDone;
        try (Replica b = new Replica(sc.url(), db.jdbcUrl(), "free", "from B")) {
          bDone = b.next("done");
          b.finish();
        }
        assertEquals("answer to from B", bDone.path("answer").asText(), bDone.toString());
        assertTrue(bDone.path("lease_fence").asLong() > aIn.path("lease_fence").asLong(), bDone.toString());
        assertEquals(aIn.path("db_fence").asLong() + 1, bDone.path("db_fence").asLong(), bDone.toString());

        a.release();
        a.signal("CONT");
        JsonNode aDone = a.next("done");
        a.finish();
        assertEquals("session.fence_stale", aDone.path("error").asText(), aDone.toString());
        assertEquals(aIn.path("db_fence").asLong(), aDone.path("fence").asLong(), aDone.toString());
        assertEquals(bDone.path("db_fence").asLong(), aDone.path("latest").asLong(), aDone.toString());
      }

      List<Event> history =
          sessions.getSession(Adk.APP, "tara", "s-tara", Optional.empty()).blockingGet().events();
      assertEquals(
          List.of("user: from A", "user: from B", "helper: answer to from B"),
          history.stream().map(e -> e.author() + ": " + Adk.text(List.of(e))).collect(Collectors.toList()));
    }
  }

  /** A {@link ChildPgTurn} JVM; killed if the test ends first. */
  static final class Replica implements AutoCloseable {
    final Process process;
    final BlockingQueue<JsonNode> reports = new LinkedBlockingQueue<>();
    final StringBuilder output = new StringBuilder();
    final Writer stdin;

    Replica(String sidecar, String jdbcUrl, String role, String text) throws IOException {
      String java = Path.of(System.getProperty("java.home"), "bin", "java").toString();
      process =
          Processes.start(
              new ProcessBuilder(java, "-cp", System.getProperty("java.class.path"),
                      ChildPgTurn.class.getName(), sidecar, jdbcUrl, "tara", "s-tara",
                      Long.toString(TTL_MS), role, text)
                  .redirectErrorStream(true));
      stdin = new OutputStreamWriter(process.getOutputStream(), StandardCharsets.UTF_8);
      Thread reader =
          new Thread(
              () -> {
                try (BufferedReader out =
                    new BufferedReader(new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8))) {
                  String line;
                  while ((line = out.readLine()) != null) {
                    synchronized (output) {
                      output.append(line).append('\n');
                    }
                    if (line.startsWith("REPORT ")) {
                      reports.add(JSON.readTree(line.substring("REPORT ".length())));
                    }
                  }
                } catch (IOException e) {
                  // The process is gone.
                }
              });
      reader.setDaemon(true);
      reader.start();
    }

    JsonNode next(String event) throws InterruptedException {
      JsonNode report = reports.poll(60, TimeUnit.SECONDS);
      if (report == null) {
        synchronized (output) {
          throw new AssertionError("no `" + event + "` report in 60 s; output:\n" + output);
        }
      }
      assertEquals(event, report.path("event").asText(), report.toString());
      return report;
    }

    void signal(String signal) throws IOException, InterruptedException {
      Process kill = new ProcessBuilder("kill", "-" + signal, Long.toString(process.pid())).start();
      assertEquals(0, kill.waitFor(), "kill -" + signal);
    }

    void release() throws IOException {
      stdin.write("answer\n");
      stdin.flush();
    }

    void finish() throws InterruptedException {
      assertTrue(process.waitFor(30, TimeUnit.SECONDS), "the replica exits");
      assertEquals(0, process.exitValue(), output.toString());
    }

    @Override
    public void close() {
      if (process.isAlive()) {
        process.destroyForcibly();
      }
    }
  }
}
