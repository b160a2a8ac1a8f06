package dev.tollgate.client;

import java.util.Optional;
import java.util.OptionalInt;
import java.util.OptionalLong;

/**
 * No decision could be made: bad credentials, bad input, the sidecar's store failing, the sidecar
 * unreachable. Raised (as the cause of a failed {@link java.util.concurrent.CompletableFuture},
 * or thrown by the blocking calls), never returned; a limit's decision is a {@link Refusal}.
 *
 * <p>Each subclass is one kind of fault; {@link #error()} is the sidecar's {@code error} code
 * ({@code "unreachable"}, {@code "timeout"} or {@code "credentials"} when the fault is the
 * client's own), {@link #operation()} the client operation ({@code "reserve"}, {@code
 * "admin_user"}, ...), {@link #status()} the HTTP status when there was an answer and {@link
 * #field()} the offending input for {@code invalid_request}.
 */
public abstract sealed class TollgateException extends RuntimeException
    permits TollgateException.Unauthorized,
        TollgateException.Forbidden,
        TollgateException.InvalidRequest,
        TollgateException.NotFound,
        TollgateException.RequestTimeout,
        TollgateException.StoreUnavailable,
        TollgateException.Overloaded,
        TollgateException.ServerError,
        TollgateException.SidecarUnreachable,
        TollgateException.CredentialsUnavailable {

  private static final long serialVersionUID = 1L;

  private final String operation;
  private final String error;
  private final int status;
  private final String field;
  private final long retryAfterMs;

  TollgateException(Fault fault, Throwable cause) {
    super(describe(fault), cause);
    this.operation = fault.operation();
    this.error = fault.error();
    this.status = fault.status();
    this.field = fault.field();
    this.retryAfterMs = fault.retryAfterMs();
  }

  private static String describe(Fault f) {
    String where = f.field() == null ? "" : " (field " + f.field() + ")";
    String status = f.status() == 0 ? "" : " [HTTP " + f.status() + "]";
    return "tollgate " + f.operation() + ": " + f.error() + where + status + ": " + f.message();
  }

  /**
   * The client operation that failed.
   *
   * @return e.g. {@code "reserve"}, {@code "admin_user"}
   */
  public String operation() {
    return operation;
  }

  /**
   * The sidecar's {@code error} code, or the client's own: {@code "unreachable"} (no answer),
   * {@code "timeout"} (no answer in time), {@code "credentials"} (no token to send), {@code
   * "bad_answer"} (an answer the client does not understand).
   *
   * @return the code
   */
  public String error() {
    return error;
  }

  /**
   * The HTTP status of the answer.
   *
   * @return the status, absent when there was no answer
   */
  public OptionalInt status() {
    return status == 0 ? OptionalInt.empty() : OptionalInt.of(status);
  }

  /**
   * The offending input, for {@code invalid_request}: a JSON path, a path parameter or a query
   * parameter ({@code "estimate"}, {@code "invocation_id"}, {@code "body"}).
   *
   * @return the field, when the sidecar named one
   */
  public Optional<String> field() {
    return Optional.ofNullable(field);
  }

  /**
   * The sidecar's retry hint, when it gave one (503 and 429 {@code overloaded} carry one).
   *
   * @return milliseconds, when given
   */
  public OptionalLong retryAfterMs() {
    return retryAfterMs < 0 ? OptionalLong.empty() : OptionalLong.of(retryAfterMs);
  }

  /** What a fault carries; built by the client. */
  record Fault(
      String operation, String error, int status, String message, String field, long retryAfterMs) {
    static Fault local(String operation, String error, String message) {
      return new Fault(operation, error, 0, message, null, -1);
    }
  }

  /** No verified identity, or a user no plan covers (401 {@code unauthorized}). */
  public static final class Unauthorized extends TollgateException {
    private static final long serialVersionUID = 1L;

    Unauthorized(Fault fault) {
      super(fault, null);
    }
  }

  /**
   * The credential lacks a privilege the operation needs (403 {@code forbidden}): provider
   * feedback without the feedback scope, a tenant other than the verified one.
   */
  public static final class Forbidden extends TollgateException {
    private static final long serialVersionUID = 1L;

    Forbidden(Fault fault) {
      super(fault, null);
    }
  }

  /**
   * Bad input (400 {@code invalid_request}; {@link #field()} names it), or a config the sidecar
   * refused to reload (400 {@code invalid_config}).
   */
  public static final class InvalidRequest extends TollgateException {
    private static final long serialVersionUID = 1L;

    InvalidRequest(Fault fault) {
      super(fault, null);
    }
  }

  /**
   * An unknown route, or a provider key the config does not have (404 {@code not_found}, {@code
   * unknown_provider}); the admin routes are 404 when the sidecar has no {@code admin_token}.
   */
  public static final class NotFound extends TollgateException {
    private static final long serialVersionUID = 1L;

    NotFound(Fault fault) {
      super(fault, null);
    }
  }

  /** The request's body did not reach the sidecar in time (408 {@code request_timeout}). */
  public static final class RequestTimeout extends TollgateException {
    private static final long serialVersionUID = 1L;

    RequestTimeout(Fault fault) {
      super(fault, null);
    }
  }

  /**
   * The sidecar's store fails under {@code fail_closed} (503 {@code store_unavailable}) or is at
   * its size bound (503 {@code store_full}), after the client's retries.
   */
  public static final class StoreUnavailable extends TollgateException {
    private static final long serialVersionUID = 1L;

    StoreUnavailable(Fault fault) {
      super(fault, null);
    }
  }

  /**
   * The sidecar is over its in-flight cap (429 {@code overloaded}), after the client's retries:
   * retry after {@link #retryAfterMs()}.
   */
  public static final class Overloaded extends TollgateException {
    private static final long serialVersionUID = 1L;

    Overloaded(Fault fault) {
      super(fault, null);
    }
  }

  /**
   * A 500 (a store fault that is not transient, such as a failing script), any other status the
   * client does not know, or a 200 whose body it cannot read ({@code bad_answer}).
   */
  public static final class ServerError extends TollgateException {
    private static final long serialVersionUID = 1L;

    ServerError(Fault fault, Throwable cause) {
      super(fault, cause);
    }
  }

  /**
   * No answer: the connection was refused or reset ({@code unreachable}), or no answer came within
   * the request's timeout ({@code timeout}). Whether the sidecar applied the request is unknown:
   * every operation but a provider permit, provider feedback and a budget top-up can be repeated
   * safely (a reserve with its request id).
   */
  public static final class SidecarUnreachable extends TollgateException {
    private static final long serialVersionUID = 1L;

    SidecarUnreachable(Fault fault, Throwable cause) {
      super(fault, cause);
    }
  }

  /**
   * The credentials function threw, or answered no token, for the operation's user ({@code
   * credentials}); nothing was sent.
   */
  public static final class CredentialsUnavailable extends TollgateException {
    private static final long serialVersionUID = 1L;

    CredentialsUnavailable(Fault fault, Throwable cause) {
      super(fault, cause);
    }
  }
}
