package dev.tollgate.client;

import java.util.Objects;
import java.util.OptionalLong;

/**
 * A model call's tokens split by kind, which prices the call for the plan's cost budgets
 * (docs/spec.md §6). The token rate and token budgets count the total ({@code estimate} of a
 * reserve, {@code actual} of a settle), not the split.
 *
 * @param inputTokens prompt tokens, if known
 * @param outputTokens output tokens, if known
 * @param cachedInputTokens prompt tokens read from the provider's cache, if known
 */
public record TokenSplit(
    OptionalLong inputTokens, OptionalLong outputTokens, OptionalLong cachedInputTokens) {

  /** No split: the call is priced at the higher of the model's input and output prices. */
  public static final TokenSplit NONE =
      new TokenSplit(OptionalLong.empty(), OptionalLong.empty(), OptionalLong.empty());

  /**
   * Checks the components.
   *
   * @param inputTokens prompt tokens, if known
   * @param outputTokens output tokens, if known
   * @param cachedInputTokens prompt tokens read from the provider's cache, if known
   */
  public TokenSplit {
    Objects.requireNonNull(inputTokens, "inputTokens");
    Objects.requireNonNull(outputTokens, "outputTokens");
    Objects.requireNonNull(cachedInputTokens, "cachedInputTokens");
  }

  /**
   * Input and output tokens.
   *
   * @param inputTokens prompt tokens
   * @param outputTokens output tokens
   * @return the split
   */
  public static TokenSplit of(long inputTokens, long outputTokens) {
    return new TokenSplit(OptionalLong.of(inputTokens), OptionalLong.of(outputTokens), OptionalLong.empty());
  }

  /**
   * Input, output and cached input tokens.
   *
   * @param inputTokens prompt tokens
   * @param outputTokens output tokens
   * @param cachedInputTokens prompt tokens read from the provider's cache
   * @return the split
   */
  public static TokenSplit of(long inputTokens, long outputTokens, long cachedInputTokens) {
    return new TokenSplit(
        OptionalLong.of(inputTokens), OptionalLong.of(outputTokens), OptionalLong.of(cachedInputTokens));
  }
}
