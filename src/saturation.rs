//! The saturation signal: when most recent waits have expired, waiting is
//! futile, so new callers that find every slot held are shed at once instead
//! of parking, until a probe's wait succeeds again.
//!
//! It only ever skips waiting: it is consulted after a caller found no free
//! slot, so it never refuses a free one. Touched only on the slow path (a
//! caller about to park, a wait ending), so a mutex is enough.

use crate::sync::{lock, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// When to stop parking callers: at least `min_waits` waits ended within
/// `window`, and at least `expired_ratio` of them expired.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Thresholds {
    pub(crate) expired_ratio: f64,
    pub(crate) min_waits: u64,
    pub(crate) window: Duration,
}

#[derive(Debug)]
pub(crate) struct SaturationSignal {
    thresholds: Thresholds,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    window_start: Option<Instant>,
    waits: u64,
    expired: u64,
    /// Parking is suspended.
    raised: bool,
    /// A probe is parked to find out whether waiting pays again.
    probing: bool,
}

/// What a caller that found no free slot may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Park,
    /// Park, as the probe that may lower the signal.
    Probe,
    /// Do not park: shed at once.
    Skip,
}

impl SaturationSignal {
    pub(crate) fn new(thresholds: Thresholds) -> Self {
        Self {
            thresholds,
            state: Mutex::new(State {
                window_start: None,
                waits: 0,
                expired: 0,
                raised: false,
                probing: false,
            }),
        }
    }

    pub(crate) fn is_raised(&self) -> bool {
        lock(&self.state).raised
    }

    /// A caller found every slot held and may wait.
    pub(crate) fn verdict(&self) -> Verdict {
        let mut state = lock(&self.state);
        match (state.raised, state.probing) {
            (false, _) => Verdict::Park,
            (true, false) => {
                state.probing = true;
                Verdict::Probe
            }
            (true, true) => Verdict::Skip,
        }
    }

    /// A wait ended, `admitted` or not; `probe` if it was the probe's.
    /// Returns the signal's new state if this changed it.
    pub(crate) fn wait_ended(&self, admitted: bool, probe: bool) -> Option<bool> {
        let mut state = lock(&self.state);
        if probe {
            state.probing = false;
            if admitted && state.raised {
                // Waiting pays again: start counting afresh.
                state.raised = false;
                state.window_start = None;
                return Some(false);
            }
            return None;
        }
        let now = Instant::now();
        let fresh = state
            .window_start
            .is_none_or(|start| now.duration_since(start) >= self.thresholds.window);
        if fresh {
            state.window_start = Some(now);
            state.waits = 0;
            state.expired = 0;
        }
        state.waits += 1;
        state.expired += u64::from(!admitted);
        let ratio = state.expired as f64 / state.waits as f64;
        if !state.raised
            && state.waits >= self.thresholds.min_waits
            && ratio >= self.thresholds.expired_ratio
        {
            state.raised = true;
            return Some(true);
        }
        None
    }
}
