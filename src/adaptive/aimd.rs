//! AIMD: additive increase, multiplicative decrease.

use crate::adaptive::{Algorithm, Sample};
use std::time::Duration;

/// Additive increase, multiplicative decrease, as Netflix's
/// `concurrency-limits` defines it: one more for each call served while at
/// least half the limit is in use, a tenth off for each drop (or call
/// slower than `timeout`).
///
/// Simple and blind to latency: below the point where the dependency drops
/// or times out calls it grows, so it settles at the limit where calls
/// start to fail, with latency at its worst, and every drop unrelated to
/// load takes a tenth off.
///
/// ```
/// use std::time::Duration;
/// use tower_inflight::adaptive::{Aimd, Algorithm, Sample};
///
/// let mut aimd = Aimd::default();
/// let dropped = Sample::new(Duration::from_millis(10), 20, true, Duration::ZERO);
/// assert_eq!(aimd.update(&dropped, 20), 18);
/// ```
#[derive(Clone, Debug)]
pub struct Aimd {
    backoff: f64,
    timeout: Duration,
}

impl Default for Aimd {
    /// A drop takes a tenth off; a call over 5 s counts as a drop.
    fn default() -> Self {
        Self {
            backoff: 0.9,
            timeout: Duration::from_secs(5),
        }
    }
}

impl Aimd {
    /// The fraction of the limit kept after a drop, in `[0.5, 1)` (outside
    /// it, kept within).
    pub fn backoff(mut self, backoff: f64) -> Self {
        self.backoff = if backoff.is_nan() {
            0.9
        } else {
            backoff.clamp(0.5, 0.999)
        };
        self
    }

    /// A call slower than this counts as a drop.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}

impl Algorithm for Aimd {
    fn update(&mut self, sample: &Sample, limit: usize) -> usize {
        if sample.dropped || sample.latency > self.timeout {
            (limit as f64 * self.backoff) as usize
        } else if sample.in_flight.saturating_mul(2) >= limit {
            limit.saturating_add(1)
        } else {
            limit
        }
    }
}
