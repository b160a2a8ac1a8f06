package dev.tollgate.client;

import static dev.tollgate.client.Wire.encode;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.OptionalLong;
import java.util.UUID;

/** Every operation of docs/spec.md §8 as a {@link Call}: what to send and how to read it. */
final class Ops {
  private Ops() {}

  private static final JsonNodeFactory JSON = JsonNodeFactory.instance;
  /** A permit with {@code wait=true} and no deadline may wait up to a minute. */
  private static final Duration PERMIT_WAIT_DEFAULT = Duration.ofSeconds(60);

  private static ObjectNode object() {
    return JSON.objectNode();
  }

  private static void split(ObjectNode body, TokenSplit split) {
    split.inputTokens().ifPresent(v -> body.put("input_tokens", v));
    split.outputTokens().ifPresent(v -> body.put("output_tokens", v));
    split.cachedInputTokens().ifPresent(v -> body.put("cached_input_tokens", v));
  }

  // Runs ----------------------------------------------------------------------

  static Call<Outcome<Admitted>> admitRun(
      String invocationId, Optional<String> sessionId, OptionalLong sessionTtlMs) {
    ObjectNode body = object().put("invocation_id", Checks.id(invocationId, "invocationId"));
    sessionId.ifPresent(s -> body.put("session_id", s));
    sessionTtlMs.ifPresent(t -> body.put("session_ttl_ms", t));
    return Call.refusable(
        "admit_run",
        "POST",
        "/v1/runs",
        Map.of(),
        body,
        b ->
            new Admitted(
                Wire.longField(b, "lease_expires_at_ms"),
                Wire.longField(b, "lease_ttl_ms"),
                Wire.longField(b, "estimate_tokens"),
                Wire.longField(b, "max_wait_ms"),
                Wire.longField(b, "max_llm_calls"),
                Wire.optObject(b, "session", Wire::sessionLease)));
  }

  static Call<Released> releaseRun(String invocationId, Optional<String> sessionId) {
    return Call.plain(
        "release_run",
        "DELETE",
        "/v1/runs/" + encode(Checks.id(invocationId, "invocationId")),
        sessionId.map(s -> Map.of("session_id", s)).orElse(Map.of()),
        null,
        false,
        Wire::released);
  }

  static Call<Outcome<Renewed>> renewRun(String invocationId) {
    return Call.refusable(
        "renew_run",
        "POST",
        "/v1/runs/" + encode(Checks.id(invocationId, "invocationId")) + "/renew",
        Map.of(),
        object(),
        b -> new Renewed(Wire.longField(b, "lease_expires_at_ms")));
  }

  // Tokens --------------------------------------------------------------------

  static Call<Outcome<Reservation>> reserve(Reserve r) {
    String requestId = r.requestId().orElseGet(() -> UUID.randomUUID().toString());
    ObjectNode body =
        object()
            .put("invocation_id", r.invocationId())
            .put("estimate", r.estimate())
            .put("wait", r.serverWait())
            .put("request_id", requestId);
    r.model().ifPresent(m -> body.put("model", m));
    split(body, r.split());
    return Call.refusable(
            "reserve",
            "POST",
            "/v1/tokens/reserve",
            Map.of(),
            body,
            b ->
                new Reservation(
                    Wire.stringField(b, "reservation_id"), Wire.longField(b, "wait_ms"), requestId))
        .extraTimeout(r.serverWait() ? Duration.ofMillis(Math.max(0, r.maxWaitMs())) : Duration.ZERO);
  }

  static Call<Outcome<Closed>> settle(String reservationId, long actual, TokenSplit split) {
    ObjectNode body =
        object()
            .put("reservation_id", Checks.id(reservationId, "reservationId"))
            .put("actual", actual);
    split(body, split);
    return Call.refusable("settle", "POST", "/v1/tokens/settle", Map.of(), body, Wire::closed);
  }

  static Call<Outcome<Closed>> refund(String reservationId) {
    ObjectNode body = object().put("reservation_id", Checks.id(reservationId, "reservationId"));
    return Call.refusable("refund", "POST", "/v1/tokens/refund", Map.of(), body, Wire::closed);
  }

  // Sessions ------------------------------------------------------------------

  private static String sessionPath(String sessionId) {
    return "/v1/sessions/" + encode(Checks.id(sessionId, "sessionId"));
  }

