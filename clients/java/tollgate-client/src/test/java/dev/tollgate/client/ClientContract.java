package dev.tollgate.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.tollgate.client.testing.Processes;
import dev.tollgate.client.testing.Sidecar;
import dev.tollgate.client.testing.SidecarClass;
import dev.tollgate.client.testing.Tokens;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.OptionalDouble;
import java.util.OptionalInt;
import java.util.OptionalLong;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;

/**
 * Every operation of docs/spec.md §8 and every refusal and fault it can answer, through {@link
 * TollgateClient} against one real sidecar per store (the subclasses), decoded from the real wire.
 * Each test uses users of its own, so the tests share the sidecar. The plans refill one token or
 * turn an hour ({@link Sidecar#PLANS}): counts are exact in real time.
 */
abstract class ClientContract extends SidecarClass {
  /** At most one wait=true request of a user at once, for {@link #tooManyWaits()}. */
  static final String LIMITS = "[limits]\nmax_waits_per_user = 1\n";

  /** Within 2 % below {@code expected}: the sliding-minute estimate across a minute's turn. */
  static boolean near(long v, long expected) {
    return v <= expected && v >= expected - Math.max(1, expected / 50);
  }

  static <T> T granted(Outcome<T> o) {
    return o.orElseThrow(r -> new AssertionError("refused: " + r));
  }

  static <R extends Refusal> R refused(Outcome<?> o, Class<R> type) {
    Refusal r = o.refused().orElseThrow(() -> new AssertionError("granted: " + o));
    return assertInstanceOf(type, r, () -> "refused otherwise: " + r);
  }

