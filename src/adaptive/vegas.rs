//! Vegas: the queue inside the dependency, estimated from latency.

use crate::adaptive::{in_force, log10_at_least_one, Algorithm, Sample};
use std::time::Duration;

/// TCP Vegas's rule, as Netflix's `concurrency-limits` defines it.
///
/// It estimates the queue inside the dependency from each latency against
/// the least latency seen (`limit × (1 − least / latency)`): with a queue
/// of at most `log10(limit)` it grows by `6 log10(limit)`, under
/// `3 log10(limit)` by `log10(limit)`, and over `6 log10(limit)` it shrinks
/// by `log10(limit)`, as it does on a drop. Every `30 × limit` samples or
/// so (jittered) it takes the next latency as the least, so that a
/// dependency that became slower for good is not read as queueing forever.
/// It does not grow while fewer than half its limit are in flight.
///
/// Its weak spot: one near-zero latency (a call that did no work and was
/// sampled anyway) becomes the least, and every later call looks queued
/// until the next probe.
///
/// ```
/// use std::time::Duration;
/// use tower_inflight::adaptive::{Algorithm, Sample, Vegas};
///
/// let mut vegas = Vegas::default();
/// let at = |ms| Sample::new(Duration::from_millis(ms), 20, false, Duration::ZERO);
/// assert_eq!(vegas.update(&at(10), 20), 20); // the first sets the least
/// assert!(vegas.update(&at(10), 20) > 20); // no queue: it grows
/// ```
#[derive(Clone, Debug)]
pub struct Vegas {
    smoothing: f64,
    probe_multiplier: f64,
    /// The limit as a real number (the steps are fractions), while it is
    /// the limit in force: clamped by the bounds, it starts again from
    /// there, as Netflix's clamps its estimate.
    estimate: Option<f64>,
    least: Option<Duration>,
    samples_since_probe: u64,
    /// Samples between probes, over the limit: drawn once a probe.
    probe_jitter: Option<f64>,
    random: u64,
}

impl Default for Vegas {
    fn default() -> Self {
        Self {
            smoothing: 1.0,
            probe_multiplier: 30.0,
            estimate: None,
            least: None,
            samples_since_probe: 0,
            probe_jitter: None,
            random: 0x9E37_79B9_7F4A_7C15,
        }
    }
}

impl Vegas {
    /// Moves the estimate a `smoothing` share of the way to `next` (at
    /// least 1); the limit it gives.
    fn smoothed(&mut self, estimate: f64, next: f64) -> usize {
        let next = (1.0 - self.smoothing) * estimate + self.smoothing * next.max(1.0);
        self.estimate = Some(next);
        next as usize
    }

    /// How much of each step is taken, in `(0, 1]` (1 unless set; a value
    /// outside it, or NaN, leaves 1).
    pub fn smoothing(mut self, smoothing: f64) -> Self {
        self.smoothing = if smoothing > 0.0 {
            smoothing.min(1.0)
        } else {
            1.0
        };
        self
    }

    /// A jitter in `[0.5, 1)`, from a xorshift of its own: deterministic, so
    /// that tests and demos repeat.
    fn next_jitter(&mut self) -> f64 {
        self.random ^= self.random << 13;
        self.random ^= self.random >> 7;
        self.random ^= self.random << 17;
        0.5 + (self.random >> 11) as f64 / (1u64 << 53) as f64 / 2.0
    }
}

impl Algorithm for Vegas {
    fn update(&mut self, sample: &Sample, limit: usize) -> usize {
        let estimate = *self.estimate.insert(in_force(self.estimate, limit));
        let log = log10_at_least_one(estimate);
        if sample.dropped {
            // A drop shrinks the limit, and its latency is no sample: a
            // dependency that refuses at once would set the least latency
            // every later call is measured against.
            return self.smoothed(estimate, estimate - log);
        }
        self.samples_since_probe += 1;
        let jitter = match self.probe_jitter {
            Some(jitter) => jitter,
            None => {
                let jitter = self.next_jitter();
                *self.probe_jitter.insert(jitter)
            }
        };
        if self.samples_since_probe as f64 >= self.probe_multiplier * estimate * jitter {
            self.samples_since_probe = 0;
            self.probe_jitter = None;
            self.least = Some(sample.latency);
            return estimate as usize;
        }
        let least = match self.least {
            Some(least) if sample.latency >= least => least,
            _ => {
                self.least = Some(sample.latency);
                return estimate as usize;
            }
        };
        let next = if (sample.in_flight as f64) * 2.0 < estimate {
            return estimate as usize;
        } else {
            let ratio = least.as_secs_f64() / sample.latency.as_secs_f64().max(f64::MIN_POSITIVE);
            let queue = (estimate * (1.0 - ratio)).ceil();
            if queue <= log {
                estimate + 6.0 * log
            } else if queue < 3.0 * log {
                estimate + log
            } else if queue > 6.0 * log {
                estimate - log
            } else {
                return estimate as usize;
            }
        };
        self.smoothed(estimate, next)
    }

    fn baseline(&self) -> Option<Duration> {
        self.least
    }
}
