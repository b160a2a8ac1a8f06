package dev.tollgate.adk;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.adk.agents.LlmAgent;
import com.google.adk.agents.ParallelAgent;
import com.google.adk.events.Event;
import com.google.adk.models.LlmRequest;
import com.google.adk.models.LlmResponse;
import com.google.adk.runner.Runner;
import com.google.adk.tools.FunctionTool;
import com.google.genai.types.Content;
import com.google.genai.types.Part;
import dev.tollgate.client.Outcome;
import dev.tollgate.client.Refusal;
import dev.tollgate.client.RetryPolicy;
import dev.tollgate.client.TollgateClient;
import dev.tollgate.client.UserView;
import dev.tollgate.client.testing.Processes;
import dev.tollgate.client.testing.Sidecar;
import dev.tollgate.client.testing.SidecarClass;
import dev.tollgate.client.testing.Tokens;
import io.reactivex.rxjava3.core.Flowable;
import io.reactivex.rxjava3.disposables.Disposable;
import io.reactivex.rxjava3.schedulers.Schedulers;
import io.reactivex.rxjava3.subjects.CompletableSubject;
import io.reactivex.rxjava3.subscribers.TestSubscriber;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.Test;

/**
 * Real ADK Java turns ({@link Runner} with a scripted model) under {@link TollgatePlugin} and
 * {@link TurnExecutor} against one real sidecar per store (the subclasses). The plans refill one
 * token or turn an hour, so counts are exact in real time; each test has users of its own.
 */
abstract class PluginContract extends SidecarClass {
  /** meter6: a 60,000-token bucket, 6,000 tokens a call, a 2 s maximum wait. */
  static final String OVERRIDES =
      """
      [overrides.meter6]
      tokens = { amount = 1, period_ms = 3600000, burst = 60000 }
      estimate_tokens = 6000
      max_wait_ms = 2000

      [overrides.renew]
      lease_ttl_ms = 600
      """;

  TollgatePlugin plugin() {
    return TollgatePlugin.builder(client).build();
  }

  UserView view(String user) {
    return client.blocking().admin().user(user);
  }

  static final Pattern RETRY = Pattern.compile("Please retry in (\\d+) s\\.");

  static long retrySeconds(String text) {
    Matcher m = RETRY.matcher(text);
    assertTrue(m.find(), text);
    return Long.parseLong(m.group(1));
  }

  @Test
  void tenQuickTurnsOnABurstOfFive() {
    Runner runner = Adk.runner(Adk.agent("helper", ScriptedLlm.answering("Here is your answer.", 100)), plugin());
    String s = Adk.session(runner, "five", "s-five");
    List<String> answers = new ArrayList<>();
    for (int i = 1; i <= 10; i++) {
      answers.add(Adk.text(Adk.turn(runner.runAsync("five", s, Adk.user("question " + i)))));
    }
    for (int i = 0; i < 5; i++) {
      assertEquals("Here is your answer.", answers.get(i));
    }
    for (int i = 5; i < 10; i++) {
      String a = answers.get(i);
      assertTrue(a.startsWith("This request was not started: you have sent too many requests recently (limit: turn_rate). Please retry in "), a);
      // One turn an hour: the hint is an hour less the test's own time (tolerance 100 s).
      long secs = retrySeconds(a);
      assertTrue(secs > 3_500 && secs <= 3_600, a);
    }
    UserView v = view("five");
    assertEquals(0, v.turnsAvailable());
    assertEquals(100_000 - 5 * 100, v.tokensAvailable());
    assertEquals(List.of(), v.leases(), "every admitted run released, no denied one held");
  }

  /** Calls lookup twice, then answers: three model calls a turn. */
  public static Map<String, Object> lookup() {
    return Map.of("found", "nothing");
  }

  static long functionResponsesThisTurn(LlmRequest req) {
    List<Content> contents = req.contents();
    long n = 0;
    for (int i = contents.size() - 1; i >= 0; i--) {
      Content c = contents.get(i);
      List<Part> parts = c.parts().orElse(List.of());
      boolean userText = "user".equals(c.role().orElse("")) && parts.stream().anyMatch(p -> p.text().isPresent());
      if (userText) {
        break;
      }
      n += parts.stream().filter(p -> p.functionResponse().isPresent()).count();
    }
    return n;
  }

