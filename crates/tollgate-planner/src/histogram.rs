//! A fixed-size log-linear histogram of milliseconds (HDR-like): buckets
//! exact below 128 and 1/64 (1.6 %) wide above, at most 3,776 of them
//! whatever the number of values. Each bucket also keeps the largest value
//! it counted, so a percentile is reported as a value that was seen: exact
//! when the bucket's values are equal (retry hints usually are), never more
//! than 1.6 % above the true nearest-rank value otherwise.

use serde::Serialize;

/// Values below this are counted exactly.
const LINEAR: u64 = 128;
/// Buckets per power of two above [`LINEAR`].
const PER_OCTAVE: u64 = 64;

/// A histogram of `u64` values in constant memory.
#[derive(Debug, Clone, Default)]
pub(crate) struct LogHistogram {
    counts: Vec<u64>,
    /// The largest value counted in each bucket.
    highs: Vec<u64>,
    n: u64,
    sum: u128,
    min: u64,
    max: u64,
}

fn index(v: u64) -> usize {
    if v < LINEAR {
        return v as usize;
    }
    let e = 63 - u64::from(v.leading_zeros()); // floor(log2 v) >= 7
    let shift = e - 6;
    let mantissa = v >> shift; // 64..=127
    (LINEAR + (shift - 1) * PER_OCTAVE + (mantissa - PER_OCTAVE)) as usize
}

/// The largest value bucket `i` can count.
#[cfg(test)]
fn upper(i: usize) -> u64 {
    let i = i as u64;
    if i < LINEAR {
        return i;
    }
    let j = i - LINEAR;
    let shift = j / PER_OCTAVE + 1;
    let mantissa = j % PER_OCTAVE + PER_OCTAVE;
    ((mantissa + 1) << shift).wrapping_sub(1)
}

impl LogHistogram {
    /// Counts `v`.
    pub(crate) fn record(&mut self, v: u64) {
        let i = index(v);
        if self.counts.len() <= i {
            self.counts.resize(i + 1, 0);
            self.highs.resize(i + 1, 0);
        }
        self.counts[i] += 1;
        self.highs[i] = self.highs[i].max(v);
        if self.n == 0 || v < self.min {
            self.min = v;
        }
        self.max = self.max.max(v);
        self.n += 1;
        self.sum += u128::from(v);
    }

    /// The nearest-rank `permille`/1000 quantile: the first bucket that
    /// brings the count to the rank ⌈n × permille / 1000⌉, reported as the
    /// largest value it counted (within 1.6 % above the exact answer).
    pub(crate) fn quantile(&self, permille: u64) -> Option<u64> {
        if self.n == 0 {
            return None;
        }
        let rank = (u128::from(self.n) * u128::from(permille))
            .div_ceil(1_000)
            .max(1);
        let mut seen = 0u128;
        for (i, c) in self.counts.iter().enumerate() {
            seen += u128::from(*c);
            if seen >= rank {
                return Some(self.highs[i]);
            }
        }
        Some(self.max)
    }

    /// Count, mean and quantiles; `None` when empty.
    pub(crate) fn summary(&self) -> Option<Summary> {
        Some(Summary {
            count: self.n,
            min: self.min,
            p50: self.quantile(500)?,
            p90: self.quantile(900)?,
            p95: self.quantile(950)?,
            p99: self.quantile(990)?,
            max: self.max,
            mean: (self.sum / u128::from(self.n)) as u64,
        })
    }
}

/// Count, mean and nearest-rank percentiles of some milliseconds, from a
/// log-linear histogram in fixed memory: each percentile is a value that
/// was seen, exact below 128 ms or when its bucket's values are equal,
/// otherwise at most 1.6 % above the exact nearest-rank value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Summary {
    /// How many values.
    pub count: u64,
    /// The smallest, exact.
    pub min: u64,
    /// The median.
    pub p50: u64,
    /// The 90th percentile.
    pub p90: u64,
    /// The 95th percentile.
    pub p95: u64,
    /// The 99th percentile.
    pub p99: u64,
    /// The largest, exact.
    pub max: u64,
    /// The mean, rounded down, exact.
    pub mean: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_tile_the_line() {
        assert_eq!(index(127), 127);
        assert_eq!(index(128), 128);
        assert_eq!(upper(128), 129);
        let mut prev = 0;
        for v in (0..5_000_000u64).step_by(7).chain([u64::MAX - 1, u64::MAX]) {
            let i = index(v);
            assert!(i >= prev, "{v}");
            prev = i;
            assert!(upper(i) >= v, "{v}");
            assert!(
                upper(i) - v <= v / 64,
                "{v}: bucket {i} ends at {}",
                upper(i)
            );
        }
        assert_eq!(index(u64::MAX), 3_775);
        assert_eq!(upper(3_775), u64::MAX);
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let mut h = LogHistogram::default();
        assert!(h.summary().is_none());
        for v in 1..=100 {
            h.record(v);
        }
        let s = h.summary().unwrap();
        assert_eq!(
            (s.min, s.p50, s.p95, s.p99, s.max, s.mean),
            (1, 50, 95, 99, 100, 50)
        );
        let mut h = LogHistogram::default();
        for _ in 0..3 {
            h.record(6_000);
        }
        h.record(0);
        let s = h.summary().unwrap();
        assert_eq!((s.p50, s.p95, s.max), (6_000, 6_000, 6_000));
        assert_eq!(s.count, 4);
        let mut h = LogHistogram::default();
        h.record(1_500);
        h.record(2_000);
        let s = h.summary().unwrap();
        assert_eq!((s.p50, s.p95), (1_500, 2_000));
        let mut h = LogHistogram::default();
        for v in [10_000, 10_050, 10_100] {
            h.record(v);
        }
        let p50 = h.summary().unwrap().p50;
        assert!((10_050..=10_050 + 10_050 / 64).contains(&p50), "{p50}");
    }
}
