package dev.tollgate.adk;

import dev.tollgate.client.Refusal;
import java.util.OptionalLong;

/**
 * The plain messages a turn stopped by tollgate answers with, written for the end user: which limit
 * and when to retry. They are the same words as the Python plugin's.
 */
public final class Messages {
  private Messages() {}

  /** What a fail-closed plugin answers when the sidecar cannot decide. */
  public static final String UNAVAILABLE =
      "This request was not started: the usage-limit service is unavailable. Please retry shortly.";

  /**
   * What a refused turn answers: which limit, and when to retry.
   *
   * @param refusal the sidecar's refusal of the admission
   * @return e.g. "This request was not started: you have sent too many requests recently (limit:
   *     turn_rate). Please retry in 3 s."
   */
  public static String denied(Refusal refusal) {
    String what;
    if (refusal instanceof Refusal.TurnRateLimited) {
      what = "you have sent too many requests recently";
    } else if (refusal instanceof Refusal.ConcurrencyLimited) {
      what = "too many of your requests are already running";
    } else if (refusal instanceof Refusal.SessionsLimited) {
      what = "you have too many open conversations";
    } else if (refusal instanceof Refusal.SessionBusy) {
      what = "this conversation is already busy with another request";
    } else {
      what = "a usage limit was reached (" + refusal.error() + ")";
    }
    return "This request was not started: " + what + " (limit: " + limit(refusal) + "). Please retry "
        + when(refusal.retryAfterMs()) + ".";
  }

  /**
   * What a turn stopped before a model call answers with.
   *
   * @param refusal the sidecar's refusal of the reservation or permit
   * @return e.g. "The work stopped early: your token budget is spent for now (limit: token_rate).
   *     Please retry in 4 s."
   */
  public static String stopped(Refusal refusal) {
    String what;
    String then;
    if (refusal instanceof Refusal.MaxLlmCalls) {
      what = "this request reached its limit of model calls";
      then = "Please start a new request.";
    } else if (refusal instanceof Refusal.TokenRateLimited) {
      what = "your token budget is spent for now";
      then = "Please retry " + when(refusal.retryAfterMs()) + ".";
    } else if (refusal instanceof Refusal.ProviderLimited) {
      what = "the model provider's shared capacity is in use";
      then = "Please retry " + when(refusal.retryAfterMs()) + ".";
    } else if (refusal instanceof Refusal.ProviderExhausted) {
      what = "the model provider's quota is exhausted";
      then = "Please retry " + when(refusal.retryAfterMs()) + ".";
    } else {
      what = "a usage limit was reached (" + refusal.error() + ")";
      then =
          refusal.retryAfterMs().isPresent()
              ? "Please retry " + when(refusal.retryAfterMs()) + "."
              : "It cannot be retried as it is.";
    }
    return "The work stopped early: " + what + " (limit: " + limit(refusal) + "). " + then;
  }

  private static String limit(Refusal r) {
    return r.limit().orElse(r.error());
  }

  private static String when(OptionalLong ms) {
    if (ms.isEmpty()) {
      return "later";
    }
    return "in " + Math.max(1, (ms.getAsLong() + 999) / 1000) + " s";
  }
}