  @Test
  void aLaterTurnOfThreeCallsIsCutShortWhenTheBucketEmpties() {
    ScriptedLlm model = new ScriptedLlm((req, n) -> Flowable.just(
        functionResponsesThisTurn(req) < 2 ? ScriptedLlm.call("lookup", 6_000) : ScriptedLlm.text("done", 6_000)));
    LlmAgent agent = Adk.agent("researcher", model, FunctionTool.create(PluginContract.class, "lookup"));
    Runner runner = Adk.runner(agent, plugin());
    String s = Adk.session(runner, "meter6", "s-meter6");
    for (int turn = 1; turn <= 3; turn++) {
      assertEquals("done", Adk.text(Adk.turn(runner.runAsync("meter6", s, Adk.user("turn " + turn)))));
      assertEquals(60_000 - turn * 18_000, view("meter6").tokensAvailable());
    }
    // 6,000 left: the fourth turn's first call takes them, its second is refused.
    String cut = Adk.text(Adk.turn(runner.runAsync("meter6", s, Adk.user("turn 4"))));
    assertTrue(cut.startsWith("The work stopped early: your token budget is spent for now (limit: token_rate). Please retry in "), cut);
    assertEquals(3 * 3 + 1, model.calls.get(), "the refused call never reached the model");
    UserView v = view("meter6");
    assertEquals(0, v.tokensAvailable());
    assertEquals(List.of(), v.leases());
  }

  /** A model that blocks the calls of messages saying "long" until the gate opens. */
  static ScriptedLlm gated(CompletableSubject gate) {
    return new ScriptedLlm((req, n) -> {
      boolean long_ = req.contents().stream().flatMap(c -> c.parts().orElse(List.of()).stream())
          .anyMatch(p -> p.text().orElse("").contains("long"));
      Flowable<LlmResponse> answer = Flowable.just(ScriptedLlm.text("finished", 200));
      return long_ ? gate.andThen(answer) : answer;
    });
  }

  @Test
  void aThirdRunIsRefusedForConcurrencyThenAdmittedAfterOneEnds() {
    CompletableSubject gate = CompletableSubject.create();
    ScriptedLlm model = gated(gate);
    Runner runner = Adk.runner(Adk.agent("helper", model), plugin());
    TestSubscriber<Event> a = runner.runAsync("cc", Adk.session(runner, "cc", "cc-a"), Adk.user("long a"))
        .subscribeOn(Schedulers.io()).test();
    TestSubscriber<Event> b = runner.runAsync("cc", Adk.session(runner, "cc", "cc-b"), Adk.user("long b"))
        .subscribeOn(Schedulers.io()).test();
    assertTrue(Processes.poll(10_000, () -> model.calls.get() == 2), "both long runs reach the model");
    assertEquals(2, view("cc").leases().size());
    String third = Adk.text(Adk.turn(runner.runAsync("cc", Adk.session(runner, "cc", "cc-c"), Adk.user("short"))));
    assertTrue(third.startsWith("This request was not started: too many of your requests are already running (limit: concurrency)."), third);
    gate.onComplete();
    assertTrue(a.awaitDone(10, TimeUnit.SECONDS).values().size() > 0);
    b.awaitDone(10, TimeUnit.SECONDS).assertComplete();
    assertEquals("finished", Adk.text(Adk.turn(runner.runAsync("cc", "cc-c", Adk.user("short again")))));
    assertEquals(List.of(), view("cc").leases());
  }

  @Test
  void aLongRunsLeaseIsRenewedEveryThirdOfItsTtl() {
    CompletableSubject gate = CompletableSubject.create();
    ScriptedLlm model = gated(gate);
    Runner runner = Adk.runner(Adk.agent("helper", model), plugin());
    TestSubscriber<Event> run = runner.runAsync("renew", Adk.session(runner, "renew", "s-renew"), Adk.user("long"))
        .subscribeOn(Schedulers.io()).test();
    assertTrue(Processes.poll(10_000, () -> model.calls.get() == 1));
    long first = view("renew").leases().get(0).expiresAtMs();
    // Renewed every 200 ms: the expiry moves on, and the lease outlives its 600 ms TTL.
    assertTrue(Processes.poll(5_000, () -> {
      List<dev.tollgate.client.LeaseView> l = view("renew").leases();
      return !l.isEmpty() && l.get(0).expiresAtMs() >= first + 600;
    }), () -> "not renewed: " + view("renew"));
    assertEquals(1, view("renew").leases().size());
    gate.onComplete();
    run.awaitDone(10, TimeUnit.SECONDS).assertComplete();
    assertEquals(List.of(), view("renew").leases());
  }

