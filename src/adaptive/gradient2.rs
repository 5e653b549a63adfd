//! Gradient2: the latency now against its long-run average.

use crate::adaptive::{in_force, Algorithm, Sample};
use std::time::Duration;

/// Netflix's `Gradient2Limit`: the limit times the gradient between a
/// long-run average of latency (an exponential average over 600 samples)
/// and each latency, plus a queue of 4, smoothed by 0.2 a step.
///
/// The gradient is `1.5 × long / latency`, kept within `[0.5, 1]`: so it
/// shrinks only when latency runs over one and a half times its long-run
/// average, and otherwise grows by the queue. When the average runs over
/// twice the latency it is pulled down 5 % a sample, to recover after
/// latency falls. It does not move while fewer than half its limit are in
/// flight, and it does not read drops.
///
/// Its weak spot: the long-run average follows the latency it causes, so
/// under steady overload it settles where queueing is, not where it
/// starts.
///
/// ```
/// use std::time::Duration;
/// use tower_inflight::adaptive::{Algorithm, Gradient2, Sample};
///
/// let mut gradient = Gradient2::default();
/// let at = |ms| Sample::new(Duration::from_millis(ms), 20, false, Duration::ZERO);
/// let mut limit = 20;
/// for _ in 0..20 {
///     limit = gradient.update(&at(10), limit); // steady: it grows
/// }
/// assert!(limit > 20);
/// assert!(gradient.update(&at(100), limit) < limit); // ten times slower
/// ```
#[derive(Clone, Debug)]
pub struct Gradient2 {
    tolerance: f64,
    smoothing: f64,
    queue: f64,
    estimate: Option<f64>,
    long: Average,
}

impl Default for Gradient2 {
    fn default() -> Self {
        Self {
            tolerance: 1.5,
            smoothing: 0.2,
            queue: 4.0,
            estimate: None,
            long: Average::new(600, 10),
        }
    }
}

impl Gradient2 {
    /// How much slower than its long-run average latency may run before
    /// the limit shrinks (1.5 unless set; at least 1).
    pub fn tolerance(mut self, tolerance: f64) -> Self {
        self.tolerance = if tolerance >= 1.0 { tolerance } else { 1.0 };
        self
    }
}

impl Algorithm for Gradient2 {
    fn update(&mut self, sample: &Sample, limit: usize) -> usize {
        let estimate = *self.estimate.insert(in_force(self.estimate, limit));
        if sample.dropped {
            // It does not read drops, nor take their latency for a sample:
            // a dependency that refuses at once would pull the average down
            // and make every later call look fast.
            return estimate as usize;
        }
        let short = sample.latency.as_secs_f64().max(1e-9);
        let long = self.long.add(short);
        if long / short > 2.0 {
            // For the next samples: this one's gradient uses the average
            // before it is pulled down.
            self.long.scale(0.95);
        }
        if (sample.in_flight as f64) < estimate / 2.0 {
            return estimate as usize;
        }
        let gradient = (self.tolerance * long / short).clamp(0.5, 1.0);
        let next = estimate * gradient + self.queue;
        let next = (estimate * (1.0 - self.smoothing) + next * self.smoothing).max(1.0);
        self.estimate = Some(next);
        next as usize
    }

    fn baseline(&self) -> Option<Duration> {
        (self.long.count > 0)
            .then(|| Duration::try_from_secs_f64(self.long.value).ok())
            .flatten()
    }
}

/// An exponential average over `window` samples, a plain average over the
/// first `warmup`.
#[derive(Clone, Debug)]
struct Average {
    window: u32,
    warmup: u32,
    count: u32,
    value: f64,
}

impl Average {
    fn new(window: u32, warmup: u32) -> Self {
        Self {
            window,
            warmup,
            count: 0,
            value: 0.0,
        }
    }

    fn add(&mut self, sample: f64) -> f64 {
        if self.count < self.warmup {
            self.count += 1;
            self.value += (sample - self.value) / f64::from(self.count);
        } else {
            let factor = 2.0 / (f64::from(self.window) + 1.0);
            self.value = self.value * (1.0 - factor) + sample * factor;
        }
        self.value
    }

    fn scale(&mut self, by: f64) {
        self.value *= by;
    }
}
