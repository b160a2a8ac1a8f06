package dev.tollgate.adk;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.adk.runner.Runner;
import dev.tollgate.client.TollgateClient;
import dev.tollgate.client.testing.Processes;
import dev.tollgate.client.testing.Sidecar;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/**
 * A JVM killed mid-turn (SIGKILL: no callback, no finally) leaves its session lease to expire by
 * its TTL; until then the session is busy, after it the next turn is admitted with the next fence.
 */
class KilledJvmTest {
  static final long TTL_MS = 2_000;

  @Test
  void aKilledJvmsLeaseExpiresByItsTtlThenTheNextTurnIsAdmitted() throws Exception {
    try (Sidecar sc = Sidecar.start("")) {
      String java = Path.of(System.getProperty("java.home"), "bin", "java").toString();
      Process child = Processes.start(new ProcessBuilder(java, "-cp", System.getProperty("java.class.path"),
              ChildTurn.class.getName(), sc.url(), "kim", "s-kim", Long.toString(TTL_MS))
          .redirectErrorStream(true));
      BufferedReader out = new BufferedReader(new InputStreamReader(child.getInputStream(), StandardCharsets.UTF_8));
      String line;
      StringBuilder seen = new StringBuilder();
      while ((line = out.readLine()) != null && !line.startsWith("RUNNING")) {
        seen.append(line).append('\n');
      }
      assertEquals("RUNNING fence=1", line, seen.toString());
      child.destroyForcibly();
      assertTrue(child.waitFor(10, TimeUnit.SECONDS));
      long killedAt = System.nanoTime();

      TollgateClient client = sc.client();
      Runner runner = Adk.runner(Adk.agent("helper", ScriptedLlm.answering("answered", 10)),
          TollgatePlugin.builder(client).build());
      TurnExecutor executor = TurnExecutor.builder(runner, client).sessionTtlMs(TTL_MS).build();
      Adk.session(runner, "kim", "s-kim");
      TurnRejectedException busy = assertThrows(TurnRejectedException.class,
          () -> executor.runAsync("kim", "s-kim", Adk.user("next")).ignoreElements().blockingAwait());
      assertEquals("session_busy", busy.error());
      assertTrue(busy.retryAfterMs().getAsLong() <= TTL_MS, busy.getMessage());
      // Poll until the dead holder's lease has expired; then the turn runs.
      String[] answer = new String[1];
      assertTrue(Processes.poll(15_000, () -> {
        try {
          answer[0] = Adk.text(Adk.turn(executor.runAsync("kim", "s-kim", Adk.user("next"))));
          return true;
        } catch (TurnRejectedException stillBusy) {
          return false;
        }
      }));
      long afterMs = (System.nanoTime() - killedAt) / 1_000_000;
      assertEquals("answered", answer[0]);
      assertTrue(afterMs >= TTL_MS / 2, "admitted only once the lease expired: " + afterMs + " ms");
      // Fences: 1 the killed turn, 2 the next one, 3 this probe.
      assertEquals(3, client.blocking().forUser("kim").acquireSessionLease("s-kim", "probe", 1_000)
          .granted().orElseThrow().fence());
    }
  }
}
