package dev.tollgate.client;

import java.util.Objects;
import java.util.Optional;
import java.util.OptionalLong;

/**
 * A request for a permit to call a model provider ({@code POST
 * /v1/providers/{provider}/permits}), built with {@link #of(String, long)} and the {@code
 * with...} methods.
 *
 * @param model the provider's model (the key is {@code provider:model} of the config)
 * @param tokens the call's tokens, counted against the key's token rate
 * @param tenant the caller's tenant, when the sidecar does not take it from the credential
 * @param inputTokens input tokens (default: {@code tokens}), for a key limiting them apart
 * @param outputTokens output tokens (default: 0)
 * @param maxWaitMs what is left of the call's deadline: the wait must fit it
 * @param serverWait whether the sidecar waits out the wait before answering (policy {@code block})
 */
public record Permit(
    String model,
    long tokens,
    Optional<String> tenant,
    OptionalLong inputTokens,
    OptionalLong outputTokens,
    OptionalLong maxWaitMs,
    boolean serverWait) {

  /**
   * Checks the components.
   *
   * @param model the provider's model (the key is {@code provider:model} of the config)
   * @param tokens the call's tokens, counted against the key's token rate
   * @param tenant the caller's tenant, when the sidecar does not take it from the credential
   * @param inputTokens input tokens (default: {@code tokens}), for a key limiting them apart
   * @param outputTokens output tokens (default: 0)
   * @param maxWaitMs what is left of the call's deadline: the wait must fit it
   * @param serverWait whether the sidecar waits out the wait before answering (policy {@code block})
   */
  public Permit {
    Objects.requireNonNull(model, "model");
    Objects.requireNonNull(tenant, "tenant");
    Objects.requireNonNull(inputTokens, "inputTokens");
    Objects.requireNonNull(outputTokens, "outputTokens");
    Objects.requireNonNull(maxWaitMs, "maxWaitMs");
  }

  /**
   * A permit for {@code tokens} tokens of {@code model}, answered at once with the wait to
   * sleep.
   *
   * @param model the provider's model
   * @param tokens the call's tokens
   * @return the request
   */
  public static Permit of(String model, long tokens) {
    return new Permit(
        model,
        tokens,
        Optional.empty(),
        OptionalLong.empty(),
        OptionalLong.empty(),
        OptionalLong.empty(),
        false);
  }

  /**
   * The caller's tenant.
   *
   * @param tenant the tenant id
   * @return the request with the tenant
   */
  public Permit withTenant(String tenant) {
    return new Permit(
        model, tokens, Optional.of(tenant), inputTokens, outputTokens, maxWaitMs, serverWait);
  }

  /**
   * Input and output tokens apart.
   *
   * @param inputTokens input tokens
   * @param outputTokens output tokens
   * @return the request with the split
   */
  public Permit withSplit(long inputTokens, long outputTokens) {
    return new Permit(
        model,
        tokens,
        tenant,
        OptionalLong.of(inputTokens),
        OptionalLong.of(outputTokens),
        maxWaitMs,
        serverWait);
  }

  /**
   * What is left of the call's deadline: a wait past it is refused.
   *
   * @param maxWaitMs milliseconds
   * @return the request with the deadline
   */
  public Permit withMaxWaitMs(long maxWaitMs) {
    return new Permit(
        model, tokens, tenant, inputTokens, outputTokens, OptionalLong.of(maxWaitMs), serverWait);
  }

  /**
   * The sidecar waits out the wait before answering; the request's timeout grows by {@link
   * #maxWaitMs()} (60 s when none is set). A permit taken is not given back if the request is
   * cancelled.
   *
   * @return the request with the wait
   */
  public Permit waiting() {
    return new Permit(model, tokens, tenant, inputTokens, outputTokens, maxWaitMs, true);
  }
}