  @Test
  void everyOperationSucceedsBlocking() {
    TollgateClient.Blocking tg = client.blocking();
    UserClient.Blocking ann = tg.forUser("ann");
    AdminClient.Blocking admin = tg.admin();
    assertTrue(tg.healthz());
    assertTrue(tg.readyz());

    // A turn with its session: the plan's numbers come with it.
    long before = System.currentTimeMillis();
    Admitted a = granted(ann.admitRun("run-1", "conv", 10_000));
    assertEquals(List.of(120_000L, 1_000L, 2_000L, 500L),
        List.of(a.leaseTtlMs(), a.estimateTokens(), a.maxWaitMs(), a.maxLlmCalls()));
    assertTrue(a.leaseExpiresAtMs() >= before + 120_000 && a.leaseExpiresAtMs() <= System.currentTimeMillis() + 120_000);
    SessionLease s = a.session().orElseThrow();
    assertEquals(1, s.fence());
    assertTrue(granted(ann.renewRun("run-1")).leaseExpiresAtMs() >= a.leaseExpiresAtMs());

    // Tokens: reserve, settle (a repeat changes nothing), reserve and refund.
    Reservation r = granted(ann.reserve("run-1", a.estimateTokens()));
    assertEquals("1.run-1", r.reservationId());
    assertEquals(0, r.waitMs());
    Closed c = granted(ann.settle(r.reservationId(), 812));
    assertEquals(new Closed(OptionalLong.of(100_000 - 812), false), c);
    assertTrue(c.done());
    assertEquals(c, granted(ann.settle(r.reservationId(), 5_000)));
    Reservation r2 = granted(ann.reserve(Reserve.of("run-1", 300).withRequestId("ann-req-2")));
    assertEquals("ann-req-2", r2.requestId());
    assertEquals(OptionalLong.of(100_000 - 812), granted(ann.refund(r2.reservationId())).balance());
    assertEquals(OptionalLong.of(100_000 - 812), granted(ann.refund(r2.reservationId())).balance());

    // The run released with its session, then again (held nothing).
    assertEquals(new Released(true, false), ann.releaseRun("run-1", "conv"));
    assertEquals(new Released(false, false), ann.releaseRun("run-1"));

    // Session leases and fences.
    SessionLease l1 = granted(ann.acquireSessionLease("s", "h1", 5_000));
    assertEquals(1, l1.fence());
    assertEquals(1, granted(ann.renewSessionLease("s", "h1", 5_000)).fence());
    assertEquals(new FenceCurrent(true), granted(ann.checkFence("s", 1)));
    assertEquals(new Released(true, false), granted(ann.releaseSessionLease("s", "h1")));
    assertEquals(2, granted(ann.acquireSessionLease("s", "h2", 5_000)).fence());

    // A provider permit, and feedback with the service's scoped credential.
    ProviderPermit p = granted(ann.providerPermit("gemini", Permit.of("flash", 100)));
    assertEquals(new ProviderPermit(0, 1000), p);
    UserClient.Blocking svc = gateway().blocking().forUser("svc");
    Feedback ok = svc.providerFeedback("gemini", "flash", 200, Map.of(), null);
    assertEquals("success", ok.classification());
    assertFalse(ok.retryable());
    Feedback throttled = svc.providerFeedback("gemini", "flash", 429, Map.of("retry-after", "2"), "slow down");
    assertEquals("throttled", throttled.classification());
    assertTrue(throttled.retryable());
    assertEquals(OptionalLong.of(2_000), throttled.retryAfterMs());
    assertTrue(throttled.cooldownUntilMs().isPresent());

    // Admin routes.
    ProviderView view = admin.provider("gemini", "flash");
    assertEquals(throttled.cooldownUntilMs(), view.cooldownUntilMs());
    assertEquals(Optional.empty(), view.exhausted());
    assertTrue(admin.providers().stream().anyMatch(v -> v.provider().equals("gemini") && v.model().equals("flash")));
    assertEquals(List.of(), view.tenants());
    // A key shared fairly: each tenant's weight and place, in the view.
    granted(ann.providerPermit("gemini", Permit.of("fair", 1).withTenant("a")));
    granted(ann.providerPermit("gemini", Permit.of("fair", 1).withTenant("b")));
    List<ProviderTenant> tenants = admin.provider("gemini", "fair").tenants();
    assertEquals(List.of("a", "b"), tenants.stream().map(ProviderTenant::name).toList());
    assertEquals(OptionalInt.of(3), tenants.get(0).weight());
    assertEquals(OptionalDouble.empty(), tenants.get(0).share());
    assertTrue(tenants.get(0).active() && tenants.get(1).active());
    assertTrue(tenants.get(1).bookedAheadMs() > 0, tenants.toString());
    assertEquals(OptionalDouble.of(0.5), tenants.get(0).recentShare());
    ProviderCleared cleared = admin.clearProvider("gemini", "flash");
    assertEquals(throttled.cooldownUntilMs(), cleared.cooldownUntilMs());
    assertEquals(OptionalLong.empty(), admin.provider("gemini", "flash").cooldownUntilMs());
    UserView u = admin.user("ann");
    assertEquals("std", u.plan());
    assertEquals(100_000 - 812, u.tokensAvailable());
    // A sliding-minute estimate: what was charged just before a minute's turn counts a little less.
    assertTrue(near(u.tokensLastMinute(), 812), u.toString());
    assertEquals(49, u.turnsAvailable());
    assertEquals(List.of(), u.leases());
    assertEquals(List.of(), u.budgets());
    assertTrue(admin.top(1000).stream().anyMatch(t -> t.user().equals("ann") && near(t.tokensLastMinute(), 812)),
        () -> admin.top(1000).toString());
    granted(ann.admitRun("run-2"));
    assertEquals(List.of("run-2"), admin.user("ann").leases().stream().map(LeaseView::invocationId).toList());
    assertEquals(new Released(true, false), admin.releaseLease("ann", "run-2"));
    assertEquals(new Released(false, false), admin.releaseLease("ann", "run-2"));
    assertTrue(admin.resetUser("ann"));
    assertEquals(100_000, admin.user("ann").tokensAvailable());
    Reloaded reloaded = admin.reload();
    assertTrue(reloaded.reloaded());
    assertEquals(List.of(), reloaded.needsRestart());
  }

  /** The service's client: its own token carries the feedback scope. */
  TollgateClient gateway() {
    return TollgateClient.builder(sidecar.url())
        .credentials(user -> Tokens.token(user, Tokens.FEEDBACK_SCOPE))
        .build();
  }

