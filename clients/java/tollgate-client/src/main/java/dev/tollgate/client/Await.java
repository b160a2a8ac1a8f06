package dev.tollgate.client;

import java.util.concurrent.CancellationException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;

/** Waits for an operation's future for the blocking calls, rethrowing its fault as it is. */
final class Await {
  private Await() {}

  static <T> T result(CompletableFuture<T> f) {
    try {
      return f.get();
    } catch (InterruptedException e) {
      // Cancelling aborts the exchange: a wait=true reservation is refunded by the sidecar.
      f.cancel(true);
      Thread.currentThread().interrupt();
      CancellationException c = new CancellationException("interrupted while waiting for tollgate");
      c.initCause(e);
      throw c;
    } catch (ExecutionException e) {
      Throwable cause = e.getCause();
      if (cause instanceof RuntimeException r) {
        throw r;
      }
      if (cause instanceof Error err) {
        throw err;
      }
      throw new IllegalStateException(cause);
    }
  }
}
