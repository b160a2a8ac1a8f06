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
  void theMainRunsAsAProcess() throws Exception {
    try (Sidecar sc = Sidecar.start("")) {
      String java = Path.of(System.getProperty("java.home"), "bin", "java").toString();
      ProcessBuilder pb =
          new ProcessBuilder(java, "-cp", System.getProperty("java.class.path"), Quickstart.class.getName())
              .redirectErrorStream(true);
      pb.environment().put("TOLLGATE_URL", sc.url());
      pb.environment().put("TOLLGATE_TOKEN", Tokens.token("alice"));
      Process p = pb.start();
      String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
      assertTrue(p.waitFor(60, TimeUnit.SECONDS));
      assertEquals(0, p.exitValue(), out);
      assertEquals(EXPECTED, out.lines().toList());
    }
  }
}
