package dev.tollgate.benchmarks;

import com.google.adk.events.Event;
import com.google.adk.events.EventActions;
import com.google.adk.sessions.Session;
import com.google.genai.types.Content;
import com.google.genai.types.Part;
import dev.tollgate.adk.postgres.PgSessionService;
import java.util.List;
import java.util.Map;
import java.util.Optional;

/**
 * The latency of {@link PgSessionService}'s fenced append and of a whole-session read, in a real
 * PostgreSQL: 1 KiB events; appends to a session that holds about 10 or 1,000 events (each sample
 * one append, so the session grows by the samples), reads of the whole session; p50 and p99 per
 * round. The database must be empty or tollgate's own (the harness creates its sessions under the
 * app {@code bench} and deletes them at the end).
 *
 * <p>{@code mvn -q -f clients/java/pom.xml install -DskipTests && mvn -q -f
 * clients/java/benchmarks/pom.xml exec:java -Dexec.mainClass=dev.tollgate.benchmarks.PgSessions
 * -Dexec.args="jdbc:postgresql://127.0.0.1:5432/db?user=u 400 100 2"}
 */
public final class PgSessions {
  private PgSessions() {}

  static final String APP = "bench";
  static final String KIB = "x".repeat(1024);

  /**
   * Runs the harness.
   *
   * @param args JDBC URL, appends per round and size, reads per round and size, rounds
   */
  public static void main(String[] args) {
    String url = args[0];
    int appends = Integer.parseInt(args[1]);
    int reads = Integer.parseInt(args[2]);
    int rounds = Integer.parseInt(args[3]);
    try (PgSessionService s = PgSessionService.connect(url, PgSessionService.PoolBounds.DEFAULT)) {
      s.migrate().blockingGet();
      for (int round = 1; round <= rounds; round++) {
        for (int size : new int[] {10, 1_000}) {
          String id = "s-" + size + "-" + round + "-" + System.nanoTime();
          s.createSession(APP, "u", Map.of(), id).blockingGet();
          Session turn = s.getSession(APP, "u", id, Optional.empty()).blockingGet();
          turn.state().put(PgSessionService.FENCE_KEY, s.takeFence(APP, "u", id).blockingGet());
          for (int i = 0; i < size; i++) {
            s.appendEvent(turn, event("fill-" + i)).blockingGet();
          }
          long[] append = new long[appends];
          for (int i = 0; i < appends; i++) {
            Event e = event("a-" + i);
            long t0 = System.nanoTime();
            s.appendEvent(turn, e).blockingGet();
            append[i] = System.nanoTime() - t0;
          }
          // Reads of exactly `size` events: the most recent ones.
          var config = Optional.of(com.google.adk.sessions.GetSessionConfig.builder().numRecentEvents(size).build());
          for (int i = 0; i < 10; i++) {
            s.getSession(APP, "u", id, config).blockingGet();
          }
          long[] read = new long[reads];
          for (int i = 0; i < reads; i++) {
            long t0 = System.nanoTime();
            Session got = s.getSession(APP, "u", id, config).blockingGet();
            read[i] = System.nanoTime() - t0;
            if (got.events().size() != size) {
              throw new IllegalStateException("read " + got.events().size() + " events");
            }
          }
          System.out.printf("round %d, %d-event session: append %s%n", round, size, Stats.summary(append));
          System.out.printf("round %d, %d-event session: read   %s%n", round, size, Stats.summary(read));
          s.deleteSession(APP, "u", id).blockingAwait();
        }
      }
    }
  }

  static Event event(String id) {
    return Event.builder()
        .id(id)
        .invocationId("inv")
        .author("helper")
        .content(Content.builder().role("model").parts(List.of(Part.fromText(KIB))).build())
        .actions(EventActions.builder().build())
        .build();
  }
}
