package dev.tollgate.examples;

import dev.tollgate.client.Admitted;
import dev.tollgate.client.Outcome;
import dev.tollgate.client.Refusal;
import dev.tollgate.client.Reservation;
import dev.tollgate.client.Reserve;
import dev.tollgate.client.TollgateClient;
import dev.tollgate.client.UserClient;
import java.io.PrintStream;

/**
 * The README's example, runnable against a real sidecar:
 *
 * <pre>
 * cargo run -p tollgate-server -- serve        # the embedded default
 * export TOLLGATE_TOKEN=$(cargo run -q -p tollgate-server -- token --user alice)
 * mvn -q -f clients/java/pom.xml install -DskipTests
 * mvn -q -f clients/java/examples/pom.xml compile exec:java
 * </pre>
 *
 * <p>{@code TOLLGATE_URL} names another sidecar (default {@code http://127.0.0.1:8787}). One turn
 * of user {@code alice}: admitted, the plan's estimate reserved (the sidecar waits if the tokens
 * need it), settled at the 812 tokens the model call used, released.
 */
public final class Quickstart {
  private Quickstart() {}

  /**
   * Runs the example against {@code TOLLGATE_URL} with {@code TOLLGATE_TOKEN}.
   *
   * @param args none
   */
  public static void main(String[] args) {
    String url = System.getenv().getOrDefault("TOLLGATE_URL", "http://127.0.0.1:8787");
    String token = System.getenv("TOLLGATE_TOKEN");
    if (token == null || token.isBlank()) {
      System.err.println("set TOLLGATE_TOKEN: cargo run -q -p tollgate-server -- token --user alice");
      System.exit(64);
    }
    run(url, token, System.out);
  }

  /**
   * The example: one turn of {@code alice} against the sidecar at {@code url}.
   *
   * @param url the sidecar
   * @param token alice's token
   * @param out where to print
   */
  public static void run(String url, String token, PrintStream out) {
    try (TollgateClient tollgate =
        TollgateClient.builder(url)
            .credentials(userId -> tokenFor(userId, token)) // the host's verified credential
            .build()) {
      UserClient.Blocking alice = tollgate.blocking().forUser("alice");

      Outcome<Admitted> turn = alice.admitRun("inv-1");
      if (turn instanceof Outcome.Refused<Admitted> r) { // TurnRateLimited, ConcurrencyLimited, ...
        out.println("refused: " + r.refusal().error() + " " + r.refusal().message());
        return;
      }
      Admitted a = turn.granted().orElseThrow();
      out.println("admitted inv-1: estimate " + a.estimateTokens() + " tokens, max wait " + a.maxWaitMs() + " ms");

      Outcome<Reservation> reserved =
          alice.reserve(Reserve.of("inv-1", a.estimateTokens()).waiting(a.maxWaitMs()));
      if (reserved instanceof Outcome.Refused<Reservation> refused) { // TokenRateLimited, ...
        Refusal why = refused.refusal();
        out.println("reserve refused: " + why.error() + " " + why.message());
      } else {
        Reservation r = reserved.granted().orElseThrow();
        out.println("reserved " + a.estimateTokens() + " tokens as " + r.reservationId());
        // ... call the model, then settle at what it used:
        alice.settle(r.reservationId(), 812);
        out.println("settled 812");
      }
      alice.releaseRun("inv-1");
      out.println("released inv-1");
    }
  }

  /** Here every user has the one token; a service asks its identity provider. */
  private static String tokenFor(String userId, String token) {
    return token;
  }
}
