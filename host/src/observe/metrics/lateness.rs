//! The host's retry lateness as plain counts per bucket, beside the Prometheus histogram: what
//! the page's per-minute p99 is drawn from (the difference of two readings a minute apart),
//! with no Prometheus to ask. One relaxed atomic add per retried delivery.

use std::sync::atomic::{AtomicU64, Ordering};

/// The buckets' upper bounds, seconds: 10 µs doubling, as the histogram's.
const BUCKETS: usize = 22;

fn bound(i: usize) -> f64 {
    0.000_01 * f64::powi(2.0, i as i32)
}

/// Counts per bucket since the host started (the last one holds everything above).
#[derive(Debug, Default)]
pub struct LatenessCounts {
    counts: [AtomicU64; BUCKETS + 1],
}

impl LatenessCounts {
    /// Count one retry `seconds` late.
    pub fn observe(&self, seconds: f64) {
        let i = (0..BUCKETS)
            .find(|&i| seconds <= bound(i))
            .unwrap_or(BUCKETS);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
    }

    /// The counts now.
    pub fn read(&self) -> [u64; BUCKETS + 1] {
        std::array::from_fn(|i| self.counts[i].load(Ordering::Relaxed))
    }
}

/// The 99th percentile (a bucket's upper bound, seconds) of what was counted between
/// `before` and `after`; `None` when nothing was.
pub fn p99_between(before: &[u64; BUCKETS + 1], after: &[u64; BUCKETS + 1]) -> Option<f64> {
    let deltas: Vec<u64> = after
        .iter()
        .zip(before)
        .map(|(a, b)| a.saturating_sub(*b))
        .collect();
    let total: u64 = deltas.iter().sum();
    if total == 0 {
        return None;
    }
    let want = total.saturating_mul(99).div_ceil(100);
    let mut seen = 0;
    for (i, n) in deltas.iter().enumerate() {
        seen += n;
        if seen >= want {
            return Some(if i == BUCKETS {
                bound(BUCKETS - 1) * 2.0
            } else {
                bound(i)
            });
        }
    }
    None
}

/// The counts' type, for the page's samples.
pub type Counts = [u64; BUCKETS + 1];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_p99_is_the_bucket_that_holds_the_99th_of_a_hundred() {
        let counts = LatenessCounts::default();
        let before = counts.read();
        for _ in 0..99 {
            counts.observe(0.001);
        }
        counts.observe(2.0);
        let p99 = p99_between(&before, &counts.read()).unwrap();
        assert!((0.001..0.0021).contains(&p99), "{p99}");
        counts.observe(2.0);
        counts.observe(2.0);
        let p99 = p99_between(&before, &counts.read()).unwrap();
        assert!(p99 >= 2.0, "{p99}");
        assert_eq!(p99_between(&counts.read(), &counts.read()), None);
    }
}
