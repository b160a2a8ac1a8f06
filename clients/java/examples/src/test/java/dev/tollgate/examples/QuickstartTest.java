package dev.tollgate.examples;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.tollgate.client.testing.Sidecar;
import dev.tollgate.client.testing.Tokens;
import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/** The README's example against a real sidecar, in this JVM and as its own process. */
class QuickstartTest {
  static final List<String> EXPECTED =
      List.of(
          "admitted inv-1: estimate 1000 tokens, max wait 2000 ms",
          "reserved 1000 tokens as 1.inv-1",
          "settled 812",
          "released inv-1");

  @Test
  void theReadmeExampleRuns() throws Exception {
    try (Sidecar sc = Sidecar.start("")) {
      ByteArrayOutputStream bytes = new ByteArrayOutputStream();
      Quickstart.run(sc.url(), Tokens.token("alice"), new PrintStream(bytes, true, StandardCharsets.UTF_8));
      assertEquals(EXPECTED, bytes.toString(StandardCharsets.UTF_8).lines().toList());
      // Charged once at the actual usage, nothing left held.
      var admin = dev.tollgate.client.TollgateClient.builder(sc.url()).adminToken(Tokens.ADMIN).build();
      var alice = admin.blocking().admin().user("alice");
      assertEquals(100_000 - 812, alice.tokensAvailable());
      assertEquals(List.of(), alice.leases());
    }
  }

  @Test
  void theAdkExampleAnswersFourTurnsAndRefusesTheFifth() {
    // User "five": a burst of 5 turns, as the embedded default's plan.
    try (Sidecar sc = Sidecar.start("")) {
      ByteArrayOutputStream bytes = new ByteArrayOutputStream();
      PrintStream out = new PrintStream(bytes, true, StandardCharsets.UTF_8);
      Quickstart.run(sc.url(), Tokens.token("five"), out);
      Quickstart.runAdk(sc.url(), Tokens.token("five"), out);
      List<String> lines = bytes.toString(StandardCharsets.UTF_8).lines().toList();
      assertEquals(EXPECTED, lines.subList(0, 4));
      for (int i = 1; i <= 4; i++) {
        assertEquals("turn " + i + ": Here is your answer.", lines.get(3 + i));
      }
      assertTrue(lines.get(8).startsWith("turn 5: This request was not started: you have sent too many requests recently (limit: turn_rate). Please retry in "), lines.get(8));
      assertEquals(9, lines.size(), lines.toString());
    }
  }

  @Test
  void theMainRunsAsAProcess() throws Exception {
    try (Sidecar sc = Sidecar.start("")) {
      String java = Path.of(System.getProperty("java.home"), "bin", "java").toString();
      ProcessBuilder pb =
          new ProcessBuilder(java, "-cp", System.getProperty("java.class.path"), Quickstart.class.getName())
              .redirectErrorStream(true);
      pb.environment().put("TOLLGATE_URL", sc.url());
      pb.environment().put("TOLLGATE_TOKEN", Tokens.token("five"));
      Process p = pb.start();
      String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
      assertTrue(p.waitFor(60, TimeUnit.SECONDS));
      assertEquals(0, p.exitValue(), out);
      List<String> lines = out.lines().filter(l -> !l.startsWith("SLF4J")).toList();
      assertEquals(EXPECTED, lines.subList(0, 4), out);
      assertEquals(9, lines.size(), out);
    }
  }
}
