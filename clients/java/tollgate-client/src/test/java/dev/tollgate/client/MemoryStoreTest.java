package dev.tollgate.client;

import dev.tollgate.client.testing.Sidecar;

/** {@link ClientContract} against a sidecar on the memory store. */
class MemoryStoreTest extends ClientContract {
  @Override
  protected Sidecar start() {
    return Sidecar.start("", LIMITS);
  }
}
