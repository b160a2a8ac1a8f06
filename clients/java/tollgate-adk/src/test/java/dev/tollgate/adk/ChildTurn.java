package dev.tollgate.adk;

import com.google.adk.runner.Runner;
import dev.tollgate.client.TollgateClient;
import dev.tollgate.client.testing.Tokens;
import io.reactivex.rxjava3.core.Flowable;
import io.reactivex.rxjava3.schedulers.Schedulers;

/**
 * A JVM running one turn that never ends (its model never answers), for the test that kills it:
 * {@code ChildTurn <sidecar url> <user> <session> <session ttl ms>}. Prints {@code RUNNING fence=N}
 * once the model was called, then waits to be killed.
 */
public final class ChildTurn {
  private ChildTurn() {}

  public static void main(String[] args) throws Exception {
    TollgateClient client = TollgateClient.builder(args[0]).credentials(Tokens::token).build();
    ScriptedLlm model = new ScriptedLlm((req, n) -> Flowable.never());
    Runner runner = Adk.runner(Adk.agent("helper", model), TollgatePlugin.builder(client).build());
    TurnExecutor executor =
        TurnExecutor.builder(runner, client).sessionTtlMs(Long.parseLong(args[3])).build();
    Adk.session(runner, args[1], args[2]);
    executor.runAsync(args[1], args[2], Adk.user("long")).subscribeOn(Schedulers.io()).subscribe();
    while (model.calls.get() == 0) {
      Thread.sleep(10);
    }
    System.out.println("RUNNING fence=" + executor.turn(args[2]).orElseThrow().fence());
    System.out.flush();
    Thread.sleep(Long.MAX_VALUE);
  }
}
