package dev.tollgate.client;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.net.http.HttpTimeoutException;
import java.time.Duration;
import java.util.Map;
import java.util.concurrent.CancellationException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.Executor;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicReference;

/**
 * Moves one {@link Call} over HTTP: the credential, the bounded pool, the timeout, the retries of
 * 503 and 429 {@code overloaded}, and the answer read into a result, a refusal or a fault. Nothing
 * here blocks a thread.
 */
final class Transport {
  static final String USER_AGENT = "tollgate-java/0.1.0";

  private final ObjectMapper json = new ObjectMapper();
  private final HttpClient http;
  private final URI baseUrl;
  private final URI adminUrl;
  private final Credentials credentials;
  private final String adminToken;
  private final Duration timeout;
  private final RetryPolicy retry;
  private final Permits permits;
  private final Executor executor;
  private volatile boolean closed;

  Transport(
      HttpClient http,
      URI baseUrl,
      URI adminUrl,
      Credentials credentials,
      String adminToken,
      Duration timeout,
      RetryPolicy retry,
      int maxConnections,
      Executor executor) {
    this.http = http;
    this.baseUrl = baseUrl;
    this.adminUrl = adminUrl;
    this.credentials = credentials;
    this.adminToken = adminToken;
    this.timeout = timeout;
    this.retry = retry;
    this.permits = new Permits(maxConnections);
    this.executor = executor;
  }

  void close() {
    closed = true;
  }

  /**
   * Sends {@code call} as {@code userId} (ignored for admin calls and {@code null} for calls that
   * need no identity) and reads the answer. The future fails with a {@link TollgateException} for
   * a fault; cancelling it aborts the exchange in flight.
   */
  <R> CompletableFuture<R> send(Call<R> call, String userId, boolean needsIdentity) {
    if (closed) {
      return CompletableFuture.failedFuture(
          new TollgateException.SidecarUnreachable(
              TollgateException.Fault.local(call.operation(), "closed", "the client is closed"),
              null));
    }
    String bearer;
    if (call.admin()) {
      bearer = adminToken;
    } else if (needsIdentity) {
      try {
        bearer = token(call.operation(), userId);
      } catch (TollgateException e) {
        return CompletableFuture.failedFuture(e);
      }
    } else {
      bearer = null;
    }
    HttpRequest request;
    try {
      request = request(call, bearer);
    } catch (JsonProcessingException | IllegalArgumentException e) {
      return CompletableFuture.failedFuture(
          new TollgateException.InvalidRequest(
              TollgateException.Fault.local(call.operation(), "invalid_request", e.getMessage())));
    }
    CompletableFuture<R> result = new CompletableFuture<>();
    AtomicReference<CompletableFuture<?>> current = new AtomicReference<>();
    result.whenComplete(
        (r, e) -> {
          if (result.isCancelled()) {
            CompletableFuture<?> c = current.get();
            if (c != null) {
              c.cancel(true);
            }
          }
        });
    attempt(call, request, 0, result, current);
    return result;
  }

  private String token(String operation, String userId) {
    if (credentials == null) {
      throw new TollgateException.CredentialsUnavailable(
          TollgateException.Fault.local(
              operation, "credentials", "no credentials configured (TollgateClient.Builder.credentials)"),
          null);
    }
    String t;
    try {
      t = credentials.token(userId);
    } catch (Exception e) {
      throw new TollgateException.CredentialsUnavailable(
          TollgateException.Fault.local(
              operation,
              "credentials",
              "the credentials function failed for the user: " + e),
          e);
    }
    if (t == null || t.isBlank()) {
      throw new TollgateException.CredentialsUnavailable(
          TollgateException.Fault.local(
              operation, "credentials", "the credentials function answered no token for the user"),
          null);
    }
    if (t.indexOf('\r') >= 0 || t.indexOf('\n') >= 0) {
      throw new TollgateException.CredentialsUnavailable(
          TollgateException.Fault.local(
              operation, "credentials", "the credentials function answered a token with a line break"),
          null);
    }
    return t;
  }

  private HttpRequest request(Call<?> call, String bearer) throws JsonProcessingException {
    StringBuilder target = new StringBuilder();
    URI base = call.admin() ? adminUrl : baseUrl;
    String b = base.toString();
    target.append(b.endsWith("/") ? b.substring(0, b.length() - 1) : b).append(call.path());
    char sep = '?';
    for (Map.Entry<String, String> q : call.query().entrySet()) {
      target.append(sep).append(Wire.encode(q.getKey())).append('=').append(Wire.encode(q.getValue()));
      sep = '&';
    }
    HttpRequest.Builder r =
        HttpRequest.newBuilder(URI.create(target.toString()))
            .timeout(timeout.plus(call.extraTimeout()))
            .header("accept", "application/json")
            .header("user-agent", USER_AGENT);
    if (bearer != null && !bearer.isEmpty()) {
      r.header("authorization", "Bearer " + bearer);
    }
    ObjectNode body = call.body();
    if (body != null) {
      r.header("content-type", "application/json");
      r.method(call.method(), HttpRequest.BodyPublishers.ofByteArray(json.writeValueAsBytes(body)));
    } else {
      r.method(call.method(), HttpRequest.BodyPublishers.noBody());
    }
    return r.build();
  }

