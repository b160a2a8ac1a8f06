package dev.tollgate.client;

import java.util.List;
import java.util.Objects;

/**
 * A user's state ({@code GET /admin/users/{user}}).
 *
 * @param user the user id
 * @param plan the user's effective plan
 * @param turnsAvailable whole turns in the turn bucket now
 * @param tokensAvailable whole tokens in the token bucket now (negative while in debt)
 * @param tokensLastMinute tokens charged over the last minute
 * @param leases the live run leases
 * @param budgets the plan's spend budgets now (empty: none)
 */
public record UserView(
    String user,
    String plan,
    long turnsAvailable,
    long tokensAvailable,
    long tokensLastMinute,
    List<LeaseView> leases,
    List<BudgetView> budgets) {
  /**
   * Checks and copies the components.
   *
   * @param user the user id
   * @param plan the user's effective plan
   * @param turnsAvailable whole turns in the turn bucket now
   * @param tokensAvailable whole tokens in the token bucket now (negative while in debt)
   * @param tokensLastMinute tokens charged over the last minute
   * @param leases the live run leases
   * @param budgets the plan's spend budgets now (empty: none)
   */
  public UserView {
    Objects.requireNonNull(user, "user");
    Objects.requireNonNull(plan, "plan");
    leases = List.copyOf(leases);
    budgets = List.copyOf(budgets);
  }
}