  @Test
  void aParallelAgentOfEightBranchesOnOneBucket() {
    List<LlmAgent> branches = new ArrayList<>();
    for (int i = 0; i < 8; i++) {
      branches.add(Adk.agent("branch" + i, ScriptedLlm.answering("part " + i, 500)));
    }
    ParallelAgent fan = ParallelAgent.builder().name("fan").subAgents(branches).build();
    Runner runner = Adk.runner(fan, plugin());
    List<Event> events = Adk.turn(runner.runAsync("par", Adk.session(runner, "par", "s-par"), Adk.user("go")));
    assertEquals(8, events.stream().filter(e -> e.content().isPresent()).count(), Adk.text(events));
    UserView v = view("par");
    assertEquals(100_000 - 8 * 500, v.tokensAvailable());
    // The sliding-minute estimate loses a little of what was charged just before a minute's turn.
    assertTrue(Math.abs(v.tokensLastMinute() - 8 * 500) <= 8 * 500 / 50, v.toString());
    assertEquals(List.of(), v.leases());
    assertEquals(49, v.turnsAvailable(), "one run");
  }

  @Test
  void streamedChunksSettleOnceAndAModelErrorRefunds() {
    ScriptedLlm model = new ScriptedLlm((req, n) -> n == 0
        ? Flowable.just(ScriptedLlm.partial("Here ", null), ScriptedLlm.partial("is ", 300),
            ScriptedLlm.text("Here is the answer.", 700))
        : Flowable.error(new IllegalStateException("the model failed")));
    Runner runner = Adk.runner(Adk.agent("streamer", model), plugin());
    String s = Adk.session(runner, "st", "s-st");
    Adk.turn(runner.runAsync("st", s, Adk.user("stream")));
    UserView after = view("st");
    assertEquals(100_000 - 700, after.tokensAvailable(), "settled once, at the final usage");
    assertTrue(Math.abs(after.tokensLastMinute() - 700) <= 14, after.toString());
    TestSubscriber<Event> failed = runner.runAsync("st", s, Adk.user("fail")).test();
    failed.awaitDone(10, TimeUnit.SECONDS);
    failed.assertError(IllegalStateException.class);
    // onRunErrorCallback released the run; the reservation was refunded.
    assertTrue(Processes.poll(5_000, () -> view("st").leases().isEmpty()));
    assertEquals(100_000 - 700, view("st").tokensAvailable());
  }

  @Test
  void aDisposedRunFreesItsSlotSessionLeaseAndRunLeaseWithinOneSecond() {
    CompletableSubject gate = CompletableSubject.create();
    ScriptedLlm model = gated(gate);
    Runner runner = Adk.runner(Adk.agent("helper", model), plugin());
    TurnExecutor executor = TurnExecutor.builder(runner, client).maxInFlight(4).sessionTtlMs(60_000).build();
    String s = Adk.session(runner, "dis", "s-dis");
    Disposable run = executor.runAsync("dis", s, Adk.user("long")).subscribeOn(Schedulers.io()).subscribe();
    assertTrue(Processes.poll(10_000, () -> model.calls.get() == 1));
    assertEquals(1, executor.inFlight());
    assertEquals(1, view("dis").leases().size());
    assertEquals(100_000 - 1_000, view("dis").tokensAvailable(), "the call's estimate reserved");
    long t0 = System.nanoTime();
    run.dispose();
    assertTrue(Processes.poll(1_000, () -> {
      UserView v = view("dis");
      return executor.inFlight() == 0 && v.leases().isEmpty() && v.tokensAvailable() == 100_000;
    }), () -> "not freed within 1 s: " + view("dis"));
    long ms = (System.nanoTime() - t0) / 1_000_000;
    assertTrue(ms <= 1_000, "freed in " + ms + " ms");
    Outcome<?> other = client.blocking().forUser("dis").acquireSessionLease(s, "someone-else", 1_000);
    assertTrue(other.isGranted(), "the session lease was released: " + other);
  }

