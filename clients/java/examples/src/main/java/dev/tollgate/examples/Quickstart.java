package dev.tollgate.examples;

import com.google.adk.agents.LlmAgent;
import com.google.adk.artifacts.InMemoryArtifactService;
import com.google.adk.events.Event;
import com.google.adk.models.BaseLlm;
import com.google.adk.models.BaseLlmConnection;
import com.google.adk.models.LlmRequest;
import com.google.adk.models.LlmResponse;
import com.google.adk.runner.Runner;
import com.google.adk.sessions.InMemorySessionService;
import com.google.adk.sessions.Session;
import com.google.genai.types.Content;
import com.google.genai.types.GenerateContentResponseUsageMetadata;
import com.google.genai.types.Part;
import dev.tollgate.adk.TollgatePlugin;
import dev.tollgate.client.Admitted;
import dev.tollgate.client.Outcome;
import dev.tollgate.client.Refusal;
import dev.tollgate.client.Reservation;
import dev.tollgate.client.Reserve;
import dev.tollgate.client.TollgateClient;
import dev.tollgate.client.UserClient;
import io.reactivex.rxjava3.core.Flowable;
import java.io.PrintStream;
import java.util.List;

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
 * <p>{@code TOLLGATE_URL} names another sidecar (default {@code http://127.0.0.1:8787}). First the
 * client example, one turn of user {@code alice}: admitted, the plan's estimate reserved (the
 * sidecar waits if the tokens need it), settled at the 812 tokens the model call used, released.
 * Then {@link TollgatePlugin} registered in three lines on a real ADK Java runner, and turns run
 * until the plan's turn burst is spent: on the default plan (bursting to 5 turns) four turns are
 * answered and the fifth is refused with the plugin's plain message. The model is a stand-in that
 * answers offline with a fixed usage, so the example needs no model credentials.
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
    runAdk(url, token, System.out);
  }

  /** Answers every call with one line and 812 tokens of usage. */
  static final class OfflineLlm extends BaseLlm {
    OfflineLlm() {
      super("offline");
    }

    @Override
    public Flowable<LlmResponse> generateContent(LlmRequest request, boolean stream) {
      return Flowable.just(LlmResponse.builder()
          .content(Content.builder().role("model").parts(List.of(Part.fromText("Here is your answer."))).build())
          .usageMetadata(GenerateContentResponseUsageMetadata.builder()
              .promptTokenCount(800).candidatesTokenCount(12).totalTokenCount(812).build())
          .build());
    }

    @Override
    public BaseLlmConnection connect(LlmRequest request) {
      throw new UnsupportedOperationException("offline");
    }
  }

  /**
   * The ADK example: five turns of {@code alice} through a runner with {@link TollgatePlugin}.
   *
   * @param url the sidecar
   * @param token alice's token
   * @param out where to print
   */
  public static void runAdk(String url, String token, PrintStream out) {
    TollgateClient tollgate = TollgateClient.builder(url).credentials(userId -> tokenFor(userId, token)).build();
    LlmAgent agent = LlmAgent.builder().name("support_agent").model(new OfflineLlm()).instruction("Be brief.").build();
    Runner runner = Runner.builder().agent(agent).appName("support")
        .sessionService(new InMemorySessionService()).artifactService(new InMemoryArtifactService())
        .plugins(TollgatePlugin.builder(tollgate).build())
        .build();
    Session session = runner.sessionService().createSession("support", "alice").blockingGet();
    for (int i = 1; i <= 5; i++) {
      Content message = Content.builder().role("user").parts(List.of(Part.fromText("question " + i))).build();
      for (Event event : runner.runAsync("alice", session.id(), message).blockingIterable()) {
        for (Part part : event.content().flatMap(Content::parts).orElse(List.of())) {
          int turn = i;
          part.text().ifPresent(text -> out.println("turn " + turn + ": " + text));
        }
      }
    }
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