  static Call<Outcome<SessionLease>> acquireSessionLease(
      String sessionId, String holder, long ttlMs) {
    ObjectNode body = object().put("holder", Checks.id(holder, "holder")).put("ttl_ms", ttlMs);
    return Call.refusable(
        "acquire_session_lease",
        "POST",
        sessionPath(sessionId) + "/lease",
        Map.of(),
        body,
        Wire::sessionLease);
  }

  static Call<Outcome<SessionLease>> renewSessionLease(
      String sessionId, String holder, long ttlMs) {
    ObjectNode body = object().put("holder", Checks.id(holder, "holder")).put("ttl_ms", ttlMs);
    return Call.refusable(
        "renew_session_lease",
        "POST",
        sessionPath(sessionId) + "/lease/renew",
        Map.of(),
        body,
        Wire::sessionLease);
  }

  static Call<Outcome<Released>> releaseSessionLease(String sessionId, String holder) {
    return Call.refusable(
        "release_session_lease",
        "DELETE",
        sessionPath(sessionId) + "/lease",
        Map.of("holder", Checks.id(holder, "holder")),
        null,
        Wire::released);
  }

  static Call<Outcome<FenceCurrent>> checkFence(String sessionId, long fence) {
    return Call.refusable(
        "check_fence",
        "POST",
        sessionPath(sessionId) + "/fence",
        Map.of(),
        object().put("fence", fence),
        b -> new FenceCurrent(Wire.boolField(b, "current")));
  }

  // Providers -----------------------------------------------------------------

  static Call<Outcome<ProviderPermit>> providerPermit(String provider, Permit p) {
    ObjectNode body = object().put("model", p.model());
    p.tenant().ifPresent(t -> body.put("tenant", t));
    body.put("tokens", p.tokens());
    p.inputTokens().ifPresent(v -> body.put("input_tokens", v));
    p.outputTokens().ifPresent(v -> body.put("output_tokens", v));
    p.maxWaitMs().ifPresent(v -> body.put("max_wait_ms", v));
    body.put("wait", p.serverWait());
    Duration extra =
        p.serverWait()
            ? p.maxWaitMs().isPresent()
                ? Duration.ofMillis(Math.max(0, p.maxWaitMs().getAsLong()))
                : PERMIT_WAIT_DEFAULT
            : Duration.ZERO;
    // Never retried: a permit is a take without a request id, a repeat could take twice.
    return Call.refusable(
            "provider_permit",
            "POST",
            "/v1/providers/" + encode(Checks.id(provider, "provider")) + "/permits",
            Map.of(),
            body,
            b ->
                new ProviderPermit(
                    Wire.longField(b, "wait_ms"), Wire.intField(b, "effective_permille")))
        .notRetried()
        .extraTimeout(extra);
  }

  static Call<Feedback> providerFeedback(
      String provider, String model, int status, Map<String, String> headers, String body) {
    ObjectNode payload = object().put("model", Checks.id(model, "model")).put("status", status);
    ObjectNode h = payload.putObject("headers");
    headers.forEach(h::put);
    if (body != null) {
      payload.put("body", body);
    }
    // Never retried: a second 429 reported may halve the rate again.
    return Call.plain(
            "provider_feedback",
            "POST",
            "/v1/providers/" + encode(Checks.id(provider, "provider")) + "/feedback",
            Map.of(),
            payload,
            false,
            b ->
                new Feedback(
                    Wire.stringField(b, "class"),
                    Wire.boolField(b, "retryable"),
                    Wire.optLong(b, "retry_after_ms"),
                    Wire.optLong(b, "cooldown_until_ms"),
                    Wire.optInt(b, "effective_permille"),
                    Wire.optString(b, "reason")))
        .notRetried();
  }

  // Beside the API --------------------------------------------------------------

  static Call<Boolean> healthz() {
    return Call.plain(
        "healthz", "GET", "/healthz", Map.of(), null, false, b -> ok(b));
  }

  /** Not retried: a 503 is the answer (the store is down under fail_closed). */
  static Call<Boolean> readyz() {
    return Call.plain("readyz", "GET", "/readyz", Map.of(), null, false, b -> ok(b))
        .notRetried();
  }

  private static boolean ok(JsonNode b) {
    return "ok".equals(Wire.stringField(b, "status"));
  }

  // Admin -------------------------------------------------------------------------

  private static String userPath(String user) {
    return "/admin/users/" + encode(Checks.id(user, "user"));
  }