  @Test
  void everyOperationComposesAsynchronously() {
    UserClient bo = client.forUser("bo");
    // One chain of futures, no thread waits until the end.
    CompletableFuture<List<Object>> chain =
        bo.admitRun("run-a", "conv-a", 5_000)
            .thenCompose(a -> bo.reserve(Reserve.of("run-a", granted(a).estimateTokens())
                .waiting(granted(a).maxWaitMs()).withModel("openai:gpt-4o")
                .withSplit(TokenSplit.of(900, 100))))
            .thenCompose(r -> bo.settle(granted(r).reservationId(), 700, TokenSplit.of(600, 90, 10)))
            .thenCompose(c -> bo.renewRun("run-a").thenApply(n -> List.<Object>of(c, n)))
            .thenCompose(l -> bo.acquireSessionLease("conv-a", "other", 1_000)
                .thenApply(busy -> List.<Object>of(l.get(0), l.get(1), busy)))
            .thenCompose(l -> bo.releaseRun("run-a", "conv-a").thenApply(rel -> List.<Object>of(l.get(0), l.get(1), l.get(2), rel)));
    List<Object> out = chain.join();
    assertEquals(new Outcome.Granted<>(new Closed(OptionalLong.of(100_000 - 700), false)), out.get(0));
    assertTrue(((Outcome<?>) out.get(1)).isGranted());
    Refusal.SessionBusy busy = refused((Outcome<?>) out.get(2), Refusal.SessionBusy.class);
    assertTrue(busy.retryAfterMs().getAsLong() > 0 && busy.retryAfterMs().getAsLong() <= 5_000);
    assertEquals(new Released(true, false), out.get(3));
    // After the release the session is free: the next holder's fence is 2, the old one stale.
    assertEquals(2, granted(bo.acquireSessionLease("conv-a", "other", 1_000).join()).fence());
    Refusal.StaleFence stale = refused(bo.checkFence("conv-a", 1).join(), Refusal.StaleFence.class);
    assertEquals(2, stale.latestFence());
    assertEquals(new FenceCurrent(true), granted(bo.checkFence("conv-a", 2).join()));
    // The admin view over the async admin client.
    assertEquals(100_000 - 700, client.admin().user("bo").join().tokensAvailable());
    assertTrue(client.healthz().join());
  }

  @Test
  void turnRateRefusalCarriesItsHint() {
    UserClient.Blocking five = client.blocking().forUser("five");
    for (int i = 0; i < 5; i++) {
      granted(five.admitRun("t" + i));
      five.releaseRun("t" + i);
    }
    Refusal.TurnRateLimited d = refused(five.admitRun("t6"), Refusal.TurnRateLimited.class);
    assertEquals("turn_rate", d.error());
    assertEquals(Optional.of("turn_rate"), d.limit());
    // One turn an hour: the next fits in an hour less the test's own time.
    long hint = d.retryAfterMs().getAsLong();
    assertTrue(hint > 3_500_000 && hint <= 3_600_000, () -> "hint " + hint);
    assertTrue(d.retryable());
    assertTrue(d.message().contains("turn"), d.message());
  }

  @Test
  void concurrencyAndSessionRefusals() {
    UserClient.Blocking cy = client.blocking().forUser("cy");
    granted(cy.admitRun("a"));
    granted(cy.admitRun("b"));
    Refusal.ConcurrencyLimited c = refused(cy.admitRun("c"), Refusal.ConcurrencyLimited.class);
    assertTrue(c.retryAfterMs().isPresent());
    assertEquals(Optional.of("concurrency"), c.limit());
    // Nothing charged to the turn bucket by the refusal: 2 turns taken.
    assertEquals(48, client.blocking().admin().user("cy").turnsAvailable());
    // max_sessions = 3: a fourth session is refused, the three held renew.
    for (int i = 0; i < 3; i++) {
      granted(cy.acquireSessionLease("sess-" + i, "h", 60_000));
    }
    Refusal.SessionsLimited s = refused(cy.acquireSessionLease("sess-3", "h", 60_000), Refusal.SessionsLimited.class);
    assertTrue(s.retryAfterMs().isPresent());
    granted(cy.renewSessionLease("sess-0", "h", 60_000));
    refused(cy.acquireSessionLease("sess-0", "other", 60_000), Refusal.SessionBusy.class);
    refused(cy.renewSessionLease("sess-0", "other", 60_000), Refusal.NotHolder.class);
    refused(cy.releaseSessionLease("sess-0", "other"), Refusal.NotHolder.class);
    Refusal.LeaseLost lost = refused(cy.renewRun("never"), Refusal.LeaseLost.class);
    assertFalse(lost.retryable());
  }

