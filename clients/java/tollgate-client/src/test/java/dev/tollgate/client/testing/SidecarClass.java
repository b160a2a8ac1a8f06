package dev.tollgate.client.testing;

import dev.tollgate.client.TollgateClient;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.TestInstance;

/** A test class sharing one real sidecar (which {@link #start()} makes) and its client. */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
public abstract class SidecarClass {
  /** This class's sidecar. */
  protected Sidecar sidecar;
  /** A client of it: per-user tokens and the admin token. */
  protected TollgateClient client;

  /** Starts this class's sidecar. */
  protected abstract Sidecar start();

  @BeforeAll
  void up() {
    sidecar = start();
    client = sidecar.client();
  }

  @AfterAll
  void down() {
    if (sidecar != null) {
      sidecar.close();
    }
  }
}
