package dev.tollgate.adk;

import dev.tollgate.client.Refusal;
import java.util.Objects;

/**
 * A model call the provider gate did not let through ({@link Refusal.ProviderLimited}, {@link
 * Refusal.ProviderExhausted}, ...): the provider was not called. {@link TollgatePlugin}'s {@code
 * onModelErrorCallback} refunds the call's reservation and answers it with {@link
 * Messages#stopped}, so the run ends with a plain message instead of an error.
 */
public final class ProviderRefusedException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  private final transient Refusal refusal;

  /**
   * The gate's refusal.
   *
   * @param provider the provider
   * @param model the model
   * @param refusal the sidecar's refusal of the permit
   */
  public ProviderRefusedException(String provider, String model, Refusal refusal) {
    super("tollgate refused a call to " + provider + ":" + model + ": " + refusal.error() + ": " + refusal.message());
    this.refusal = Objects.requireNonNull(refusal, "refusal");
  }

  /**
   * The sidecar's refusal.
   *
   * @return the refusal
   */
  public Refusal refusal() {
    return refusal;
  }
}
