package dev.tollgate.adk;

import java.util.Map;
import java.util.Objects;
import java.util.Optional;

/**
 * A model provider's failed HTTP answer, for models of the caller's own to throw from {@code
 * generateContent}: {@link QuotaGatedLlm} reports it to the sidecar before the error propagates.
 */
public class ProviderHttpException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  private final transient ProviderAnswer answer;

  /**
   * The provider's answer.
   *
   * @param status the HTTP status
   * @param headers the provider's headers (e.g. {@code retry-after})
   * @param body the provider's body, or {@code null}
   */
  public ProviderHttpException(int status, Map<String, String> headers, String body) {
    super("the model provider answered HTTP " + status);
    this.answer = new ProviderAnswer(status, Objects.requireNonNull(headers, "headers"), Optional.ofNullable(body));
  }

  /**
   * The answer.
   *
   * @return the provider's status, headers and body
   */
  public ProviderAnswer answer() {
    return answer;
  }
}