  @Test
  void tokenRefusals() {
    UserClient.Blocking di = client.blocking().forUser("di");
    granted(di.admitRun("r"));
    // More than the bucket holds: never fits.
    Refusal.ExceedsCapacity e = refused(di.reserve("r", 200_000), Refusal.ExceedsCapacity.class);
    assertEquals(Optional.of("token_rate"), e.limit());
    assertFalse(e.retryable());
    // Empty the bucket: the next call waits past max_wait_ms and is refused, taking nothing.
    granted(di.reserve("r", 100_000));
    Refusal.TokenRateLimited t = refused(di.reserve("r", 1_000), Refusal.TokenRateLimited.class);
    assertEquals(Optional.of("token_rate"), t.limit());
    assertTrue(t.retryAfterMs().getAsLong() > 1_000_000_000L, t.toString());
    assertEquals(0, client.blocking().admin().user("di").tokensAvailable());
    Refusal.UnknownReservation u = refused(di.settle("9.nope", 5), Refusal.UnknownReservation.class);
    assertEquals("unknown_reservation", u.error());
    refused(di.refund("9.nope"), Refusal.UnknownReservation.class);
    // max_llm_calls = 1: the second reservation of the run is refused, not retryable.
    UserClient.Blocking one = client.blocking().forUser("onecall");
    granted(one.admitRun("r"));
    granted(one.reserve("r", 10));
    Refusal.MaxLlmCalls m = refused(one.reserve("r", 10), Refusal.MaxLlmCalls.class);
    assertFalse(m.retryable());
  }

  @Test
  void aSpentBudgetIsARefusal() {
    UserClient.Blocking sp = client.blocking().forUser("spender");
    AdminClient.Blocking admin = client.blocking().admin();
    granted(sp.admitRun("r"));
    granted(sp.reserve(Reserve.of("r", 600).withModel("openai:gpt-4o")));
    Refusal.BudgetExhausted b = refused(sp.reserve(Reserve.of("r", 600).withModel("openai:gpt-4o")), Refusal.BudgetExhausted.class);
    assertEquals(Optional.of("budget_daily"), b.limit());
    long resets = b.resetsAtMs().getAsLong();
    assertTrue(resets > System.currentTimeMillis(), b.toString());
    assertTrue(b.retryAfterMs().getAsLong() > 0 && b.retryAfterMs().getAsLong() <= 86_400_000L);
    assertTrue(b.message().contains("daily budget"), b.message());
    List<BudgetView> budgets = admin.user("spender").budgets();
    BudgetView day = budgets.get(0);
    assertEquals(new BudgetView("daily", "tokens", Optional.empty(), 1000, 0, 600, day.resetsAtMs()), day);
    // The sidecar answers resets_at_ms as its clock read after the decision plus
    // the store's hint, so it can miss the window's end by the milliseconds
    // between the two reads (seen: +1 ms on memory, -1 ms on Redis).
    assertTrue(Math.abs(resets - day.resetsAtMs()) <= 1_000, resets + " vs " + day);
    // 600 tokens at the higher price, $10 per million: 6,000 micro-dollars.
    assertEquals(new BudgetView("monthly", "micros", Optional.of("USD"), 50_000_000, 0, 6_000, budgets.get(1).resetsAtMs()), budgets.get(1));
    List<BudgetView> topped = admin.topUpTokens("spender", "daily", 500);
    assertEquals(500, topped.get(0).granted());
    granted(sp.reserve(Reserve.of("r", 500).withModel("openai:gpt-4o")));
    TollgateException.InvalidRequest wrongUnit = assertThrows(TollgateException.InvalidRequest.class, () -> admin.topUpCost("spender", "daily", "1.00"));
    assertEquals(Optional.of("tokens"), wrongUnit.field());
    TollgateException.InvalidRequest noWeekly = assertThrows(TollgateException.InvalidRequest.class, () -> admin.resetBudget("spender", "weekly"));
    assertEquals(Optional.of("window"), noWeekly.field());
    List<BudgetView> reset = admin.resetBudget("spender", "daily");
    assertEquals(List.of(0L, 0L), List.of(reset.get(0).spent(), reset.get(0).granted()));
    assertEquals(11_000, reset.get(1).spent(), "the month is untouched");
    BudgetView month = admin.topUpCost("spender", "monthly", "2.50").get(1);
    assertEquals(List.of(50_000_000L, 2_500_000L), List.of(month.limit(), month.granted()));
  }

