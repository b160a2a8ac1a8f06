package dev.tollgate.adk;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.adk.events.Event;
import com.google.adk.runner.Runner;
import com.google.genai.errors.ClientException;
import dev.tollgate.client.Outcome;
import dev.tollgate.client.ProviderPermit;
import dev.tollgate.client.ProviderView;
import dev.tollgate.client.Refusal;
import dev.tollgate.client.TollgateClient;
import dev.tollgate.client.testing.Sidecar;
import dev.tollgate.client.testing.Tokens;
import io.reactivex.rxjava3.core.Flowable;
import io.reactivex.rxjava3.subscribers.TestSubscriber;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInstance;

/**
 * {@link QuotaGatedLlm} and {@link ProviderGate} on real ADK turns against a real sidecar: a
 * provider 429 from the model cools the key down for every replica, Gemini's RetryInfo included;
 * a refused permit ends the turn with the plugin's plain message and a refund.
 */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
class ProviderGateTest {
  Sidecar sidecar;
  TollgateClient client;
  TollgateClient privileged;

  @BeforeAll
  void up() {
    sidecar = Sidecar.start("");
    client = sidecar.client();
    privileged = TollgateClient.builder(sidecar.url())
        .credentials(user -> Tokens.token(user, Tokens.FEEDBACK_SCOPE))
        .build();
  }

  @AfterAll
  void down() {
    sidecar.close();
  }

  ProviderGate gate(String provider, String model) {
    return ProviderGate.builder(client, provider, model).caller("agent-service").feedback(privileged, "agent-service").build();
  }

  @Test
  void aProvider429CoolsTheKeyDownForTheFleet() {
    ScriptedLlm provider = new ScriptedLlm((req, n) ->
        Flowable.error(new ProviderHttpException(429, Map.of("retry-after", "30"), "{\"error\":\"rate limited\"}")));
    Runner runner = Adk.runner(Adk.agent("helper", QuotaGatedLlm.wrap(provider, gate("gemini", "cool"))),
        TollgatePlugin.builder(client).build());
    TestSubscriber<Event> run = runner.runAsync("pg1", Adk.session(runner, "pg1", "s"), Adk.user("q")).test();
    run.awaitDone(10, TimeUnit.SECONDS).assertError(ProviderHttpException.class);
    assertEquals(1, provider.calls.get(), "the permit let the call through");
    // The reservation was refunded and the run released.
    assertEquals(100_000, client.blocking().admin().user("pg1").tokensAvailable());
    // Another replica's gate (another client) now waits the cooldown out: refused, policy reject.
    TollgateClient other = sidecar.client();
    Outcome<ProviderPermit> next = ProviderGate.builder(other, "gemini", "cool").build().permit(10).blockingGet();
    Refusal.ProviderLimited cooling = assertInstanceOf(Refusal.ProviderLimited.class, next.refused().orElseThrow());
    assertEquals("provider_cooldown", cooling.error());
    long hint = cooling.retryAfterMs().getAsLong();
    assertTrue(hint > 20_000 && hint <= 30_000, "hint " + hint);
    ProviderView view = client.blocking().admin().provider("gemini", "cool");
    assertTrue(view.cooldownUntilMs().isPresent());
    assertEquals(500, view.effectivePermille(), "a 429 halves the rate");
  }

  @Test
  void geminisRetryDelayIsReadFromItsError() {
    ScriptedLlm gemini = new ScriptedLlm((req, n) -> Flowable.error(new ClientException(429, "RESOURCE_EXHAUSTED",
        "You exceeded your current quota.\nDetails: {\"@type\":\"type.googleapis.com/google.rpc.RetryInfo\",\"retryDelay\":\"20s\"}")));
    Runner runner = Adk.runner(Adk.agent("helper", QuotaGatedLlm.wrap(gemini, gate("gemini", "flash"))),
        TollgatePlugin.builder(client).build());
    runner.runAsync("pg2", Adk.session(runner, "pg2", "s"), Adk.user("q")).test()
        .awaitDone(10, TimeUnit.SECONDS).assertError(ClientException.class);
    ProviderView view = client.blocking().admin().provider("gemini", "flash");
    long left = view.cooldownRemainingMs();
    assertTrue(left > 10_000 && left <= 20_000, "cooldown from retryDelay 20s: " + view);
  }

  @Test
  void aRefusedPermitEndsTheTurnWithThePlainMessageAndARefund() {
    ProviderGate pro = gate("gemini", "pro");
    // gemini:pro bursts to 2 and refills one an hour.
    assertTrue(pro.permit(1).blockingGet().isGranted());
    assertTrue(pro.permit(1).blockingGet().isGranted());
    ScriptedLlm model = ScriptedLlm.answering("never", 10);
    Runner runner = Adk.runner(Adk.agent("helper", QuotaGatedLlm.wrap(model, pro)), TollgatePlugin.builder(client).build());
    String text = Adk.text(Adk.turn(runner.runAsync("pg3", Adk.session(runner, "pg3", "s"), Adk.user("q"))));
    assertTrue(text.startsWith("The work stopped early: the model provider's shared capacity is in use (limit: "), text);
    assertEquals(0, model.calls.get(), "the provider was not called");
    assertEquals(100_000, client.blocking().admin().user("pg3").tokensAvailable(), "the reservation refunded");
    assertEquals(java.util.List.of(), client.blocking().admin().user("pg3").leases());
  }
}