  static Call<UserView> adminUser(String user) {
    return Call.plain(
        "admin_user",
        "GET",
        userPath(user),
        Map.of(),
        null,
        true,
        b ->
            new UserView(
                Wire.stringField(b, "user"),
                Wire.stringField(b, "plan"),
                Wire.longField(b, "turns_available"),
                Wire.longField(b, "tokens_available"),
                Wire.longField(b, "tokens_last_minute"),
                Wire.list(
                    b,
                    "leases",
                    x ->
                        new LeaseView(
                            Wire.stringField(x, "invocation_id"),
                            Wire.longField(x, "expires_at_ms"))),
                b.has("budgets") ? Wire.list(b, "budgets", Wire::budget) : List.of()));
  }

  static Call<List<TopUser>> adminTop(OptionalLong n) {
    return Call.plain(
        "admin_top",
        "GET",
        "/admin/top",
        n.isPresent() ? Map.of("n", Long.toString(n.getAsLong())) : Map.of(),
        null,
        true,
        b ->
            Wire.list(
                b,
                "users",
                x -> new TopUser(Wire.stringField(x, "user"), Wire.longField(x, "tokens_last_minute"))));
  }

  static Call<Boolean> adminReset(String user) {
    return Call.plain(
        "admin_reset",
        "POST",
        userPath(user) + "/reset",
        Map.of(),
        null,
        true,
        b -> Wire.boolField(b, "reset"));
  }

  static Call<Released> adminReleaseLease(String user, String invocationId) {
    return Call.plain(
        "admin_release_lease",
        "DELETE",
        userPath(user) + "/leases/" + encode(Checks.id(invocationId, "invocationId")),
        Map.of(),
        null,
        true,
        Wire::released);
  }

  static Call<List<BudgetView>> adminBudgetReset(String user, String window) {
    return Call.plain(
        "admin_budget_reset",
        "POST",
        userPath(user) + "/budgets/" + encode(Checks.id(window, "window")) + "/reset",
        Map.of(),
        null,
        true,
        b -> Wire.list(b, "budgets", Wire::budget));
  }

  /**
   * A top-up carries its request id (a new UUID if {@code requestId} is null), which the sidecar
   * grants once within a day: retried like a reserve.
   */
  static Call<List<BudgetView>> adminBudgetTopUp(
      String user, String window, ObjectNode amount, String requestId) {
    amount.put(
        "request_id",
        requestId == null ? UUID.randomUUID().toString() : Checks.id(requestId, "requestId"));
    return Call.plain(
        "admin_budget_top_up",
        "POST",
        userPath(user) + "/budgets/" + encode(Checks.id(window, "window")) + "/top_up",
        Map.of(),
        amount,
        true,
        b -> Wire.list(b, "budgets", Wire::budget));
  }

  static ObjectNode tokens(long tokens) {
    return object().put("tokens", tokens);
  }

  static ObjectNode cost(String cost) {
    return object().put("cost", Checks.id(cost, "cost"));
  }

  static Call<Reloaded> adminReload() {
    return Call.plain(
            "admin_reload",
            "POST",
            "/admin/reload",
            Map.of(),
            null,
            true,
            b ->
                new Reloaded(
                    Wire.boolField(b, "reloaded"),
                    b.has("needs_restart")
                        ? Wire.list(b, "needs_restart", JsonNode::asText)
                        : List.of()))
        .notRetried();
  }

  static Call<List<ProviderView>> adminProviders() {
    return Call.plain(
        "admin_providers",
        "GET",
        "/admin/providers",
        Map.of(),
        null,
        true,
        b -> Wire.list(b, "providers", Wire::providerView));
  }

  private static String providerPath(String provider, String model) {
    return "/admin/providers/"
        + encode(Checks.id(provider, "provider"))
        + "/"
        + encode(Checks.id(model, "model"));
  }

  static Call<ProviderView> adminProvider(String provider, String model) {
    return Call.plain(
        "admin_provider",
        "GET",
        providerPath(provider, model),
        Map.of(),
        null,
        true,
        Wire::providerView);
  }

  static Call<ProviderCleared> adminClearProvider(String provider, String model) {
    return Call.plain(
        "admin_clear_provider",
        "POST",
        providerPath(provider, model) + "/clear",
        Map.of(),
        null,
        true,
        b -> {
          JsonNode c = Wire.field(b, "cleared");
          return new ProviderCleared(
              Wire.stringField(b, "provider"),
              Wire.stringField(b, "model"),
              Wire.optLong(c, "cooldown_until_ms"),
              Wire.intField(c, "effective_permille"),
              Wire.optObject(c, "exhausted", Wire::exhaustion));
        });
  }
}
