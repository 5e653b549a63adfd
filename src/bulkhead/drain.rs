//! Draining: a caller waits for the last call in flight to end, woken by
//! the release that ends it rather than polling.

use crate::sync::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::Notify;

/// How often a drain looks again without being woken: a release racing the
/// drain's start may miss it, and leaked slots end by their deadline, with
/// no release.
pub(super) const RECHECK: Duration = Duration::from_millis(100);

#[derive(Debug, Default)]
pub(super) struct DrainSignal {
    /// Drains under way. Releases look at it; only while it is not 0 do
    /// they count what is left.
    drains: AtomicUsize,
    notify: Notify,
}

/// A drain under way, counted until dropped.
pub(super) struct Draining<'a>(&'a DrainSignal);

impl Drop for Draining<'_> {
    fn drop(&mut self) {
        self.0.drains.fetch_sub(1, Ordering::SeqCst);
    }
}

impl DrainSignal {
    pub(super) fn enter(&self) -> Draining<'_> {
        self.drains.fetch_add(1, Ordering::SeqCst);
        Draining(self)
    }

    /// Whether a drain is under way: one load of a line that only drains
    /// write, on every release.
    #[inline(always)]
    pub(super) fn is_draining(&self) -> bool {
        self.drains.load(Ordering::Relaxed) != 0
    }

    /// Wakes the drains: nothing is left.
    pub(super) fn finished(&self) {
        self.notify.notify_waiters();
    }

    pub(super) fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }
}
