package dev.tollgate.client;

import java.util.List;
import java.util.OptionalLong;
import java.util.concurrent.CompletableFuture;

/**
 * The sidecar's admin routes ({@code /admin/*}, docs/spec.md §8), sent to the admin URL with the
 * admin token ({@link TollgateClient.Builder#adminToken(String)}). Without a token, or with a wrong
 * one, they fail with {@link TollgateException.Unauthorized}; a sidecar with no {@code admin_token}
 * configured answers them {@link TollgateException.NotFound}. Made by {@link
 * TollgateClient#admin()}.
 */
public final class AdminClient {
  private final Transport transport;

  AdminClient(Transport transport) {
    this.transport = transport;
  }

  /**
   * The same operations, each waiting for its answer and throwing its fault.
   *
   * @return the blocking view
   */
  public Blocking blocking() {
    return new Blocking(this);
  }

  private <R> CompletableFuture<R> send(Call<R> call) {
    return transport.send(call, null, false);
  }

  /**
   * A user's state: plan, buckets, leases and budgets.
   *
   * @param user the user id
   * @return the view
   */
  public CompletableFuture<UserView> user(String user) {
    return send(Ops.adminUser(user));
  }

  /**
   * The users with the most tokens charged over the last minute (the sidecar's default: 10).
   *
   * @return the top users, busiest first
   */
  public CompletableFuture<List<TopUser>> top() {
    return send(Ops.adminTop(OptionalLong.empty()));
  }

  /**
   * The {@code n} users with the most tokens charged over the last minute.
   *
   * @param n how many, 1 to 1,000
   * @return the top users, busiest first
   */
  public CompletableFuture<List<TopUser>> top(int n) {
    return send(Ops.adminTop(OptionalLong.of(n)));
  }

  /**
   * Fills a user's turn and token buckets again; leases and reservations stay.
   *
   * @param user the user id
   * @return whether the user was reset
   */
  public CompletableFuture<Boolean> resetUser(String user) {
    return send(Ops.adminReset(user));
  }

  /**
   * Force-releases one of a user's run leases.
   *
   * @param user the user id
   * @param invocationId the run
   * @return whether a lease was released
   */
  public CompletableFuture<Released> releaseLease(String user, String invocationId) {
    return send(Ops.adminReleaseLease(user, invocationId));
  }

  /**
   * Starts a user's current window of a budget afresh (logged by the sidecar).
   *
   * @param user the user id
   * @param window {@code daily}, {@code weekly} or {@code monthly}; a window the plan has no
   *     budget for is {@link TollgateException.InvalidRequest} (field {@code window})
   * @return the user's budgets after it
   */
  public CompletableFuture<List<BudgetView>> resetBudget(String user, String window) {
    return send(Ops.adminBudgetReset(user, window));
  }

  /**
   * Raises a token budget's current window by {@code tokens} until it ends (logged), under a new
   * request id: see {@link #topUpTokens(String, String, long, String)}.
   *
   * @param user the user id
   * @param window {@code daily}, {@code weekly} or {@code monthly}
   * @param tokens the tokens to grant, 1 to 2^53
   * @return the user's budgets after it
   */
  public CompletableFuture<List<BudgetView>> topUpTokens(String user, String window, long tokens) {
    return topUpTokens(user, window, tokens, null);
  }

  /**
   * Raises a token budget's current window by {@code tokens} until it ends (logged). The sidecar
   * grants one request id once within a day, so a 503 is retried with it; a caller that may have to
   * repeat a top-up whose answer was lost gives its own id and repeats the call with it.
   *
   * @param user the user id
   * @param window {@code daily}, {@code weekly} or {@code monthly}
   * @param tokens the tokens to grant, 1 to 2^53
   * @param requestId the top-up's id; null: a new UUID
   * @return the user's budgets after it
   */
  public CompletableFuture<List<BudgetView>> topUpTokens(
      String user, String window, long tokens, String requestId) {
    return send(Ops.adminBudgetTopUp(user, window, Ops.tokens(tokens), requestId));
  }

  /**
   * Raises a cost budget's current window by {@code cost} of the config's currency until it ends
   * (logged), under a new request id: see {@link #topUpCost(String, String, String, String)}.
   *
   * @param user the user id
   * @param window {@code daily}, {@code weekly} or {@code monthly}
   * @param cost a decimal amount, e.g. {@code "5.00"}
   * @return the user's budgets after it
   */
  public CompletableFuture<List<BudgetView>> topUpCost(String user, String window, String cost) {
    return topUpCost(user, window, cost, null);
  }

  /**
   * Raises a cost budget's current window by {@code cost} of the config's currency until it ends
   * (logged), granted once per request id within a day (see {@link #topUpTokens(String, String,
   * long, String)}).
   *
   * @param user the user id
   * @param window {@code daily}, {@code weekly} or {@code monthly}
   * @param cost a decimal amount, e.g. {@code "5.00"}
   * @param requestId the top-up's id; null: a new UUID
   * @return the user's budgets after it
   */
  public CompletableFuture<List<BudgetView>> topUpCost(
      String user, String window, String cost, String requestId) {
    return send(Ops.adminBudgetTopUp(user, window, Ops.cost(cost), requestId));
  }

