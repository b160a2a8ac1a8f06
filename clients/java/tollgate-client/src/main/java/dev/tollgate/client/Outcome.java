package dev.tollgate.client;

import java.util.Objects;
import java.util.Optional;
import java.util.function.Function;

/**
 * What an operation that a limit may refuse answers: its result ({@link Granted}) or the sidecar's
 * {@link Refusal} ({@link Refused}). Faults are not outcomes: they fail the future with a {@link
 * TollgateException}.
 *
 * <pre>{@code
 * Outcome<Admitted> out = alice.admitRun("inv-1").join();
 * if (out instanceof Outcome.Refused<Admitted> r) {
 *     System.out.println(r.refusal().message());
 *     return;
 * }
 * Admitted turn = out.granted().orElseThrow();
 * }</pre>
 *
 * @param <T> the result's type
 */
public sealed interface Outcome<T> permits Outcome.Granted, Outcome.Refused {

  /**
   * The operation succeeded.
   *
   * @param value its result
   * @param <T> the result's type
   */
  record Granted<T>(T value) implements Outcome<T> {
    /**
     * Checks the value.
     *
     * @param value its result
     */
    public Granted {
      Objects.requireNonNull(value, "value");
    }
  }

  /**
   * A limit refused the operation.
   *
   * @param refusal the sidecar's decision
   * @param <T> the type the result would have had
   */
  record Refused<T>(Refusal refusal) implements Outcome<T> {
    /**
     * Checks the refusal.
     *
     * @param refusal the sidecar's decision
     */
    public Refused {
      Objects.requireNonNull(refusal, "refusal");
    }
  }

  /**
   * Whether the operation succeeded.
   *
   * @return {@code true} for {@link Granted}
   */
  default boolean isGranted() {
    return this instanceof Granted;
  }

  /**
   * The result, if the operation succeeded.
   *
   * @return the result, or empty when refused
   */
  default Optional<T> granted() {
    return this instanceof Granted<T> g ? Optional.of(g.value()) : Optional.empty();
  }

  /**
   * The refusal, if a limit refused the operation.
   *
   * @return the refusal, or empty when granted
   */
  default Optional<Refusal> refused() {
    return this instanceof Refused<T> r ? Optional.of(r.refusal()) : Optional.empty();
  }

  /**
   * The result, or an exception made from the refusal.
   *
   * @param exception makes the exception thrown when refused
   * @param <X> the exception's type
   * @return the result
   * @throws X when refused
   */
  default <X extends Throwable> T orElseThrow(Function<? super Refusal, ? extends X> exception)
      throws X {
    if (this instanceof Granted<T> g) {
      return g.value();
    }
    throw exception.apply(((Refused<T>) this).refusal());
  }

  /**
   * The outcome with its result mapped; a refusal stays as it is.
   *
   * @param f maps the result
   * @param <U> the mapped type
   * @return the mapped outcome
   */
  default <U> Outcome<U> map(Function<? super T, ? extends U> f) {
    if (this instanceof Granted<T> g) {
      return new Granted<>(f.apply(g.value()));
    }
    return new Refused<>(((Refused<T>) this).refusal());
  }
}