  @Test
  void tooManyWaits() throws Exception {
    // waiter2 refills 1,000 tokens a second: empty its bucket, then a
    // wait=true reserve of 3,000 waits about 3 s on the sidecar.
    UserClient w = client.forUser("waiter2");
    granted(w.admitRun("r").join());
    granted(w.reserve("r", 1_000).join());
    CompletableFuture<Outcome<Reservation>> waiting = w.reserve(Reserve.of("r", 3_000).waiting(5_000));
    // Charged as soon as it is granted, before its wait: then it is waiting.
    assertTrue(Processes.poll(10_000, () -> client.admin().user("waiter2").join().tokensAvailable() < -1_000));
    Refusal.TooManyWaits t = refused(w.reserve(Reserve.of("r", 1).waiting(5_000)).join(), Refusal.TooManyWaits.class);
    assertEquals(OptionalLong.of(1_000), t.retryAfterMs());
    // A decide-only reserve is never refused by it: granted with the wait to sleep.
    assertTrue(granted(w.reserve("r", 1).join()).waitMs() > 0);
    Reservation done = granted(waiting.join());
    assertEquals(0, done.waitMs(), "the sidecar waited before answering");
  }

  @Test
  void providerRefusals() {
    UserClient.Blocking ed = client.blocking().forUser("ed");
    // gemini:pro bursts to 2 and refills one an hour: the third is refused.
    granted(ed.providerPermit("gemini", Permit.of("pro", 10)));
    granted(ed.providerPermit("gemini", Permit.of("pro", 10)));
    Refusal.ProviderLimited rate = refused(ed.providerPermit("gemini", Permit.of("pro", 10)), Refusal.ProviderLimited.class);
    assertEquals("provider_rate", rate.error());
    assertTrue(rate.retryAfterMs().isPresent());
    // A provider 429 with a hint pauses gemini:cool fleet-wide.
    UserClient.Blocking svc = gateway().blocking().forUser("svc");
    svc.providerFeedback("gemini", "cool", 429, Map.of("retry-after", "30"), null);
    Refusal.ProviderLimited cool = refused(ed.providerPermit("gemini", Permit.of("cool", 10)), Refusal.ProviderLimited.class);
    assertEquals("provider_cooldown", cool.error());
    long hint = cool.retryAfterMs().getAsLong();
    assertTrue(hint > 20_000 && hint <= 30_000, () -> "hint " + hint);
    // OpenAI's insufficient_quota: this replica fails fast.
    Feedback ex = svc.providerFeedback("openai", "gpt-4o", 429, Map.of(),
        "{\"error\":{\"message\":\"You exceeded your current quota\",\"type\":\"insufficient_quota\",\"code\":\"insufficient_quota\"}}");
    assertEquals("exhausted", ex.classification());
    assertTrue(ex.reason().isPresent());
    Refusal.ProviderExhausted pe = refused(ed.providerPermit("openai", Permit.of("gpt-4o", 10)), Refusal.ProviderExhausted.class);
    assertTrue(pe.retryAfterMs().getAsLong() > 0 && pe.retryAfterMs().getAsLong() <= 60_000);
    assertTrue(client.blocking().admin().provider("openai", "gpt-4o").exhausted().isPresent());
    ProviderCleared cleared = client.blocking().admin().clearProvider("openai", "gpt-4o");
    assertTrue(cleared.exhausted().isPresent());
    granted(ed.providerPermit("openai", Permit.of("gpt-4o", 10).withTenant("t1").withSplit(8, 2).withMaxWaitMs(1_000)));
    // The permit of a key not configured is a fault.
    TollgateException.NotFound nf = assertThrows(TollgateException.NotFound.class, () -> ed.providerPermit("nobody", Permit.of("m", 1)));
    assertEquals("unknown_provider", nf.error());
    assertEquals("provider_permit", nf.operation());
  }

