//! Events a bulkhead reports to a hook of yours.

use crate::error::ShedReason;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Something that happened in a bulkhead, handed to the hook set with
/// [`Config::on_event`](crate::Config::on_event).
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use std::sync::Arc;
/// use std::time::Duration;
/// use tower_inflight::{Bulkhead, Config, Event};
///
/// let rejected = Arc::new(AtomicUsize::new(0));
/// let counter = rejected.clone();
/// let bulkhead = Bulkhead::new(Config::new(1, Duration::from_secs(30)).on_event(move |event| {
///     if let Event::Rejected { .. } = event {
///         counter.fetch_add(1, Ordering::Relaxed);
///     }
/// }));
/// let _held = bulkhead.try_acquire().unwrap();
/// assert!(bulkhead.try_acquire().is_err());
/// assert_eq!(rejected.load(Ordering::Relaxed), 1);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// A call was given a slot.
    Admitted,
    /// A call was shed.
    Rejected {
        /// Why.
        reason: ShedReason,
    },
    /// A slot held past `reclaim_after` without a release was taken over:
    /// a leaked permit, or a `reclaim_after` shorter than a call can take.
    Reclaimed,
    /// A caller that waited for a slot stopped waiting.
    Waited {
        /// How long it waited.
        waited: Duration,
        /// Whether it got a slot (otherwise it was shed).
        admitted: bool,
    },
    /// The saturation signal ([`Config::saturation_signal`](crate::Config::saturation_signal))
    /// went up (waits were mostly expiring: callers that find every slot
    /// held are shed at once) or down (a probe's wait paid off).
    SaturationSignal {
        /// Whether it is up now.
        raised: bool,
    },
    /// The cluster ceiling's Redis stopped answering (a command failed or
    /// timed out: calls follow
    /// [`WhenUnreachable`](crate::redis::WhenUnreachable) for the backoff),
    /// or answered again. Feature `redis`.
    ClusterReachable {
        /// Whether it answers now.
        reachable: bool,
    },
    /// The adaptive limit ([`Config::adaptive`](crate::Config::adaptive))
    /// moved.
    LimitChanged {
        /// The limit in force before.
        from: usize,
        /// The limit in force now.
        to: usize,
    },
}

/// The hook: called on the thread where the event happens, so it must be
/// quick and must not block.
#[derive(Clone)]
pub(crate) struct Hook(pub(crate) Arc<dyn Fn(&Event) + Send + Sync>);

impl fmt::Debug for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Hook(..)")
    }
}
