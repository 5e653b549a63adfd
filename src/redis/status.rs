//! What a cluster ceiling reports in a bulkhead's [`Status`](crate::Status).

use std::time::Duration;

/// The cluster ceiling's part of a [`Status`](crate::Status): what this
/// replica has seen of it. Counts are since the bulkhead was built.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct ClusterStatus {
    /// The ceiling: calls in flight across every replica.
    pub limit: usize,
    /// Leases held across the fleet, as Redis last answered this replica
    /// (below the ceiling, leases that have run out count until a full
    /// ceiling drops them).
    pub leases_held: usize,
    /// Whether Redis answered the last call that asked it (`false` while
    /// calls skip it after a failure).
    pub reachable: bool,
    /// The last lease's round trip, if any has been asked for.
    pub round_trip: Option<Duration>,
    /// Leases this replica was granted.
    pub leases_granted: u64,
    /// Times this replica was refused a lease: the ceiling full, or the
    /// places free kept for replicas ahead of it in line.
    pub leases_refused: u64,
    /// Of those, times places were free but kept for replicas waiting with
    /// fewer leases for their weights (see
    /// [fair shares](crate::redis#fair-shares)).
    pub leases_deferred: u64,
    /// Leases, anyone's, that had run out unreleased and were dropped when
    /// this replica asked: slots reclaimed from dead or stalled holders.
    pub leases_reclaimed: u64,
    /// Leases this replica gave back.
    pub leases_released: u64,
    /// Releases that found their lease gone: it had run out and been
    /// reclaimed (or the set was deleted). They removed nobody else's.
    pub releases_late: u64,
    /// Releases that never reached Redis (it failed, or too many were
    /// queued): those leases run out on their own.
    pub releases_lost: u64,
    /// Commands to Redis that failed or timed out: lease requests,
    /// releases and renewals.
    pub errors: u64,
    /// Calls admitted without a lease, while Redis was unreachable (under
    /// [`FailOpen`](crate::redis::WhenUnreachable::FailOpen) or
    /// [`LocalLimit`](crate::redis::WhenUnreachable::LocalLimit)).
    pub admitted_without_lease: u64,
    /// Calls holding a place under
    /// [`LocalLimit`](crate::redis::WhenUnreachable::LocalLimit) now.
    pub fallback_held: usize,
}
