package dev.tollgate.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.time.Duration;
import org.junit.jupiter.api.Test;

/** The delay rule of {@link RetryPolicy} and the path encoding, without a sidecar. */
class RetryPolicyTest {
  static final RetryPolicy P =
      new RetryPolicy(5, Duration.ofMillis(100), Duration.ofMillis(2_000), Duration.ofMillis(5_000));

  @Test
  void fullJitterUnderADoublingCeiling() {
    // The draw scales the ceiling: min(2 s, 100 ms * 2^n).
    assertEquals(0, P.delayMs(0, -1, 0.0));
    assertEquals(99, P.delayMs(0, -1, 0.999));
    assertEquals(200, P.delayMs(1, -1, 1.0));
    assertEquals(800, P.delayMs(3, -1, 1.0));
    assertEquals(2_000, P.delayMs(5, -1, 1.0), "capped at maxBackoff");
    assertEquals(2_000, P.delayMs(61, -1, 1.0), "no overflow for a large attempt");
    assertEquals(1_000, P.delayMs(40, -1, 0.5));
  }

  @Test
  void theHintRaisesTheDelayAndOneAboveTheMaximumIsRefused() {
    assertEquals(1_000, P.delayMs(0, 1_000, 0.5), "the hint, not the smaller draw");
    assertEquals(1_600, P.delayMs(4, 1_000, 1.0), "the draw, when longer than the hint");
    assertEquals(5_000, P.delayMs(0, 5_000, 0.0), "a hint at the maximum is waited out");
    assertEquals(-1, P.delayMs(0, 5_001, 0.0), "one above it is not");
  }

  @Test
  void policiesAreChecked() {
    assertThrows(IllegalArgumentException.class,
        () -> new RetryPolicy(-1, Duration.ZERO, Duration.ZERO, Duration.ZERO));
    assertThrows(IllegalArgumentException.class,
        () -> new RetryPolicy(1, Duration.ofMillis(-1), Duration.ZERO, Duration.ZERO));
    assertEquals(0, RetryPolicy.none().maxRetries());
    assertThrows(IllegalArgumentException.class, () -> TollgateClient.builder("ftp://x"));
    assertThrows(IllegalArgumentException.class,
        () -> TollgateClient.builder("http://127.0.0.1:1").maxConnections(0));
    assertThrows(IllegalArgumentException.class,
        () -> TollgateClient.builder("http://127.0.0.1:1").timeout(Duration.ZERO));
  }

  @Test
  void idsArePercentEncodedAsPathSegments() {
    assertEquals("run-1.a_b~c", Wire.encode("run-1.a_b~c"));
    assertEquals("a%2Fb%20c%3F%23%25", Wire.encode("a/b c?#%"));
    assertEquals("caf%C3%A9", Wire.encode("café"));
    assertEquals("%2E%2E", Wire.encode(".."));
    assertEquals("%2E", Wire.encode("."));
    assertEquals("...", Wire.encode("..."));
  }
}
