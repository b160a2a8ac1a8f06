package dev.tollgate.client;

import java.util.Objects;
import java.util.Optional;

/**
 * A token reservation for one model call ({@code POST /v1/tokens/reserve}), built with {@link
 * #of(String, long)} and the {@code with...} methods.
 *
 * <pre>{@code
 * Reserve r = Reserve.of("inv-1", turn.estimateTokens())
 *     .waiting(turn.maxWaitMs())
 *     .withModel("openai:gpt-4o");
 * }</pre>
 *
 * <p>The client always sends a request id (this one's, or a random one it makes), and a retry
 * reuses it: the sidecar answers a repeated request id with the first grant, so a retry never
 * charges twice. The id made is on the {@link Reservation}.
 *
 * @param invocationId the run the call belongs to
 * @param estimate the tokens to reserve, at least 1
 * @param serverWait whether the sidecar waits out the granted wait before answering
 * @param maxWaitMs with {@code wait}, how long the answer may take beyond the request's timeout
 *     (the plan's {@code max_wait_ms}, {@link Admitted#maxWaitMs()})
 * @param requestId the request id, if the caller chooses one
 * @param model the model called, {@code "provider:model"}, which prices the call for cost budgets
 * @param split the estimate's split by kind
 */
public record Reserve(
    String invocationId,
    long estimate,
    boolean serverWait,
    long maxWaitMs,
    Optional<String> requestId,
    Optional<String> model,
    TokenSplit split) {

  /**
   * Checks the components.
   *
   * @param invocationId the run the call belongs to
   * @param estimate the tokens to reserve, at least 1
   * @param serverWait whether the sidecar waits out the granted wait before answering
   * @param maxWaitMs with {@code wait}, how long the answer may take beyond the request's timeout (the plan's {@code max_wait_ms}, {@link Admitted#maxWaitMs()})
   * @param requestId the request id, if the caller chooses one
   * @param model the model called, {@code "provider:model"}, which prices the call for cost budgets
   * @param split the estimate's split by kind
   */
  public Reserve {
    Objects.requireNonNull(invocationId, "invocationId");
    Objects.requireNonNull(requestId, "requestId");
    Objects.requireNonNull(model, "model");
    Objects.requireNonNull(split, "split");
  }

  /**
   * A decide-only reservation: granted with the wait to sleep before the call, or refused.
   *
   * @param invocationId the run the call belongs to
   * @param estimate the tokens to reserve
   * @return the request
   */
  public static Reserve of(String invocationId, long estimate) {
    return new Reserve(
        invocationId, estimate, false, 0, Optional.empty(), Optional.empty(), TokenSplit.NONE);
  }

  /**
   * The sidecar waits out the granted wait before answering ({@code wait=true}); the request's
   * timeout grows by {@code maxWaitMs}. If the request is cancelled meanwhile, the sidecar
   * refunds the reservation.
   *
   * @param maxWaitMs the longest wait expected: the plan's {@link Admitted#maxWaitMs()}
   * @return the request with the wait
   */
  public Reserve waiting(long maxWaitMs) {
    return new Reserve(invocationId, estimate, true, maxWaitMs, requestId, model, split);
  }

  /**
   * The request id to send (a retry of the same reservation after a lost answer must reuse it).
   *
   * @param requestId the id, 1 to 512 characters
   * @return the request with the id
   */
  public Reserve withRequestId(String requestId) {
    return new Reserve(
        invocationId, estimate, serverWait, maxWaitMs, Optional.of(requestId), model, split);
  }

  /**
   * The model called, which prices the call for cost budgets.
   *
   * @param model {@code "provider:model"}
   * @return the request with the model
   */
  public Reserve withModel(String model) {
    return new Reserve(
        invocationId, estimate, serverWait, maxWaitMs, requestId, Optional.of(model), split);
  }

  /**
   * The estimate's split by kind, which prices the call for cost budgets.
   *
   * @param split the split
   * @return the request with the split
   */
  public Reserve withSplit(TokenSplit split) {
    return new Reserve(invocationId, estimate, serverWait, maxWaitMs, requestId, model, split);
  }
}