  @Test
  void faultsAreExceptionsWithTheirOperationCodeStatusAndField() {
    UserClient.Blocking fay = client.blocking().forUser("fay");
    TollgateException.InvalidRequest zero = assertThrows(TollgateException.InvalidRequest.class, () -> fay.reserve("r", 0));
    assertEquals("reserve", zero.operation());
    assertEquals("invalid_request", zero.error());
    assertEquals(400, zero.status().getAsInt());
    assertEquals(Optional.of("estimate"), zero.field());
    TollgateException.InvalidRequest badId = assertThrows(TollgateException.InvalidRequest.class, () -> fay.admitRun("bad\u0001id"));
    assertEquals(Optional.of("invocation_id"), badId.field());
    TollgateException.InvalidRequest badPath = assertThrows(TollgateException.InvalidRequest.class, () -> fay.renewRun("bad\u0001id"));
    assertEquals("renew_run", badPath.operation());
    TollgateException.InvalidRequest ttl = assertThrows(TollgateException.InvalidRequest.class, () -> fay.acquireSessionLease("s", "h", 0));
    assertEquals(Optional.of("ttl_ms"), ttl.field());
    // Ids with a slash, a space, non-ASCII and dots travel as path segments.
    // (A user each: a session's claim outlives its release, and the plan holds 3.)
    List<String> ids = List.of("a/b", "a b", "café", "..", "a?b#c");
    for (int i = 0; i < ids.size(); i++) {
      UserClient.Blocking u = client.blocking().forUser("fay" + i);
      String id = ids.get(i);
      granted(u.acquireSessionLease(id, "h", 1_000));
      assertEquals(new FenceCurrent(true), granted(u.checkFence(id, 1)));
      assertEquals(new Released(true, false), granted(u.releaseSessionLease(id, "h")));
    }
    // A wrong token: 401 from the sidecar.
    TollgateClient forged = TollgateClient.builder(sidecar.url()).token(() -> "not-a-jwt").build();
    TollgateException.Unauthorized u = assertThrows(TollgateException.Unauthorized.class, () -> forged.blocking().forUser("x").admitRun("r"));
    assertEquals("unauthorized", u.error());
    assertEquals(401, u.status().getAsInt());
    // Feedback without the scope: 403.
    TollgateException.Forbidden f = assertThrows(TollgateException.Forbidden.class,
        () -> fay.providerFeedback("gemini", "flash", 429, Map.of(), null));
    assertEquals("provider_feedback", f.operation());
    // Admin with a wrong admin token: 401; unknown provider view: 404.
    TollgateClient wrongAdmin = TollgateClient.builder(sidecar.url()).adminToken("nope").build();
    assertThrows(TollgateException.Unauthorized.class, () -> wrongAdmin.blocking().admin().user("fay"));
    TollgateException.NotFound nf = assertThrows(TollgateException.NotFound.class, () -> client.blocking().admin().provider("no", "such"));
    assertEquals("unknown_provider", nf.error());
    // The async form fails its future with the same exception.
    CompletionException ce = assertThrows(CompletionException.class, () -> client.forUser("fay").reserve("r", 0).join());
    assertInstanceOf(TollgateException.InvalidRequest.class, ce.getCause());
  }

  @Test
  void credentialsThatFailSendNothing() {
    AtomicInteger asked = new AtomicInteger();
    TollgateClient broken = TollgateClient.builder(sidecar.url())
        .credentials(user -> {
          asked.incrementAndGet();
          if (user.equals("nobody")) {
            return null;
          }
          throw new IllegalStateException("identity provider down");
        })
        .build();
    TollgateException.CredentialsUnavailable none = assertThrows(TollgateException.CredentialsUnavailable.class,
        () -> broken.blocking().forUser("nobody").admitRun("cred-r"));
    assertEquals("credentials", none.error());
    assertEquals("admit_run", none.operation());
    assertTrue(none.status().isEmpty());
    TollgateException.CredentialsUnavailable threw = assertThrows(TollgateException.CredentialsUnavailable.class,
        () -> broken.blocking().forUser("gus").admitRun("cred-r"));
    assertInstanceOf(IllegalStateException.class, threw.getCause());
    assertTrue(threw.getMessage().contains("identity provider down"), threw.getMessage());
    assertEquals(2, asked.get());
    // Nothing was sent: the sidecar never saw either user.
    assertEquals(List.of(), client.blocking().admin().top(1000).stream()
        .filter(t -> t.user().equals("nobody") || t.user().equals("gus")).toList());
    assertEquals(50, client.blocking().admin().user("gus").turnsAvailable());
    // No credentials configured at all.
    TollgateClient anonymous = TollgateClient.builder(sidecar.url()).build();
    assertThrows(TollgateException.CredentialsUnavailable.class, () -> anonymous.blocking().forUser("x").admitRun("r"));
  }
}
