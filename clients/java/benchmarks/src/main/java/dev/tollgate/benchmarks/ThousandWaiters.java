package dev.tollgate.benchmarks;

import com.google.adk.agents.LlmAgent;
import com.google.adk.artifacts.InMemoryArtifactService;
import com.google.adk.models.BaseLlm;
import com.google.adk.models.BaseLlmConnection;
import com.google.adk.models.LlmRequest;
import com.google.adk.models.LlmResponse;
import com.google.adk.runner.Runner;
import com.google.adk.sessions.InMemorySessionService;
import com.google.genai.types.Content;
import com.google.genai.types.GenerateContentResponseUsageMetadata;
import com.google.genai.types.Part;
import dev.tollgate.adk.TollgatePlugin;
import dev.tollgate.client.Reserve;
import dev.tollgate.client.TollgateClient;
import dev.tollgate.client.testing.Sidecar;
import io.reactivex.rxjava3.core.Flowable;
import io.reactivex.rxjava3.disposables.CompositeDisposable;
import java.lang.management.ManagementFactory;
import java.lang.management.MemoryMXBean;
import java.lang.management.ThreadMXBean;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * {@code runs} ADK runs of one user waiting on the token bucket at once (client-side waits: the
 * plugin reserves decide-only and waits on an RxJava timer): the JVM's live threads and used heap
 * before and while they all wait.
 *
 * <p>{@code TOLLGATE_BIN=target/release/tollgate mvn -q -f clients/java/benchmarks/pom.xml exec:java
 * -Dexec.mainClass=dev.tollgate.benchmarks.ThousandWaiters -Dexec.args="1000"}
 */
public final class ThousandWaiters {
  private ThousandWaiters() {}

  /** 1,000 tokens a second bursting to 1,000; 20 tokens a call; waits up to 30 s (the last run waits about 25 s). */
  static final String CROWD =
      """
      [overrides.crowd]
      turns = { amount = 1000000, period_ms = 60000, burst = 1000000 }
      tokens = { amount = 60000, period_ms = 60000, burst = 1000 }
      estimate_tokens = 20
      max_wait_ms = 30000
      concurrent_runs = 100000
      """;

  /**
   * Runs the measurement.
   *
   * @param args how many runs (default 1000)
   * @throws InterruptedException never in practice
   */
  public static void main(String[] args) throws InterruptedException {
    int runs = args.length > 0 ? Integer.parseInt(args[0]) : 1_000;
    ThreadMXBean threads = ManagementFactory.getThreadMXBean();
    MemoryMXBean memory = ManagementFactory.getMemoryMXBean();
    try (Sidecar sc = Sidecar.start("", CROWD)) {
      TollgateClient client = sc.client();
      AtomicInteger called = new AtomicInteger();
      BaseLlm model = new BaseLlm("crowd") {
        @Override
        public Flowable<LlmResponse> generateContent(LlmRequest request, boolean stream) {
          called.incrementAndGet();
          return Flowable.just(LlmResponse.builder()
              .content(Content.builder().role("model").parts(List.of(Part.fromText("ok"))).build())
              .usageMetadata(GenerateContentResponseUsageMetadata.builder().totalTokenCount(20).build())
              .build());
        }

        @Override
        public BaseLlmConnection connect(LlmRequest request) {
          throw new UnsupportedOperationException();
        }
      };
      TollgatePlugin plugin = TollgatePlugin.builder(client).build();
      LlmAgent agent = LlmAgent.builder().name("crowd").model(model).instruction("Be brief.").build();
      Runner runner = Runner.builder().agent(agent).appName("crowd")
          .sessionService(new InMemorySessionService()).artifactService(new InMemoryArtifactService())
          .plugins(plugin).build();
      for (int i = 0; i < runs; i++) {
        runner.sessionService().createSession("crowd", "crowd", (Map<String, Object>) null, "s" + i).blockingGet();
      }
      // Warm the client, then empty the bucket and put it 5 s in debt, so every run's wait
      // (5 s, plus 20 ms for each run before it) outlasts the admission of all of them.
      client.forUser("crowd").admitRun("drain").join();
      client.forUser("crowd").reserve(Reserve.of("drain", 1_000)).join();
      client.forUser("crowd").reserve(Reserve.of("drain", 5_000)).join();
      System.gc();
      int threadsBefore = threads.getThreadCount();
      long heapBefore = memory.getHeapMemoryUsage().getUsed();
      System.out.printf("before: %d live threads, heap used %.1f MiB%n", threadsBefore, heapBefore / 1048576.0);

      Content msg = Content.builder().role("user").parts(List.of(Part.fromText("q"))).build();
      CompositeDisposable all = new CompositeDisposable();
      AtomicInteger done = new AtomicInteger();
      long t0 = System.nanoTime();
      for (int i = 0; i < runs; i++) {
        all.add(runner.runAsync("crowd", "s" + i, msg).subscribe(e -> {}, e -> done.incrementAndGet(), done::incrementAndGet));
      }
      // Runs admitted and not yet at the model are waiting for their tokens (the reserve itself
      // takes a loopback round trip): sample the peak.
      int peak = 0;
      int threadsAtPeak = 0;
      long heapAtPeak = 0;
      int maxThreads = 0;
      long heapAfterGc = -1;
      while (done.get() < runs) {
        int waiting = plugin.openRuns() - called.get() + done.get();
        int t = threads.getThreadCount();
        maxThreads = Math.max(maxThreads, t);
        if (waiting > peak) {
          peak = waiting;
          threadsAtPeak = t;
          heapAtPeak = memory.getHeapMemoryUsage().getUsed();
          if (waiting == runs && heapAfterGc < 0) {
            // Every run waits: what they hold, garbage collected.
            System.gc();
            heapAfterGc = memory.getHeapMemoryUsage().getUsed();
          }
        }
        Thread.sleep(10);
      }
      System.out.printf("during: at the peak %d runs waiting on timers, %d live threads, heap used %.1f MiB"
          + " (%.1f MiB after a GC with all waiting); most threads seen %d%n",
          peak, threadsAtPeak, heapAtPeak / 1048576.0, heapAfterGc / 1048576.0, maxThreads);
      while (done.get() < runs) {
        Thread.sleep(50);
      }
      System.out.printf("all %d runs answered in %.1f s; model calls %d%n", runs, (System.nanoTime() - t0) / 1e9, called.get());
      all.dispose();
    }
  }
}
