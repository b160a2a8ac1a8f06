package dev.tollgate.adk;

import com.google.adk.models.LlmRequest;
import com.google.genai.types.Content;
import com.google.genai.types.GenerateContentConfig;
import com.google.genai.types.Part;
import java.util.concurrent.ConcurrentHashMap;

/**
 * What a model call reserves: the larger of the request's size in tokens (its text, function calls
 * and responses and system instruction over {@code charsPerToken}, plus the requested {@code
 * maxOutputTokens}) and an exponential moving average of the agent's past calls, seeded by the
 * plan's {@code estimate_tokens}. Safe to share between threads.
 */
public final class Estimator {
  private final double alpha;
  private final double charsPerToken;
  private final ConcurrentHashMap<String, Double> averages = new ConcurrentHashMap<>();

  /**
   * An estimator.
   *
   * @param alpha the newest call's weight in the average, in (0, 1]
   * @param charsPerToken characters per token for the request's size, positive
   */
  public Estimator(double alpha, double charsPerToken) {
    if (!(alpha > 0 && alpha <= 1)) {
      throw new IllegalArgumentException("alpha must be in (0, 1], got " + alpha);
    }
    if (!(charsPerToken > 0)) {
      throw new IllegalArgumentException("charsPerToken must be positive, got " + charsPerToken);
    }
    this.alpha = alpha;
    this.charsPerToken = charsPerToken;
  }

  /**
   * The default: alpha 0.3, 4 characters per token.
   *
   * @return a new estimator
   */
  public static Estimator defaults() {
    return new Estimator(0.3, 4.0);
  }

  /**
   * The tokens to reserve for {@code agent}'s call {@code request}.
   *
   * @param agent the agent's name
   * @param request the model request
   * @param seed the plan's {@code estimate_tokens}, the average before any call
   * @return at least 1
   */
  public long estimate(String agent, LlmRequest request, long seed) {
    double avg = averages.getOrDefault(agent, (double) seed);
    return Math.max(1, Math.max(requestTokens(request), (long) Math.ceil(avg)));
  }

  /**
   * Feeds a call's actual tokens into {@code agent}'s average.
   *
   * @param agent the agent's name
   * @param actual the tokens the call used
   * @param seed the plan's {@code estimate_tokens}
   */
  public void observe(String agent, long actual, long seed) {
    averages.compute(agent, (k, v) -> (1 - alpha) * (v == null ? seed : v) + alpha * actual);
  }

  /**
   * A rough size of a model request in tokens.
   *
   * @param request the request
   * @return its text over {@code charsPerToken}, plus the requested output tokens
   */
  public long requestTokens(LlmRequest request) {
    long chars = 0;
    for (Content c : request.contents()) {
      chars += chars(c);
    }
    long out = 0;
    if (request.config().isPresent()) {
      GenerateContentConfig cfg = request.config().get();
      if (cfg.systemInstruction().isPresent()) {
        chars += chars(cfg.systemInstruction().get());
      }
      out = cfg.maxOutputTokens().orElse(0);
    }
    return (long) (chars / charsPerToken) + out;
  }

  private static long chars(Content c) {
    long n = 0;
    for (Part p : c.parts().orElse(java.util.List.of())) {
      n += p.text().map(String::length).orElse(0);
      if (p.functionCall().isPresent()) {
        n += p.functionCall().get().name().map(String::length).orElse(0);
        n += p.functionCall().get().args().map(a -> a.toString().length()).orElse(0);
      }
      if (p.functionResponse().isPresent()) {
        n += p.functionResponse().get().response().map(r -> r.toString().length()).orElse(0);
      }
    }
    return n;
  }
}