  /**
   * Reloads the sidecar's config file. Never retried.
   *
   * @return what was applied; a config the sidecar refuses fails with {@link
   *     TollgateException.InvalidRequest} ({@code invalid_config}) and the old one keeps serving
   */
  public CompletableFuture<Reloaded> reload() {
    return send(Ops.adminReload());
  }

  /**
   * Every configured provider key's state, by provider then model.
   *
   * @return the views
   */
  public CompletableFuture<List<ProviderView>> providers() {
    return send(Ops.adminProviders());
  }

  /**
   * One provider key's state.
   *
   * @param provider the provider
   * @param model the model
   * @return the view; a key not configured fails with {@link TollgateException.NotFound}
   */
  public CompletableFuture<ProviderView> provider(String provider, String model) {
    return send(Ops.adminProvider(provider, model));
  }

  /**
   * Clears a provider key's cooldown, AIMD rate and this replica's exhaustion hold.
   *
   * @param provider the provider
   * @param model the model
   * @return what was cleared; a store that cannot clear fails with {@link
   *     TollgateException.StoreUnavailable} and nothing is cleared
   */
  public CompletableFuture<ProviderCleared> clearProvider(String provider, String model) {
    return send(Ops.adminClearProvider(provider, model));
  }

  /** {@link AdminClient}'s operations, each waiting for its answer and throwing its fault. */
  public static final class Blocking {
    private final AdminClient async;

    Blocking(AdminClient async) {
      this.async = async;
    }

    /**
     * See {@link AdminClient#user(String)}.
     *
     * @param user the user id
     * @return the view
     */
    public UserView user(String user) {
      return Await.result(async.user(user));
    }

    /**
     * See {@link AdminClient#top()}.
     *
     * @return the top users
     */
    public List<TopUser> top() {
      return Await.result(async.top());
    }

    /**
     * See {@link AdminClient#top(int)}.
     *
     * @param n how many
     * @return the top users
     */
    public List<TopUser> top(int n) {
      return Await.result(async.top(n));
    }

    /**
     * See {@link AdminClient#resetUser(String)}.
     *
     * @param user the user id
     * @return whether the user was reset
     */
    public boolean resetUser(String user) {
      return Await.result(async.resetUser(user));
    }

    /**
     * See {@link AdminClient#releaseLease(String, String)}.
     *
     * @param user the user id
     * @param invocationId the run
     * @return whether a lease was released
     */
    public Released releaseLease(String user, String invocationId) {
      return Await.result(async.releaseLease(user, invocationId));
    }

    /**
     * See {@link AdminClient#resetBudget(String, String)}.
     *
     * @param user the user id
     * @param window the window
     * @return the user's budgets after it
     */
    public List<BudgetView> resetBudget(String user, String window) {
      return Await.result(async.resetBudget(user, window));
    }

    /**
     * See {@link AdminClient#topUpTokens(String, String, long)}.
     *
     * @param user the user id
     * @param window the window
     * @param tokens the tokens to grant
     * @return the user's budgets after it
     */
    public List<BudgetView> topUpTokens(String user, String window, long tokens) {
      return Await.result(async.topUpTokens(user, window, tokens));
    }

    /**
     * See {@link AdminClient#topUpCost(String, String, String)}.
     *
     * @param user the user id
     * @param window the window
     * @param cost a decimal amount
     * @return the user's budgets after it
     */
    public List<BudgetView> topUpCost(String user, String window, String cost) {
      return Await.result(async.topUpCost(user, window, cost));
    }

    /**
     * See {@link AdminClient#topUpTokens(String, String, long, String)}.
     *
     * @param user the user id
     * @param window the window
     * @param tokens the tokens to grant
     * @param requestId the top-up's id; null: a new UUID
     * @return the user's budgets after it
     */
    public List<BudgetView> topUpTokens(String user, String window, long tokens, String requestId) {
      return Await.result(async.topUpTokens(user, window, tokens, requestId));
    }

    /**
     * See {@link AdminClient#topUpCost(String, String, String, String)}.
     *
     * @param user the user id
     * @param window the window
     * @param cost a decimal amount
     * @param requestId the top-up's id; null: a new UUID
     * @return the user's budgets after it
     */
    public List<BudgetView> topUpCost(String user, String window, String cost, String requestId) {
      return Await.result(async.topUpCost(user, window, cost, requestId));
    }

    /**
     * See {@link AdminClient#reload()}.
     *
     * @return what was applied
     */
    public Reloaded reload() {
      return Await.result(async.reload());
    }

    /**
     * See {@link AdminClient#providers()}.
     *
     * @return the views
     */
    public List<ProviderView> providers() {
      return Await.result(async.providers());
    }

    /**
     * See {@link AdminClient#provider(String, String)}.
     *
     * @param provider the provider
     * @param model the model
     * @return the view
     */
    public ProviderView provider(String provider, String model) {
      return Await.result(async.provider(provider, model));
    }

    /**
     * See {@link AdminClient#clearProvider(String, String)}.
     *
     * @param provider the provider
     * @param model the model
     * @return what was cleared
     */
    public ProviderCleared clearProvider(String provider, String model) {
      return Await.result(async.clearProvider(provider, model));
    }
  }
}
