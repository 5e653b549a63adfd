//! The orders in which waiting callers get freed slots, and what a custom
//! order sees of a waiting caller.

use std::cmp::Ordering;
use std::fmt;
use std::sync::Arc;

/// In which order callers waiting for a slot get one.
///
/// Whatever the order, the head of the line is never bypassed: freed slots
/// go to the caller the order puts first, and if that caller is weighted
/// and needs more slots than are free, nobody behind it is served until
/// enough have come free, however light they are. New arrivals never take a
/// slot while anyone is parked. The order decides who is at the head, and so
/// how often a heavy head stalls the line: see `docs/scheduling.md` in the
/// repository.
#[derive(Clone, Default)]
#[non_exhaustive]
pub enum QueueOrder {
    /// The longest-waiting caller first. The default: fair, and every wait
    /// is bounded by the budget anyway.
    #[default]
    Fifo,
    /// The newest caller first: under a backlog, the callers most likely to
    /// still be there (and within their own deadlines) are served, and the
    /// oldest expire.
    Lifo,
    /// The lowest priority value first; equal priorities oldest first.
    PriorityFifo,
    /// The lowest priority value first; equal priorities newest first.
    PriorityLifo,
    /// First in, first out while at most `after` callers wait; newest first
    /// once the line is longer, as in Meta's "Fail at Scale": a short line
    /// is a burst that FIFO serves fairly, a long one is overload that LIFO
    /// serves without letting everyone's latency grow.
    AdaptiveLifo {
        /// The length of line past which the newest are served first.
        after: usize,
    },
    /// Your own order: see [`QueueOrder::custom`].
    Custom(Comparator),
}

/// A comparator of waiting callers, for [`QueueOrder::custom`].
#[derive(Clone)]
pub struct Comparator(pub(super) Arc<CompareFn>);

type CompareFn = dyn Fn(&WaitingCall, &WaitingCall) -> Ordering + Send + Sync;

/// What a [`QueueOrder::custom`] comparator sees of a waiting caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitingCall {
    pub(super) priority: i32,
    pub(super) weight: usize,
    pub(super) arrival: u64,
}

impl WaitingCall {
    /// The priority the caller asked for (0 by default).
    pub fn priority(&self) -> i32 {
        self.priority
    }

    /// How many slots the caller needs (1 by default).
    pub fn weight(&self) -> usize {
        self.weight
    }

    /// When the caller joined the line, as a sequence number: earlier
    /// callers have lower numbers.
    pub fn arrival(&self) -> u64 {
        self.arrival
    }
}

impl QueueOrder {
    /// An order of your own: `compare` says which of two waiting callers
    /// goes first ([`Ordering::Less`] for the first argument). Callers it
    /// finds equal go oldest first.
    ///
    /// It is called with the bulkhead's line locked, each time a slot is
    /// handed out: keep it cheap, consistent (a total order) and free of
    /// panics. Each dispatch looks at every waiting caller, so the line's
    /// length should be capped with [`Config::max_waiting`](crate::Config::max_waiting).
    ///
    /// Lightest first within a priority, the order that stalls least under
    /// mixed weights:
    ///
    /// ```
    /// use tower_inflight::QueueOrder;
    ///
    /// let order = QueueOrder::custom(|a, b| {
    ///     a.priority().cmp(&b.priority()).then(a.weight().cmp(&b.weight()))
    /// });
    /// # let _ = order;
    /// ```
    pub fn custom<F>(compare: F) -> Self
    where
        F: Fn(&WaitingCall, &WaitingCall) -> Ordering + Send + Sync + 'static,
    {
        QueueOrder::Custom(Comparator(Arc::new(compare)))
    }
}

impl fmt::Debug for QueueOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QueueOrder::Fifo => f.write_str("Fifo"),
            QueueOrder::Lifo => f.write_str("Lifo"),
            QueueOrder::PriorityFifo => f.write_str("PriorityFifo"),
            QueueOrder::PriorityLifo => f.write_str("PriorityLifo"),
            QueueOrder::AdaptiveLifo { after } => f
                .debug_struct("AdaptiveLifo")
                .field("after", after)
                .finish(),
            QueueOrder::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

impl fmt::Debug for Comparator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Comparator(..)")
    }
}

impl PartialEq for QueueOrder {
    /// Built-in orders are equal by value; custom orders only to clones of
    /// themselves.
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (QueueOrder::Custom(a), QueueOrder::Custom(b)) => Arc::ptr_eq(&a.0, &b.0),
            (QueueOrder::AdaptiveLifo { after: a }, QueueOrder::AdaptiveLifo { after: b }) => {
                a == b
            }
            _ => std::mem::discriminant(self) == std::mem::discriminant(other),
        }
    }
}

impl Eq for QueueOrder {}
