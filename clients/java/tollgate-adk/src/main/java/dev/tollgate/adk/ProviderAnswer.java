package dev.tollgate.adk;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import com.google.genai.errors.ApiException;
import java.util.Map;
import java.util.Objects;
import java.util.Optional;

/**
 * A model provider's failed answer: its HTTP status, headers and body, as the sidecar's feedback
 * route reads them (docs/spec.md §5). {@link #of(Throwable)} finds one inside a model error.
 *
 * @param status the HTTP status, 100 to 599
 * @param headers the provider's headers (lower-case names), e.g. {@code retry-after}
 * @param body the provider's body, if any
 */
public record ProviderAnswer(int status, Map<String, String> headers, Optional<String> body) {
  private static final ObjectMapper JSON = new ObjectMapper();

  /**
   * Checks and copies the components.
   *
   * @param status the HTTP status, 100 to 599
   * @param headers the provider's headers
   * @param body the provider's body, if any
   */
  public ProviderAnswer {
    if (status < 100 || status > 599) {
      throw new IllegalArgumentException("status must be 100 to 599, got " + status);
    }
    headers = Map.copyOf(headers);
    Objects.requireNonNull(body, "body");
  }

  /**
   * The provider's answer inside {@code error}, when there is one: a {@link
   * ProviderHttpException} (thrown by a model of the caller's own), or google-genai's {@link
   * ApiException} (the Gemini client's: its code, and its status, message and details rebuilt as
   * Gemini's error body, where RetryInfo's {@code retryDelay} travels). Anything else has none.
   *
   * @param error a model error
   * @return the answer, if the error carries one
   */
  public static Optional<ProviderAnswer> of(Throwable error) {
    for (Throwable t = error; t != null; t = t.getCause()) {
      if (t instanceof ProviderHttpException p) {
        return Optional.of(p.answer());
      }
      if (t instanceof ApiException a && a.code() >= 100 && a.code() <= 599) {
        return Optional.of(new ProviderAnswer(a.code(), Map.of(), Optional.of(geminiBody(a))));
      }
      if (t.getCause() == t) {
        break;
      }
    }
    return Optional.empty();
  }

  /**
   * google-genai folds Gemini's error body into its message ({@code message\nDetails: {json}\n...});
   * this unfolds it again.
   */
  static String geminiBody(ApiException a) {
    ObjectNode error = JSON.createObjectNode();
    error.put("code", a.code());
    if (a.status() != null) {
      error.put("status", a.status());
    }
    String message = a.message() == null ? "" : a.message();
    int at = message.indexOf("Details: ");
    ArrayNode details = error.putArray("details");
    if (at >= 0) {
      for (String line : message.substring(at + "Details: ".length()).split("\n")) {
        try {
          JsonNode d = JSON.readTree(line.trim());
          if (d != null && d.isObject()) {
            details.add(d);
          }
        } catch (Exception notJson) {
          // A detail that is not JSON is left in the message.
        }
      }
      message = message.substring(0, at).trim();
    }
    error.put("message", message);
    ObjectNode body = JSON.createObjectNode();
    body.set("error", error);
    return body.toString();
  }
}
