package dev.tollgate.adk;

import com.google.adk.models.BaseLlm;
import com.google.adk.models.BaseLlmConnection;
import com.google.adk.models.LlmRequest;
import com.google.adk.models.LlmResponse;
import io.reactivex.rxjava3.core.Flowable;
import java.util.Objects;
import java.util.Optional;

/**
 * Any ADK model ({@code Gemini} included) behind a provider key's fleet-wide quota: a permit before
 * each call, and a failed call's provider answer (429, 503, {@code Retry-After}, Gemini's {@code
 * retryDelay}) reported with the privileged credential before the error propagates.
 *
 * <pre>{@code
 * BaseLlm model = QuotaGatedLlm.wrap(new Gemini("gemini-2.5-flash", apiKey), gate);
 * LlmAgent agent = LlmAgent.builder().name("support").model(model).build();
 * }</pre>
 *
 * <p>A refused permit fails the call with {@link ProviderRefusedException}, the provider not
 * called; {@link TollgatePlugin} refunds the call's reservation and answers it with its plain
 * message. Live connections ({@link #connect}) are passed through ungated.
 */
public final class QuotaGatedLlm extends BaseLlm {
  private final BaseLlm inner;
  private final ProviderGate gate;
  private final Estimator estimator;

  private QuotaGatedLlm(BaseLlm inner, ProviderGate gate, Estimator estimator) {
    super(inner.model());
    this.inner = inner;
    this.gate = gate;
    this.estimator = estimator;
  }

  /**
   * Wraps {@code inner}; each call asks a permit for the request's size in tokens.
   *
   * @param inner the model
   * @param gate the provider key's gate
   * @return the gated model
   */
  public static QuotaGatedLlm wrap(BaseLlm inner, ProviderGate gate) {
    return new QuotaGatedLlm(
        Objects.requireNonNull(inner, "inner"), Objects.requireNonNull(gate, "gate"), Estimator.defaults());
  }

  /**
   * The wrapped model.
   *
   * @return the model
   */
  public BaseLlm inner() {
    return inner;
  }

  @Override
  public Flowable<LlmResponse> generateContent(LlmRequest request, boolean stream) {
    long tokens = estimator.requestTokens(request);
    return gate.permit(tokens)
        .flatMapPublisher(
            out -> {
              if (out.refused().isPresent()) {
                return Flowable.<LlmResponse>error(
                    new ProviderRefusedException(gate.provider(), gate.model(), out.refused().get()));
              }
              return inner
                  .generateContent(request, stream)
                  .onErrorResumeNext(
                      e -> {
                        Optional<ProviderAnswer> answer = ProviderAnswer.of(e);
                        return answer.isEmpty()
                            ? Flowable.<LlmResponse>error(e)
                            : gate.report(answer.get()).ignoreElement().andThen(Flowable.<LlmResponse>error(e));
                      });
            });
  }

  @Override
  public BaseLlmConnection connect(LlmRequest request) {
    return inner.connect(request);
  }
}
