//! A ceiling above the bulkhead: one cap on calls in flight for every
//! bulkhead that shares it, kept wherever you keep shared state.
//!
//! A bulkhead caps its own process. A [`Ceiling`] given to
//! [`Config::ceiling`](crate::Config::ceiling) caps calls across every
//! bulkhead, in every process, that asks it. Redis is one store, built in:
//! [`redis::ClusterCeiling`](crate::redis::ClusterCeiling) (feature
//! `redis`). Another (etcd, a database, a coordination service) is this
//! trait away.
//!
//! # How a call is admitted
//!
//! 1. The local bulkhead first: a full bulkhead sheds (or waits) as
//!    ever, without asking the ceiling.
//! 2. Then, holding its local slots, the call asks for a [`Lease`]: both or
//!    neither. A refusal ([`Refused`]) gives the local slots back (to the
//!    next caller in line) and sheds the call with
//!    [`ShedReason::ClusterLimit`](crate::ShedReason::ClusterLimit) or
//!    [`ClusterUnavailable`](crate::ShedReason::ClusterUnavailable).
//! 3. The permit holds both. Dropping it drops the lease, which gives it
//!    back, then frees the local slots.
//!
//! The bulkhead keeps its own rules around the ask: with a `wait` budget,
//! the ceiling is given the budget's end as a deadline to ask again until;
//! [`Bulkhead::close`](crate::Bulkhead::close) and
//! [`cancel_waiting`](crate::Bulkhead::cancel_waiting) turn away the callers
//! asking, mid-ask, by dropping their futures; and a lease granted to a
//! service polled ready is checked with [`Lease::lapsed`] before its call.
//! What to do while the store is away is the ceiling's own policy: admit
//! anyway (with `Option<L>` as its lease, `Ok(None)`), or refuse with
//! [`Refused::Unavailable`].
//!
//! The layers take the slots and the lease in `poll_ready` (an ask may be a
//! round trip, which `call` cannot wait for); the calls that may never wait
//! ([`Bulkhead::try_acquire`](crate::Bulkhead::try_acquire) and its kin) get
//! [`Ceiling::try_acquire`]'s answer. A keyed bulkhead takes the lease
//! with its ceiling's slot: give the ceiling to the keyed ceiling's
//! configuration (a per-key configuration with one is refused).
//!
//! # A ceiling of your own
//!
//! A toy ceiling in memory, shared by two bulkheads:
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::sync::Arc;
//! use std::time::Duration;
//! use tower_inflight::ceiling::{Ceiling, Lease, Refused};
//! use tower_inflight::{Bulkhead, Config, ShedReason};
//!
//! /// At most `limit` calls in flight across every bulkhead given a clone.
//! #[derive(Clone)]
//! struct InMemory {
//!     held: Arc<AtomicUsize>,
//!     limit: usize,
//! }
//!
//! /// One call's place, given back when dropped.
//! struct Place(Arc<AtomicUsize>);
//!
//! impl Lease for Place {}
//!
//! impl Drop for Place {
//!     fn drop(&mut self) {
//!         self.0.fetch_sub(1, Ordering::SeqCst);
//!     }
//! }
//!
//! impl InMemory {
//!     fn take(&self) -> Result<Place, Refused> {
//!         self.held
//!             .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |held| {
//!                 (held < self.limit).then_some(held + 1)
//!             })
//!             .map(|_| Place(self.held.clone()))
//!             .map_err(|_| Refused::Full)
//!     }
//! }
//!
//! impl Ceiling for InMemory {
//!     type Lease = Place;
//!
//!     // A store across the network would make a round trip here, and may
//!     // ask again until `deadline` while the ceiling is full.
//!     async fn acquire(&self, _deadline: Option<tokio::time::Instant>) -> Result<Place, Refused> {
//!         self.take()
//!     }
//!
//!     // Without a round trip: a store across the network would refuse
//!     // (the default) or admit by its policy for an unreachable store.
//!     fn try_acquire(&self) -> Result<Place, Refused> {
//!         self.take()
//!     }
//! }
//!
//! let ceiling = InMemory { held: Arc::default(), limit: 1 };
//! let a = Bulkhead::new(Config::new(4, Duration::from_secs(30)).ceiling(ceiling.clone()));
//! let b = Bulkhead::new(Config::new(4, Duration::from_secs(30)).ceiling(ceiling));
//!
//! let permit = a.try_acquire().unwrap();
//! let refused = b.try_acquire().unwrap_err();
//! assert_eq!(refused.reason(), ShedReason::ClusterLimit);
//! assert_eq!(b.in_flight(), 0, "its local slot went back");
//! drop(permit); // the lease first, then the slot
//! assert!(b.try_acquire().is_ok());
//! ```

mod erased;
mod lease;
mod refused;

pub(crate) use erased::{Admit, Asking, Given, HeldLease, Install, Leased};
pub use lease::Lease;
pub use refused::Refused;

use std::future::Future;
use std::sync::Arc;
use tokio::time::Instant;

/// A cap on calls in flight shared by bulkheads: a second step in a call's
/// admission, after its local slots (see the [module](self)).
///
/// Given to [`Config::ceiling`](crate::Config::ceiling). Every bulkhead
/// built from that configuration asks the same value; to share one ceiling
/// among configurations, give each a clone of a handle (or an `Arc` of the
/// ceiling).
pub trait Ceiling: Send + Sync + 'static {
    /// What a call holds of the ceiling while it runs; dropping it gives
    /// it back.
    type Lease: Lease;

    /// A lease for a call that holds its local slots: may take a round
    /// trip. While the ceiling is full, the call may ask again until
    /// `deadline` (the end of its bulkhead's `wait` budget), then
    /// [`Refused::Full`]; without a deadline, it asks once. While the
    /// store is away, the ceiling's own policy answers.
    ///
    /// The future is dropped if the caller goes away, or its bulkhead is
    /// closed or its waiting callers cancelled: a place the store may have
    /// granted by then must be given back. Nothing else times it: a store
    /// across the network bounds its own round trip (as the Redis ceiling
    /// does with its `timeout`).
    ///
    /// A lease that is never given back (its permit leaked) is dropped
    /// when the bulkhead reclaims the permit's slots, or at a `reset`.
    fn acquire(
        &self,
        deadline: Option<Instant>,
    ) -> impl Future<Output = Result<Self::Lease, Refused>> + Send;

    /// A lease for a call that may not wait for a round trip
    /// ([`Bulkhead::try_acquire`](crate::Bulkhead::try_acquire) and its
    /// kin), holding its local slots. Refuses with
    /// [`Refused::Unavailable`] unless the ceiling can answer without one.
    fn try_acquire(&self) -> Result<Self::Lease, Refused> {
        Err(Refused::Unavailable)
    }
}

impl<C: Ceiling> Ceiling for Arc<C> {
    type Lease = C::Lease;

    fn acquire(
        &self,
        deadline: Option<Instant>,
    ) -> impl Future<Output = Result<Self::Lease, Refused>> + Send {
        (**self).acquire(deadline)
    }

    fn try_acquire(&self) -> Result<Self::Lease, Refused> {
        (**self).try_acquire()
    }
}
