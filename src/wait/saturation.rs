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

/// How a wait ended, as the signal sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WaitEnd {
    /// The caller got its slots.
    Admitted,
    /// Its budget ran out first.
    Expired,
    /// It went away (its future dropped: a client that hung up), or was
    /// turned away by `close` or `cancel_waiting`: nothing it says about
    /// whether waiting pays, so the signal does not count it.
    Abandoned,
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

    /// A wait ended; `probe` if it was the probe's. Returns the signal's
    /// new state if this changed it.
    pub(crate) fn wait_ended(&self, end: WaitEnd, probe: bool) -> Option<bool> {
        let mut state = lock(&self.state);
        if probe {
            // Whatever became of it, the next caller may probe.
            state.probing = false;
            if end == WaitEnd::Admitted && state.raised {
                // Waiting pays again: start counting afresh.
                state.raised = false;
                state.window_start = None;
                return Some(false);
            }
            return None;
        }
        if end == WaitEnd::Abandoned {
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
        state.expired += u64::from(end == WaitEnd::Expired);
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

#[cfg(all(test, not(tower_inflight_loom)))]
mod tests {
    use super::*;

    fn signal() -> SaturationSignal {
        SaturationSignal::new(Thresholds {
            expired_ratio: 0.5,
            min_waits: 2,
            window: Duration::from_secs(3600),
        })
    }

    #[tokio::test(start_paused = true)]
    async fn callers_that_go_away_do_not_raise_the_signal() {
        let signal = signal();
        for _ in 0..10 {
            assert_eq!(signal.wait_ended(WaitEnd::Abandoned, false), None);
        }
        assert!(!signal.is_raised());
        assert_eq!(signal.wait_ended(WaitEnd::Expired, false), None);
        assert_eq!(signal.wait_ended(WaitEnd::Expired, false), Some(true));
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_that_goes_away_lets_the_next_caller_probe() {
        let signal = signal();
        signal.wait_ended(WaitEnd::Expired, false);
        signal.wait_ended(WaitEnd::Expired, false);
        assert_eq!(signal.verdict(), Verdict::Probe);
        assert_eq!(signal.verdict(), Verdict::Skip);
        assert_eq!(signal.wait_ended(WaitEnd::Abandoned, true), None);
        assert_eq!(signal.verdict(), Verdict::Probe);
        assert_eq!(signal.wait_ended(WaitEnd::Admitted, true), Some(false));
        assert_eq!(signal.verdict(), Verdict::Park);
    }
}
