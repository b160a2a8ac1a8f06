package dev.tollgate.benchmarks;

import java.util.Arrays;

/** Percentiles of latency samples, in microseconds. */
final class Stats {
  private Stats() {}

  static String summary(long[] nanos) {
    long[] s = nanos.clone();
    Arrays.sort(s);
    double mean = Arrays.stream(s).average().orElse(0) / 1_000.0;
    return String.format("n=%d mean=%.0f us p50=%.0f us p99=%.0f us max=%.0f us",
        s.length, mean, pct(s, 0.50), pct(s, 0.99), s[s.length - 1] / 1_000.0);
  }

  static double pct(long[] sorted, double p) {
    int i = (int) Math.ceil(p * sorted.length) - 1;
    return sorted[Math.max(0, Math.min(sorted.length - 1, i))] / 1_000.0;
  }
}
