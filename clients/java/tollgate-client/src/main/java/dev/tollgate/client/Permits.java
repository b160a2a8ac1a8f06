package dev.tollgate.client;

import java.util.ArrayDeque;
import java.util.concurrent.CompletableFuture;

/**
 * An asynchronous semaphore bounding the requests in flight, and so the connections open: the
 * JDK's HTTP/1.1 client opens one connection per concurrent request and keeps idle ones, so at most
 * {@code max} requests at once means at most {@code max} connections. A request waiting for a
 * permit holds no thread; a waiter that gave up (its future completed by a timeout or a
 * cancellation) is skipped when a permit frees.
 */
final class Permits {
  private final int max;
  private int used;
  private final ArrayDeque<CompletableFuture<Void>> waiters = new ArrayDeque<>();

  Permits(int max) {
    this.max = max;
  }

  /** A future completed when the caller holds a permit; {@link #release()} gives it back. */
  CompletableFuture<Void> acquire() {
    synchronized (this) {
      if (used < max) {
        used++;
        return CompletableFuture.completedFuture(null);
      }
      CompletableFuture<Void> w = new CompletableFuture<>();
      waiters.add(w);
      return w;
    }
  }

  /** Gives a permit back: to the oldest live waiter, else to the pool. */
  void release() {
    while (true) {
      CompletableFuture<Void> next;
      synchronized (this) {
        next = waiters.poll();
        if (next == null) {
          used--;
          return;
        }
      }
      // Completed outside the lock: the waiter's continuation may run here.
      if (next.complete(null)) {
        return;
      }
    }
  }

  /** Forgets a waiter that gave up, so the queue holds only live ones. */
  void forget(CompletableFuture<Void> waiter) {
    synchronized (this) {
      waiters.remove(waiter);
    }
  }
}
