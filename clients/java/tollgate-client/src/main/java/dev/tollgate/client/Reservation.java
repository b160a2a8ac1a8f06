package dev.tollgate.client;

import java.util.Objects;

/**
 * Tokens reserved for one model call.
 *
 * @param reservationId settle or refund the reservation with it
 * @param waitMs how long to wait before the call ({@code 0} when the sidecar already waited)
 * @param requestId the request id the reservation was made under: a reserve repeated with it
 *     answers this grant and charges nothing
 */
public record Reservation(String reservationId, long waitMs, String requestId) {
  /**
   * Checks the components.
   *
   * @param reservationId settle or refund the reservation with it
   * @param waitMs how long to wait before the call ({@code 0} when the sidecar already waited)
   * @param requestId the request id the reservation was made under: a reserve repeated with it answers this grant and charges nothing
   */
  public Reservation {
    Objects.requireNonNull(reservationId, "reservationId");
    Objects.requireNonNull(requestId, "requestId");
  }
}
