package dev.tollgate.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.ObjectMapper;
import dev.tollgate.client.testing.FaultProxy;
import dev.tollgate.client.testing.FaultProxy.Answer;
import dev.tollgate.client.testing.Sidecar;
import java.util.List;
import java.util.Map;
import java.util.OptionalLong;
import java.util.Set;
import java.util.stream.Collectors;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInstance;

/**
 * Retries through a {@link FaultProxy} in front of a real sidecar: only 503 and 429 {@code
 * overloaded} are retried, bounded, with the sidecar's hint honoured and never one above the
 * policy's maximum; a reserve whose answer was lost is retried under its request id and charged
 * once, and so is a top-up; permits, feedback and reloads are never retried.
 */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
class RetryTest {
  static final Answer UNAVAILABLE =
      new Answer(503, Map.of("retry-after", "1"),
          "{\"error\":\"store_unavailable\",\"message\":\"the store is down\",\"retry_after_ms\":50}");
  static final Answer OVERLOADED =
      new Answer(429, Map.of("retry-after", "1"),
          "{\"error\":\"overloaded\",\"message\":\"busy\",\"retry_after_ms\":30}");
  static final ObjectMapper JSON = new ObjectMapper();

  Sidecar sidecar;
  FaultProxy proxy;

  @BeforeAll
  void up() {
    sidecar = Sidecar.start("");
  }

  @AfterAll
  void down() {
    sidecar.close();
  }

  @BeforeEach
  void proxy() {
    proxy = FaultProxy.to(sidecar.url());
  }

  @AfterEach
  void closeProxy() {
    proxy.close();
  }

  TollgateClient client(RetryPolicy retry) {
    return Sidecar.client(proxy.url(), retry);
  }

  static String field(String body, String name) {
    try {
      return JSON.readTree(body).get(name).asText();
    } catch (Exception e) {
      throw new AssertionError(body, e);
    }
  }

  @Test
  void aReserveWhoseAnswerWasLostIsChargedOnce() {
    TollgateClient c = client(Sidecar.fastRetries(2));
    UserClient.Blocking gil = c.blocking().forUser("gil");
    ClientContract.granted(gil.admitRun("r"));
    // The sidecar grants the first attempt, but the client sees a 503; the
    // retry carries the same request id and gets the same grant.
    proxy.thenLoseAnswer(UNAVAILABLE);
    long t0 = System.nanoTime();
    Reservation r = ClientContract.granted(gil.reserve("r", 5_000));
    long tookMs = (System.nanoTime() - t0) / 1_000_000;
    assertEquals("1.r", r.reservationId());
    List<FaultProxy.Seen> sent = proxy.seen("/v1/tokens/reserve");
    assertEquals(2, sent.size());
    Set<String> ids = sent.stream().map(s -> field(s.body(), "request_id")).collect(Collectors.toSet());
    assertEquals(Set.of(r.requestId()), ids, "every attempt carries the first request id");
    assertTrue(tookMs >= 50, "the sidecar's hint (50 ms) was waited out: " + tookMs);
    UserView v = c.blocking().admin().user("gil");
    assertEquals(100_000 - 5_000, v.tokensAvailable(), "charged once");
    assertTrue(ClientContract.near(v.tokensLastMinute(), 5_000), v.toString());
    // A reserve repeated by the caller with the request id answers the first grant.
    Reservation again = ClientContract.granted(gil.reserve(Reserve.of("r", 5_000).withRequestId(r.requestId())));
    assertEquals(r.reservationId(), again.reservationId());
    assertEquals(100_000 - 5_000, c.blocking().admin().user("gil").tokensAvailable());
  }

  @Test
  void aTopUpWhoseAnswerWasLostGrantsOnce() {
    TollgateClient c = client(Sidecar.fastRetries(2));
    AdminClient.Blocking admin = c.blocking().admin();
    // The sidecar grants the first attempt, the client sees a 503 and
    // retries with the same request id: one grant.
    proxy.thenLoseAnswer(UNAVAILABLE);
    List<BudgetView> after = admin.topUpTokens("spender", "daily", 500);
    assertEquals(500, after.get(0).granted());
    List<FaultProxy.Seen> sent = proxy.seen("/admin/users/spender/budgets/daily/top_up");
    assertEquals(2, sent.size());
    Set<String> ids = sent.stream().map(s -> field(s.body(), "request_id")).collect(Collectors.toSet());
    assertEquals(1, ids.size(), "every attempt carries the first request id: " + ids);
    // Repeated by the caller with its id: still one grant; a new id grants again.
    String id = ids.iterator().next();
    assertEquals(500, admin.topUpTokens("spender", "daily", 500, id).get(0).granted());
    assertEquals(1_000, admin.topUpTokens("spender", "daily", 500).get(0).granted());
    BudgetView month = admin.topUpCost("spender", "monthly", "2.50", "month-1").get(1);
    assertEquals(month, admin.topUpCost("spender", "monthly", "2.50", "month-1").get(1));
    assertEquals(2_500_000L, month.granted());
  }

  @Test
  void overloadedThenUnavailableThenAnswered() {
    TollgateClient c = client(Sidecar.fastRetries(2));
    proxy.thenRespond(OVERLOADED).thenRespond(UNAVAILABLE);
    Admitted a = ClientContract.granted(c.blocking().forUser("hal").admitRun("r"));
    assertEquals(1_000, a.estimateTokens());
    assertEquals(3, proxy.seen("/v1/runs").size());
  }

