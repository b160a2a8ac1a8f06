package dev.tollgate.benchmarks;

import com.google.adk.events.Event;
import com.google.adk.models.BaseLlm;
import com.google.adk.models.BaseLlmConnection;
import com.google.adk.models.LlmRequest;
import com.google.adk.models.LlmResponse;
import com.google.adk.agents.LlmAgent;
import com.google.adk.artifacts.InMemoryArtifactService;
import com.google.adk.runner.Runner;
import com.google.adk.sessions.InMemorySessionService;
import com.google.genai.types.Content;
import com.google.genai.types.GenerateContentResponseUsageMetadata;
import com.google.genai.types.Part;
import dev.tollgate.adk.TollgatePlugin;
import dev.tollgate.client.Reserve;
import dev.tollgate.client.TollgateClient;
import dev.tollgate.client.UserClient;
import dev.tollgate.client.testing.Sidecar;
import io.reactivex.rxjava3.core.Flowable;
import java.util.List;
import java.util.Map;

/**
 * The plugin's cost per model call, on loopback against a real sidecar ({@code $TOLLGATE_BIN},
 * best a release build): (1) the reserve + settle pair the plugin sends around each call, p50 and
 * p99 over {@code samples} sequential pairs; (2) whole ADK turns of one model call with the plugin
 * and without it, alternated in blocks (A B A B ...), the difference being admit + reserve +
 * settle + release per turn.
 *
 * <p>{@code mvn -q -f clients/java/pom.xml install -DskipTests && TOLLGATE_BIN=target/release/tollgate
 * mvn -q -f clients/java/benchmarks/pom.xml exec:java -Dexec.mainClass=dev.tollgate.benchmarks.PluginOverhead
 * -Dexec.args="5000 300 3"}
 */
public final class PluginOverhead {
  private PluginOverhead() {}

  static final String BENCH =
      """
      [overrides.bench]
      turns = { amount = 1000000, period_ms = 60000, burst = 1000000 }
      tokens = { amount = 100000000, period_ms = 60000, burst = 100000000 }
      max_llm_calls = 1000000
      concurrent_runs = 100
      """;

  /** Answers at once with 10 tokens of usage. */
  static final class Instant extends BaseLlm {
    Instant() {
      super("instant");
    }

    @Override
    public Flowable<LlmResponse> generateContent(LlmRequest request, boolean stream) {
      return Flowable.just(LlmResponse.builder()
          .content(Content.builder().role("model").parts(List.of(Part.fromText("ok"))).build())
          .usageMetadata(GenerateContentResponseUsageMetadata.builder().promptTokenCount(8)
              .candidatesTokenCount(2).totalTokenCount(10).build())
          .build());
    }

    @Override
    public BaseLlmConnection connect(LlmRequest request) {
      throw new UnsupportedOperationException();
    }
  }

  /**
   * Runs the measurements.
   *
   * @param args samples of pairs (default 5000), turns per block (default 300), rounds of A B
   *     (default 3)
   */
  public static void main(String[] args) {
    int samples = args.length > 0 ? Integer.parseInt(args[0]) : 5_000;
    int turns = args.length > 1 ? Integer.parseInt(args[1]) : 300;
    int rounds = args.length > 2 ? Integer.parseInt(args[2]) : 3;
    try (Sidecar sc = Sidecar.start("", BENCH)) {
      TollgateClient client = sc.client();
      UserClient bench = client.forUser("bench");
      bench.admitRun("pairs").join();
      long[] pairs = new long[samples];
      for (int i = -1_000; i < samples; i++) {
        long t0 = System.nanoTime();
        String id = bench.reserve(Reserve.of("pairs", 10)).join().granted().orElseThrow().reservationId();
        bench.settle(id, 10).join();
        if (i >= 0) {
          pairs[i] = System.nanoTime() - t0;
        }
      }
      System.out.println("reserve + settle pair (loopback): " + Stats.summary(pairs));

      Runner with = runner(TollgatePlugin.builder(client).build());
      Runner without = runner(null);
      turns(with, turns);
      turns(without, turns);
      for (int r = 1; r <= rounds; r++) {
        long[] a = turns(with, turns);
        long[] b = turns(without, turns);
        double ma = mean(a);
        double mb = mean(b);
        System.out.printf("round %d: turn with plugin %s%n         without        %s%n         overhead per turn %.0f us (x%.2f)%n",
            r, Stats.summary(a), Stats.summary(b), ma - mb, ma / mb);
      }
    }
  }

  static double mean(long[] ns) {
    return java.util.Arrays.stream(ns).average().orElse(0) / 1_000.0;
  }

  static Runner runner(TollgatePlugin plugin) {
    LlmAgent agent = LlmAgent.builder().name("bench").model(new Instant()).instruction("Be brief.").build();
    Runner.Builder b = Runner.builder().agent(agent).appName("bench")
        .sessionService(new InMemorySessionService()).artifactService(new InMemoryArtifactService());
    if (plugin != null) {
      b.plugins(plugin);
    }
    Runner runner = b.build();
    runner.sessionService().createSession("bench", "bench", (Map<String, Object>) null, "s").blockingGet();
    return runner;
  }

  static long[] turns(Runner runner, int n) {
    long[] out = new long[n];
    Content msg = Content.builder().role("user").parts(List.of(Part.fromText("q"))).build();
    for (int i = 0; i < n; i++) {
      long t0 = System.nanoTime();
      List<Event> events = runner.runAsync("bench", "s", msg).toList().blockingGet();
      out[i] = System.nanoTime() - t0;
      if (events.isEmpty()) {
        throw new IllegalStateException("a turn answered nothing");
      }
    }
    return out;
  }
}
