//! The cluster ceiling's step in a caller's admission: after its local
//! slots, a lease (feature `redis`). Without the feature the step does not
//! exist, and a permit carries nothing for it.

use crate::bulkhead::Shared;
use crate::error::ShedReason;
use crate::sync::Arc;
use std::task::{Context, Poll};

/// What a permit holds of the cluster ceiling: the lease it was granted (or
/// its place under the fallback limit), given back when it is dropped.
/// Nothing at all without the feature, so that a permit is no larger.
#[cfg(feature = "redis")]
pub(crate) type HeldLease = Option<Box<crate::redis::Lease>>;
#[cfg(not(feature = "redis"))]
pub(crate) type HeldLease = ();

#[cfg(feature = "redis")]
type BoxedLease = std::pin::Pin<Box<dyn std::future::Future<Output = crate::redis::Leased> + Send>>;

/// Whether `lease` may have run out since it was granted: a grant kept too
/// long before its call must not run on it.
#[inline(always)]
pub(crate) fn lapsed(lease: &HeldLease) -> bool {
    #[cfg(feature = "redis")]
    return lease.as_ref().is_some_and(|lease| lease.lapsed());
    #[cfg(not(feature = "redis"))]
    {
        let () = lease;
        false
    }
}

/// A lease being asked for, by a caller that holds its local slots.
pub(crate) struct Leasing {
    #[cfg(feature = "redis")]
    cluster: Arc<crate::redis::Cluster>,
    /// The ceiling's count of `cancel_waiting` calls when the lease was
    /// first asked for: a caller asking is waiting too, and is turned away.
    #[cfg(feature = "redis")]
    cancels_seen: u64,
    /// In a mutex only to be `Sync` (axum wants its services to be, and a
    /// service may hold this while `poll_ready` waits): it is only ever
    /// reached through `&mut`, with `get_mut`, which takes no lock.
    #[cfg(feature = "redis")]
    asking: std::sync::Mutex<BoxedLease>,
    /// Woken by a close or a cancel, which `turned_away` then sees.
    #[cfg(feature = "redis")]
    woken: std::pin::Pin<Box<tokio::sync::futures::OwnedNotified>>,
    #[cfg(not(feature = "redis"))]
    never: std::convert::Infallible,
}

impl Leasing {
    /// The lease a caller that has its local slots must take next, if its
    /// bulkhead has a cluster ceiling; it may ask again until `deadline`
    /// while the ceiling is full.
    #[cfg(feature = "redis")]
    pub(crate) fn start(
        shared: &Arc<Shared>,
        deadline: Option<tokio::time::Instant>,
    ) -> Option<Self> {
        let cluster = shared.cluster()?.clone();
        Some(Self {
            // Listening before the count is read: a cancel after the read
            // wakes this caller.
            woken: cluster.listen_for_turn_away(),
            cancels_seen: cluster.cancels(),
            asking: std::sync::Mutex::new(Box::pin(cluster.clone().lease(deadline))),
            cluster,
        })
    }

    #[cfg(not(feature = "redis"))]
    #[inline(always)]
    pub(crate) fn start(_: &Arc<Shared>, _: Option<tokio::time::Instant>) -> Option<Self> {
        None
    }

    /// Why the caller is turned away before its lease comes, if it is: the
    /// bulkhead was closed, or its waiting callers cancelled. Wakes the
    /// caller when that happens.
    pub(crate) fn turned_away(
        &mut self,
        shared: &Shared,
        cx: &mut Context<'_>,
    ) -> Option<ShedReason> {
        #[cfg(feature = "redis")]
        {
            // Woken once, by a close or a cancel that may have come before
            // this caller read its count: listen again, for the next one.
            while std::future::Future::poll(self.woken.as_mut(), cx).is_ready() {
                self.woken = self.cluster.listen_for_turn_away();
            }
            if shared.waiters().is_closed() {
                Some(ShedReason::Closed)
            } else if self.cluster.cancels() != self.cancels_seen {
                Some(ShedReason::Cancelled)
            } else {
                None
            }
        }
        #[cfg(not(feature = "redis"))]
        {
            let _ = (shared, cx);
            match self.never {}
        }
    }

    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<HeldLease, ShedReason>> {
        #[cfg(feature = "redis")]
        return self
            .asking
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_mut()
            .poll(cx)
            .map(|leased| leased.map(|lease| lease.map(Box::new)));
        #[cfg(not(feature = "redis"))]
        {
            let _ = cx;
            match self.never {}
        }
    }
}
