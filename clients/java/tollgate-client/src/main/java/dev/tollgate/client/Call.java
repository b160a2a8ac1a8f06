package dev.tollgate.client;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.time.Duration;
import java.util.Map;
import java.util.function.Function;

/**
 * One request to the sidecar and how to read its answer: how to send it (method, path, query,
 * body, whether a retry is safe, extra time it may take on purpose) and how to read a 200 ({@code
 * ok}) and a refusal ({@code refused}; {@code null} for operations no limit refuses, where a
 * refusal is an answer the client does not understand).
 *
 * @param operation the operation's name, carried by faults
 * @param method the HTTP method
 * @param path the path, ids already encoded
 * @param query the query, ids not yet encoded (empty: none)
 * @param body the JSON body, or {@code null}
 * @param retrySafe a repeat cannot take or grant twice
 * @param admin sent to the admin URL with the admin token instead of the user's
 * @param extraTimeout time the sidecar may hold the request on purpose ({@code wait=true})
 * @param ok reads a 200 body
 * @param refused wraps a refusal, or {@code null}
 * @param <R> the answer's type
 */
record Call<R>(
    String operation,
    String method,
    String path,
    Map<String, String> query,
    ObjectNode body,
    boolean retrySafe,
    boolean admin,
    Duration extraTimeout,
    Function<JsonNode, R> ok,
    Function<Refusal, R> refused) {

  /** A user operation a limit may refuse. */
  static <T> Call<Outcome<T>> refusable(
      String operation,
      String method,
      String path,
      Map<String, String> query,
      ObjectNode body,
      Function<JsonNode, T> ok) {
    return new Call<>(
        operation,
        method,
        path,
        query,
        body,
        true,
        false,
        Duration.ZERO,
        b -> new Outcome.Granted<>(ok.apply(b)),
        Outcome.Refused::new);
  }

  /** An operation no limit refuses. */
  static <T> Call<T> plain(
      String operation,
      String method,
      String path,
      Map<String, String> query,
      ObjectNode body,
      boolean admin,
      Function<JsonNode, T> ok) {
    return new Call<>(
        operation, method, path, query, body, true, admin, Duration.ZERO, ok, null);
  }

  Call<R> notRetried() {
    return new Call<>(
        operation, method, path, query, body, false, admin, extraTimeout, ok, refused);
  }

  Call<R> extraTimeout(Duration extra) {
    return new Call<>(operation, method, path, query, body, retrySafe, admin, extra, ok, refused);
  }
}
