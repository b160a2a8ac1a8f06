package dev.tollgate.adk;

import dev.tollgate.client.testing.Sidecar;

/** {@link PluginContract} on the memory store. */
class MemoryPluginTest extends PluginContract {
  @Override
  protected Sidecar start() {
    return Sidecar.start("", OVERRIDES);
  }
}
