//! CoDel for the line of waiting callers: once the line has stood for a
//! whole interval without emptying, new waits are cut to a short target.
//!
//! A line that empties now and then is absorbing bursts, and the full wait
//! budget serves it well. One that never empties is a standing queue: the
//! slots are simply too few for the load, every full-length wait adds its
//! length to someone's latency and most of them expire anyway. Cutting new
//! waits short there keeps the line, and the latency behind it, small,
//! while a burst still gets the whole budget. This is the queue discipline
//! of Meta's "Fail at Scale", after Nichols and Jacobson's CoDel.

use crate::sync::{lock, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// The two durations of [`Config::codel`](crate::Config::codel).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CodelSettings {
    pub(crate) target: Duration,
    pub(crate) interval: Duration,
}

/// When the line was last seen empty.
#[derive(Debug)]
pub(crate) struct Codel {
    settings: CodelSettings,
    last_empty: Mutex<Option<Instant>>,
}

impl Codel {
    pub(crate) fn new(settings: CodelSettings) -> Self {
        Self {
            settings,
            last_empty: Mutex::new(None),
        }
    }

    /// The line holds `waiting` callers now (one that is leaving counts
    /// out): an empty line restarts the interval.
    pub(crate) fn seen(&self, waiting: usize) {
        if waiting == 0 {
            *lock(&self.last_empty) = Some(Instant::now());
        }
    }

    /// The budget of a caller about to join a line of `waiting` callers.
    pub(crate) fn budget(&self, wait: Duration, waiting: usize) -> Duration {
        let mut last_empty = lock(&self.last_empty);
        let now = Instant::now();
        if waiting == 0 {
            *last_empty = Some(now);
            return wait;
        }
        if self.standing(*last_empty, now) {
            wait.min(self.settings.target)
        } else {
            wait
        }
    }

    /// Whether new waits are being cut short now.
    pub(crate) fn is_cutting(&self, waiting: usize) -> bool {
        waiting > 0 && self.standing(*lock(&self.last_empty), Instant::now())
    }

    /// Whether a line last seen empty at `last_empty` has stood, at `now`,
    /// longer than the interval.
    fn standing(&self, last_empty: Option<Instant>, now: Instant) -> bool {
        last_empty.is_some_and(|at| now.saturating_duration_since(at) > self.settings.interval)
    }
}
