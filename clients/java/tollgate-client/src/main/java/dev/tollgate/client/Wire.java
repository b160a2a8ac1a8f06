package dev.tollgate.client;

import com.fasterxml.jackson.databind.JsonNode;
import java.net.http.HttpHeaders;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Optional;
import java.util.OptionalDouble;
import java.util.OptionalInt;
import java.util.OptionalLong;
import java.util.function.Function;

/**
 * Reading the sidecar's JSON (docs/spec.md §8) strictly: a field the answer must have and lacks,
 * or one of the wrong type, is a {@link BadAnswer}, never a silent zero.
 */
final class Wire {
  private Wire() {}

  /** An answer the client does not understand. */
  static final class BadAnswer extends RuntimeException {
    private static final long serialVersionUID = 1L;

    BadAnswer(String message) {
      super(message);
    }
  }

  static JsonNode field(JsonNode b, String name) {
    JsonNode v = b.get(name);
    if (v == null || v.isNull()) {
      throw new BadAnswer("missing field " + name);
    }
    return v;
  }

  static long longField(JsonNode b, String name) {
    JsonNode v = field(b, name);
    if (!v.isIntegralNumber() || !v.canConvertToLong()) {
      throw new BadAnswer("field " + name + " is not an integer: " + v);
    }
    return v.longValue();
  }

  static int intField(JsonNode b, String name) {
    long v = longField(b, name);
    if (v < Integer.MIN_VALUE || v > Integer.MAX_VALUE) {
      throw new BadAnswer("field " + name + " is out of range: " + v);
    }
    return (int) v;
  }

  static String stringField(JsonNode b, String name) {
    JsonNode v = field(b, name);
    if (!v.isTextual()) {
      throw new BadAnswer("field " + name + " is not a string: " + v);
    }
    return v.textValue();
  }

  static boolean boolField(JsonNode b, String name) {
    JsonNode v = field(b, name);
    if (!v.isBoolean()) {
      throw new BadAnswer("field " + name + " is not a boolean: " + v);
    }
    return v.booleanValue();
  }

  static boolean flag(JsonNode b, String name) {
    JsonNode v = b.get(name);
    return v != null && v.isBoolean() && v.booleanValue();
  }

  static OptionalLong optLong(JsonNode b, String name) {
    JsonNode v = b.get(name);
    return v == null || v.isNull() ? OptionalLong.empty() : OptionalLong.of(longField(b, name));
  }

  static OptionalInt optInt(JsonNode b, String name) {
    JsonNode v = b.get(name);
    return v == null || v.isNull() ? OptionalInt.empty() : OptionalInt.of(intField(b, name));
  }

  static Optional<String> optString(JsonNode b, String name) {
    JsonNode v = b.get(name);
    return v == null || v.isNull() ? Optional.empty() : Optional.of(stringField(b, name));
  }

  static <T> List<T> list(JsonNode b, String name, Function<JsonNode, T> item) {
    JsonNode v = field(b, name);
    if (!v.isArray()) {
      throw new BadAnswer("field " + name + " is not an array: " + v);
    }
    List<T> out = new ArrayList<>(v.size());
    for (JsonNode x : v) {
      out.add(item.apply(x));
    }
    return out;
  }

  static <T> Optional<T> optObject(JsonNode b, String name, Function<JsonNode, T> read) {
    JsonNode v = b.get(name);
    return v == null || v.isNull() ? Optional.empty() : Optional.of(read.apply(v));
  }

  // Results -----------------------------------------------------------------

  static SessionLease sessionLease(JsonNode b) {
    return new SessionLease(longField(b, "fence"), longField(b, "expires_at_ms"));
  }

  static Released released(JsonNode b) {
    return new Released(boolField(b, "released"), flag(b, "pending"));
  }

  static Closed closed(JsonNode b) {
    if (flag(b, "pending")) {
      return new Closed(OptionalLong.empty(), true);
    }
    return new Closed(OptionalLong.of(longField(b, "balance")), false);
  }

