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

/// A lease being asked for, by a caller that holds its local slots.
pub(crate) struct Leasing {
    /// In a mutex only to be `Sync` (axum wants its services to be, and a
    /// service may hold this while `poll_ready` waits): it is only ever
    /// reached through `&mut`, with `get_mut`, which takes no lock.
    #[cfg(feature = "redis")]
    asking: std::sync::Mutex<BoxedLease>,
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
            asking: std::sync::Mutex::new(Box::pin(cluster.lease(deadline))),
        })
    }

    #[cfg(not(feature = "redis"))]
    #[inline(always)]
    pub(crate) fn start(_: &Arc<Shared>, _: Option<tokio::time::Instant>) -> Option<Self> {
        None
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