  @Test
  void retriesAreBoundedAndRaiseTheFault() {
    TollgateClient c = client(Sidecar.fastRetries(2));
    proxy.thenRespond(UNAVAILABLE).thenRespond(UNAVAILABLE).thenRespond(UNAVAILABLE);
    TollgateException.StoreUnavailable e = assertThrows(TollgateException.StoreUnavailable.class,
        () -> c.blocking().forUser("ida").admitRun("r"));
    assertEquals("admit_run", e.operation());
    assertEquals("store_unavailable", e.error());
    assertEquals(OptionalLong.of(50), e.retryAfterMs());
    assertEquals(3, proxy.seen("/v1/runs").size(), "the first attempt and two retries");
    // Overloaded past the retries is its own fault.
    proxy.thenRespond(OVERLOADED).thenRespond(OVERLOADED).thenRespond(OVERLOADED);
    TollgateException.Overloaded o = assertThrows(TollgateException.Overloaded.class,
        () -> c.blocking().forUser("ida").admitRun("r"));
    assertEquals(429, o.status().getAsInt());
    assertEquals(6, proxy.seen("/v1/runs").size());
    // RetryPolicy.none(): the first 503 is raised.
    proxy.thenRespond(UNAVAILABLE);
    assertThrows(TollgateException.StoreUnavailable.class,
        () -> client(RetryPolicy.none()).blocking().forUser("ida").admitRun("r"));
    assertEquals(7, proxy.seen("/v1/runs").size());
  }

  @Test
  void aHintAboveTheMaximumIsNotWaitedOut() {
    TollgateClient c = client(Sidecar.fastRetries(2));
    proxy.thenRespond(new Answer(503, Map.of("retry-after", "60"),
        "{\"error\":\"store_full\",\"message\":\"full\",\"retry_after_ms\":60000}"));
    long t0 = System.nanoTime();
    TollgateException.StoreUnavailable e = assertThrows(TollgateException.StoreUnavailable.class,
        () -> c.blocking().forUser("jo").settle("1.r", 5));
    assertTrue((System.nanoTime() - t0) / 1_000_000 < 1_000, "not waited out");
    assertEquals("store_full", e.error());
    assertEquals(1, proxy.seen("/v1/tokens/settle").size());
  }

  @Test
  void refusalsAreNotRetried() {
    TollgateClient c = client(Sidecar.fastRetries(2));
    proxy.thenRespond(new Answer(429, Map.of("retry-after", "2"),
        "{\"error\":\"turn_rate\",\"limit\":\"turn_rate\",\"retry_after_ms\":2000,\"message\":\"m\"}"));
    Refusal.TurnRateLimited t = ClientContract.refused(c.blocking().forUser("kim").admitRun("r"), Refusal.TurnRateLimited.class);
    assertEquals(OptionalLong.of(2_000), t.retryAfterMs());
    assertEquals(1, proxy.seen("/v1/runs").size());
  }

  @Test
  void permitsFeedbackAndReloadsAreNeverRetried() {
    TollgateClient c = client(Sidecar.fastRetries(2));
    proxy.thenRespond(UNAVAILABLE);
    assertThrows(TollgateException.StoreUnavailable.class,
        () -> c.blocking().forUser("lu").providerPermit("gemini", Permit.of("flash", 1)));
    assertEquals(1, proxy.seen("/v1/providers/gemini/permits").size());
    proxy.thenRespond(UNAVAILABLE);
    assertThrows(TollgateException.StoreUnavailable.class,
        () -> c.blocking().forUser("lu").providerFeedback("gemini", "flash", 200, Map.of(), null));
    assertEquals(1, proxy.seen("/v1/providers/gemini/feedback").size());
    proxy.thenRespond(UNAVAILABLE);
    assertThrows(TollgateException.StoreUnavailable.class, () -> c.blocking().admin().reload());
    assertEquals(1, proxy.seen("/admin/reload").size());
    // A readiness 503 is the answer, not retried either.
    proxy.thenRespond(UNAVAILABLE);
    assertThrows(TollgateException.StoreUnavailable.class, () -> c.blocking().readyz());
    assertEquals(1, proxy.seen("/readyz").size());
  }

  @Test
  void pendingClosesAreDone() {
    TollgateClient c = client(Sidecar.fastRetries(2));
    proxy.thenRespond(UNAVAILABLE).thenRespond(new Answer(200, Map.of(), "{\"pending\":true}"));
    Closed s = ClientContract.granted(c.blocking().forUser("mo").settle("1.r", 10));
    assertEquals(new Closed(OptionalLong.empty(), true), s);
    assertTrue(s.done());
    proxy.thenRespond(new Answer(200, Map.of(), "{\"released\":false,\"pending\":true}"));
    Released rel = c.blocking().forUser("mo").releaseRun("r");
    assertTrue(rel.pending() && rel.done());
  }

  @Test
  void anAnswerTheClientCannotReadIsAServerError() {
    TollgateClient c = client(Sidecar.fastRetries(2));
    proxy.thenRespond(new Answer(200, Map.of(), "{\"reservation_id\":5}"));
    TollgateException.ServerError e = assertThrows(TollgateException.ServerError.class,
        () -> c.blocking().forUser("ned").reserve("r", 1));
    assertEquals("bad_answer", e.error());
    proxy.thenRespond(new Answer(502, Map.of(), "<html>bad gateway</html>"));
    TollgateException.ServerError g = assertThrows(TollgateException.ServerError.class,
        () -> c.blocking().forUser("ned").admitRun("r"));
    assertEquals("http_502", g.error());
  }
}