  static Exhaustion exhaustion(JsonNode b) {
    return new Exhaustion(
        longField(b, "until_ms"), longField(b, "remaining_ms"), stringField(b, "reason"));
  }

  static BudgetView budget(JsonNode b) {
    return new BudgetView(
        stringField(b, "window"),
        stringField(b, "unit"),
        optString(b, "currency"),
        longField(b, "limit"),
        optLong(b, "granted").orElse(0),
        longField(b, "spent"),
        longField(b, "resets_at_ms"));
  }

  static ProviderView providerView(JsonNode b) {
    return new ProviderView(
        stringField(b, "provider"),
        stringField(b, "model"),
        optLong(b, "cooldown_until_ms"),
        longField(b, "cooldown_remaining_ms"),
        intField(b, "effective_permille"),
        optObject(b, "exhausted", Wire::exhaustion),
        b.has("tenants") ? list(b, "tenants", Wire::providerTenant) : List.of());
  }

  static ProviderTenant providerTenant(JsonNode b) {
    return new ProviderTenant(
        stringField(b, "name"),
        optInt(b, "weight"),
        optDouble(b, "share"),
        boolField(b, "active"),
        longField(b, "booked_ahead_ms"),
        optDouble(b, "recent_share"));
  }

  static OptionalDouble optDouble(JsonNode b, String name) {
    JsonNode v = b.get(name);
    if (v == null || v.isNull()) {
      return OptionalDouble.empty();
    }
    if (!v.isNumber()) {
      throw new BadAnswer("field " + name + " is not a number: " + v);
    }
    return OptionalDouble.of(v.doubleValue());
  }

  // Refusals and faults ------------------------------------------------------

  /**
   * The retry hint of a refusal or fault: the body's {@code retry_after_ms}, else the {@code
   * Retry-After} header in seconds; {@code -1} when there is none.
   */
  static long retryAfterMs(JsonNode body, HttpHeaders headers) {
    JsonNode v = body.get("retry_after_ms");
    if (v != null && v.isIntegralNumber() && v.canConvertToLong() && v.longValue() >= 0) {
      return v.longValue();
    }
    Optional<String> h = headers.firstValue("retry-after");
    if (h.isPresent()) {
      try {
        long s = Long.parseLong(h.get().trim());
        if (s >= 0 && s < Long.MAX_VALUE / 1000) {
          return s * 1000;
        }
      } catch (NumberFormatException e) {
        return -1;
      }
    }
    return -1;
  }

  /** The refusal an error code names, or {@code null} when the code is not a refusal. */
  static Refusal refusal(String error, String message, JsonNode body, long retryAfterMs) {
    Optional<String> limit = optText(body, "limit");
    OptionalLong retry = retryAfterMs < 0 ? OptionalLong.empty() : OptionalLong.of(retryAfterMs);
    return switch (error) {
      case "turn_rate" -> new Refusal.TurnRateLimited(message, limit, retry);
      case "concurrency" -> new Refusal.ConcurrencyLimited(message, limit, retry);
      case "sessions" -> new Refusal.SessionsLimited(message, limit, retry);
      case "session_busy" -> new Refusal.SessionBusy(message, limit, retry);
      case "token_rate" -> new Refusal.TokenRateLimited(message, limit, retry);
      case "budget_exhausted" ->
          new Refusal.BudgetExhausted(message, limit, retry, optNumber(body, "resets_at_ms"));
      case "max_llm_calls" -> new Refusal.MaxLlmCalls(message, limit, retry);
      case "exceeds_capacity" -> new Refusal.ExceedsCapacity(message, limit, retry);
      case "too_many_waits" -> new Refusal.TooManyWaits(message, limit, retry);
      case "provider_rate", "provider_cooldown" ->
          new Refusal.ProviderLimited(error, message, limit, retry);
      case "provider_exhausted" -> new Refusal.ProviderExhausted(message, limit, retry);
      case "stale_fence" ->
          new Refusal.StaleFence(
              message, limit, OptionalLong.empty(), optNumber(body, "latest_fence").orElse(0));
      case "lease_lost" -> new Refusal.LeaseLost(message, limit, retry);
      case "not_holder" -> new Refusal.NotHolder(message, limit, retry);
      case "unknown_reservation" -> new Refusal.UnknownReservation(message, limit, retry);
      default -> null;
    };
  }