  private <R> void attempt(
      Call<R> call,
      HttpRequest request,
      int attempt,
      CompletableFuture<R> result,
      AtomicReference<CompletableFuture<?>> current) {
    if (result.isDone()) {
      return;
    }
    CompletableFuture<Void> permit = permits.acquire();
    current.set(permit);
    long waitForPermitMs = request.timeout().orElse(timeout).toMillis();
    permit
        .orTimeout(waitForPermitMs, TimeUnit.MILLISECONDS)
        .whenComplete(
            (ok, e) -> {
              if (e != null) {
                permits.forget(permit);
                result.completeExceptionally(
                    e instanceof TimeoutException
                        ? new TollgateException.SidecarUnreachable(
                            TollgateException.Fault.local(
                                call.operation(),
                                "timeout",
                                "no connection of the pool was free within " + waitForPermitMs + " ms"),
                            e)
                        : e);
                return;
              }
              exchange(call, request, attempt, result, current);
            });
  }

  private <R> void exchange(
      Call<R> call,
      HttpRequest request,
      int attempt,
      CompletableFuture<R> result,
      AtomicReference<CompletableFuture<?>> current) {
    CompletableFuture<HttpResponse<byte[]>> sent;
    try {
      sent = http.sendAsync(request, HttpResponse.BodyHandlers.ofByteArray());
    } catch (RuntimeException e) {
      permits.release();
      result.completeExceptionally(unreachable(call, e));
      return;
    }
    current.set(sent);
    if (result.isCancelled()) {
      sent.cancel(true);
    }
    sent.whenComplete(
        (response, e) -> {
          permits.release();
          if (e != null) {
            result.completeExceptionally(unreachable(call, e));
            return;
          }
          JsonNode body = parse(response.body());
          long delay = retryDelayMs(call, attempt, response.statusCode(), body, response);
          if (delay < 0) {
            try {
              result.complete(decode(call, response, body));
            } catch (TollgateException f) {
              result.completeExceptionally(f);
            }
            return;
          }
          Executor later = CompletableFuture.delayedExecutor(delay, TimeUnit.MILLISECONDS, executor);
          later.execute(() -> attempt(call, request, attempt + 1, result, current));
        });
  }

  /**
   * The delay before retrying after this answer, or {@code -1}: only 503s and 429 {@code
   * overloaded} are retried, only retry-safe calls, at most {@code maxRetries} times, never past
   * a hint above {@code maxDelay}.
   */
  private long retryDelayMs(
      Call<?> call, int attempt, int status, JsonNode body, HttpResponse<?> response) {
    if (!call.retrySafe() || attempt >= retry.maxRetries()) {
      return -1;
    }
    boolean retryable =
        status == 503
            || (status == 429 && "overloaded".equals(Wire.optText(body, "error").orElse("")));
    if (!retryable) {
      return -1;
    }
    long hint = Wire.retryAfterMs(body, response.headers());
    return retry.delayMs(attempt, hint, ThreadLocalRandom.current().nextDouble());
  }

  private JsonNode parse(byte[] bytes) {
    if (bytes == null || bytes.length == 0) {
      return json.createObjectNode();
    }
    try {
      JsonNode n = json.readTree(bytes);
      return n != null && n.isObject() ? n : json.createObjectNode();
    } catch (IOException e) {
      return json.createObjectNode();
    }
  }

  private <R> R decode(Call<R> call, HttpResponse<byte[]> response, JsonNode body) {
    int status = response.statusCode();
    if (status == 200) {
      try {
        return call.ok().apply(body);
      } catch (RuntimeException e) {
        throw new TollgateException.ServerError(
            new TollgateException.Fault(
                call.operation(),
                "bad_answer",
                status,
                "unexpected answer " + snippet(response.body()) + ": " + e.getMessage(),
                null,
                -1),
            e);
      }
    }
    String error = Wire.optText(body, "error").orElse("http_" + status);
    String message = Wire.optText(body, "message").orElse(error) + Wire.configErrors(body);
    long retryAfter = Wire.retryAfterMs(body, response.headers());
    Refusal refusal = Wire.refusal(error, message, body, retryAfter);
    if (refusal != null) {
      if (call.refused() != null) {
        return call.refused().apply(refusal);
      }
      throw new TollgateException.ServerError(
          new TollgateException.Fault(
              call.operation(),
              error,
              status,
              "a refusal this operation never answers: " + message,
              null,
              retryAfter),
          null);
    }
    throw Wire.fault(
        new TollgateException.Fault(
            call.operation(),
            error,
            status,
            message,
            Wire.optText(body, "field").orElse(null),
            retryAfter));
  }

  private static String snippet(byte[] body) {
    String s = new String(body, java.nio.charset.StandardCharsets.UTF_8);
    return s.length() > 200 ? s.substring(0, 200) + "..." : s;
  }

  private static TollgateException unreachable(Call<?> call, Throwable e) {
    Throwable cause = e instanceof CompletionException && e.getCause() != null ? e.getCause() : e;
    if (cause instanceof CancellationException) {
      return new TollgateException.SidecarUnreachable(
          TollgateException.Fault.local(call.operation(), "cancelled", "the request was cancelled"),
          cause);
    }
    boolean timedOut = cause instanceof HttpTimeoutException;
    return new TollgateException.SidecarUnreachable(
        TollgateException.Fault.local(
            call.operation(),
            timedOut ? "timeout" : "unreachable",
            cause.getClass().getSimpleName()
                + (cause.getMessage() == null ? "" : ": " + cause.getMessage())),
        cause);
  }
}
