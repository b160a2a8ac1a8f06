package dev.tollgate.client;

import java.util.Objects;
import java.util.Optional;

/**
 * One spend budget of a user in its current window (docs/spec.md §6).
 *
 * @param window {@code daily}, {@code weekly} or {@code monthly}
 * @param unit {@code tokens}, or {@code micros} (micro-units of {@code currency})
 * @param currency the config's currency, for a {@code micros} budget
 * @param limit the plan's limit per window
 * @param granted top-ups for this window (its limit is {@code limit + granted})
 * @param spent spent in this window
 * @param resetsAtMs when the window ends, ms since the Unix epoch
 */
public record BudgetView(
    String window,
    String unit,
    Optional<String> currency,
    long limit,
    long granted,
    long spent,
    long resetsAtMs) {
  /**
   * Checks the components.
   *
   * @param window {@code daily}, {@code weekly} or {@code monthly}
   * @param unit {@code tokens}, or {@code micros} (micro-units of {@code currency})
   * @param currency the config's currency, for a {@code micros} budget
   * @param limit the plan's limit per window
   * @param granted top-ups for this window (its limit is {@code limit + granted})
   * @param spent spent in this window
   * @param resetsAtMs when the window ends, ms since the Unix epoch
   */
  public BudgetView {
    Objects.requireNonNull(window, "window");
    Objects.requireNonNull(unit, "unit");
    Objects.requireNonNull(currency, "currency");
  }
}