  /** The fault an error code (or, for a code the client does not know, the status) names. */
  static TollgateException fault(TollgateException.Fault f) {
    String kind =
        switch (f.error()) {
          case "unauthorized" -> "401";
          case "forbidden" -> "403";
          case "invalid_request", "invalid_config" -> "400";
          case "not_found", "unknown_provider" -> "404";
          case "request_timeout" -> "408";
          case "store_unavailable", "store_full" -> "503";
          case "overloaded" -> "429";
          case "internal" -> "500";
          default -> Integer.toString(f.status());
        };
    return switch (kind) {
      case "401" -> new TollgateException.Unauthorized(f);
      case "403" -> new TollgateException.Forbidden(f);
      case "400" -> new TollgateException.InvalidRequest(f);
      case "404" -> new TollgateException.NotFound(f);
      case "408" -> new TollgateException.RequestTimeout(f);
      case "503" -> new TollgateException.StoreUnavailable(f);
      case "429" -> new TollgateException.Overloaded(f);
      default -> new TollgateException.ServerError(f, null);
    };
  }

  /**
   * An {@code invalid_config} answer's {@code errors} ({@code [{path, reason}]}) as text to add to
   * its message, e.g. {@code " (default_plan: no such plan)"}; empty when there are none.
   */
  static String configErrors(JsonNode body) {
    JsonNode errors = body.get("errors");
    if (errors == null || !errors.isArray() || errors.isEmpty()) {
      return "";
    }
    StringBuilder out = new StringBuilder(" (");
    int n = 0;
    for (JsonNode e : errors) {
      if (n++ > 0) {
        out.append("; ");
      }
      if (n > 10) {
        out.append(errors.size() - 10).append(" more");
        break;
      }
      out.append(optText(e, "path").orElse("?")).append(": ").append(optText(e, "reason").orElse("?"));
    }
    return out.append(')').toString();
  }

  static Optional<String> optText(JsonNode b, String name) {
    JsonNode v = b.get(name);
    return v != null && v.isTextual() ? Optional.of(v.textValue()) : Optional.empty();
  }

  static OptionalLong optNumber(JsonNode b, String name) {
    JsonNode v = b.get(name);
    return v != null && v.isIntegralNumber() && v.canConvertToLong()
        ? OptionalLong.of(v.longValue())
        : OptionalLong.empty();
  }

  // Paths ----------------------------------------------------------------------

  /**
   * A path segment or query value, percent-encoded as UTF-8: everything but RFC 3986's
   * unreserved characters is escaped (a {@code /} in a model is {@code %2F}, a space {@code %20}),
   * and the dots of a segment that is {@code .} or {@code ..} so no one on the way reads it as a
   * relative path.
   */
  static String encode(String s) {
    if (s.equals(".") || s.equals("..")) {
      return s.replace(".", "%2E");
    }
    StringBuilder out = new StringBuilder(s.length() + 8);
    for (byte b : s.getBytes(StandardCharsets.UTF_8)) {
      int c = b & 0xff;
      if ((c >= 'a' && c <= 'z')
          || (c >= 'A' && c <= 'Z')
          || (c >= '0' && c <= '9')
          || c == '-'
          || c == '.'
          || c == '_'
          || c == '~') {
        out.append((char) c);
      } else {
        out.append('%').append(Character.toUpperCase(Character.forDigit(c >> 4, 16)));
        out.append(Character.toUpperCase(Character.forDigit(c & 0xf, 16)));
      }
    }
    return out.toString();
  }
}