  @Test
  void aBusySessionRefusesASecondTurnAndAStaleFenceIsRefused() {
    CompletableSubject gate = CompletableSubject.create();
    ScriptedLlm model = gated(gate);
    Runner runner = Adk.runner(Adk.agent("helper", model), plugin());
    TurnExecutor executor = TurnExecutor.builder(runner, client).sessionTtlMs(20_000).build();
    String s = Adk.session(runner, "fen", "s-fen");
    TestSubscriber<Event> first = executor.runAsync("fen", s, Adk.user("long")).subscribeOn(Schedulers.io()).test();
    assertTrue(Processes.poll(10_000, () -> model.calls.get() == 1));
    Turn turn = executor.turn(s).orElseThrow();
    assertEquals(1, turn.fence());
    TurnRejectedException busy = assertThrows(TurnRejectedException.class,
        () -> executor.runAsync("fen", s, Adk.user("again")).ignoreElements().blockingAwait(10, TimeUnit.SECONDS));
    assertEquals(409, busy.status());
    assertEquals("session_busy", busy.error());
    long ttl = busy.retryAfterMs().getAsLong();
    assertTrue(ttl > 0 && ttl <= 20_000, "remaining TTL " + ttl);
    assertInstanceOf(Refusal.SessionBusy.class, busy.refusal().orElseThrow());
    gate.onComplete();
    first.awaitDone(10, TimeUnit.SECONDS).assertComplete();
    assertTrue(Processes.poll(1_000, () -> executor.turn(s).isEmpty()));
    // The next turn takes the next fence; the first turn's is stale.
    TestSubscriber<Event> next = executor.runAsync("fen", s, Adk.user("next")).test();
    next.awaitDone(10, TimeUnit.SECONDS).assertComplete();
    Refusal.StaleFence stale = (Refusal.StaleFence) client.blocking().forUser("fen").checkFence(s, 1).refused().orElseThrow();
    assertEquals(2, stale.latestFence());
    assertTrue(Processes.poll(1_000, () -> executor.inFlight() == 0));
  }

  @Test
  void theProcessCapRefusesPastMaxInFlight() {
    CompletableSubject gate = CompletableSubject.create();
    ScriptedLlm model = gated(gate);
    Runner runner = Adk.runner(Adk.agent("helper", model), plugin());
    TurnExecutor executor = TurnExecutor.builder(runner, client).maxInFlight(1).overloadedRetryMs(250).build();
    TestSubscriber<Event> first = executor.runAsync("cap", Adk.session(runner, "cap", "cap-1"), Adk.user("long"))
        .subscribeOn(Schedulers.io()).test();
    assertTrue(Processes.poll(10_000, () -> model.calls.get() == 1));
    String s2 = Adk.session(runner, "cap", "cap-2");
    TurnRejectedException over = assertThrows(TurnRejectedException.class,
        () -> executor.runAsync("cap", s2, Adk.user("x")).ignoreElements().blockingAwait(5, TimeUnit.SECONDS));
    assertEquals(429, over.status());
    assertEquals("overloaded", over.error());
    assertEquals(250, over.retryAfterMs().getAsLong());
    assertEquals(1, view("cap").leases().size(), "the rejected turn took nothing");
    gate.onComplete();
    first.awaitDone(10, TimeUnit.SECONDS).assertComplete();
    // The slot is freed in doFinally, just after the subscriber saw the end.
    assertTrue(Processes.poll(1_000, () -> executor.inFlight() == 0));
  }

  @Test
  void failClosedAndFailOpenWhenTheSidecarIsDown() {
    Sidecar gone = Sidecar.start("");
    String url = gone.url();
    gone.close();
    TollgateClient down = TollgateClient.builder(url).credentials(Tokens::token).retry(RetryPolicy.none()).build();
    Runner closed = Adk.runner(Adk.agent("helper", ScriptedLlm.answering("answered", 10)),
        TollgatePlugin.builder(down).build());
    assertEquals(Messages.UNAVAILABLE,
        Adk.text(Adk.turn(closed.runAsync("fo", Adk.session(closed, "fo", "s1"), Adk.user("q")))));
    ScriptedLlm model = ScriptedLlm.answering("answered", 10);
    TollgatePlugin open = TollgatePlugin.builder(down).failOpen(true).build();
    Runner opened = Adk.runner(Adk.agent("helper", model), open);
    assertEquals("answered",
        Adk.text(Adk.turn(opened.runAsync("fo", Adk.session(opened, "fo", "s2"), Adk.user("q")))));
    assertEquals(1, model.calls.get());
    assertEquals(0, open.openRuns(), "the unmetered run is forgotten at its end");
  }
}
