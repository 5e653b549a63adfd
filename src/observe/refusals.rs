//! Where refusals are counted, spread over cache lines.
//!
//! Under overload every thread sheds, and each refusal counts itself and
//! clones the bulkhead's name into its error. Kept in one place, the count
//! and the name's reference count would be two cache lines that every
//! shedding thread writes, moving between cores on every refusal. So a
//! thread counts, and clones the name, in a lane of its own: one of up to
//! 16, each on cache lines of its own and holding its own counts and its
//! own copy of the name. A bulkhead has a lane for every four slots, up
//! to 16 (a key of a keyed bulkhead, most often, has one): memory traded
//! for contention, since lanes cost memory in every key, and a small
//! bulkhead, a tenant's or a route's, is seldom shed from by many threads
//! at once.

use crate::error::ShedReason;
use crate::sync::{thread_hash, AtomicU64, Ordering};
use std::sync::Arc;

/// The most lanes a bulkhead has: threads beyond this share lanes, which
/// still splits their writes this many ways.
const LANES: usize = 16;

/// A lane for every this many slots (see the module docs).
const SLOTS_A_LANE: usize = 4;

/// Aligned to 8 only: an allocation aligned to a cache line costs glibc
/// twice its size in resident memory once such allocations come and go
/// (as keys do).
#[derive(Debug)]
struct Lane {
    refused: [AtomicU64; ShedReason::COUNT],
    name: Option<Arc<str>>,
}

#[derive(Debug)]
pub(crate) struct Refusals {
    /// The lanes in use are every other one, so that two in use are a
    /// lane (over a cache line) apart and never share a line. The others
    /// count nothing and carry no name.
    lanes: Box<[Lane]>,
}

// The lanes in use stay a cache line apart.
const _: () = assert!(std::mem::size_of::<Lane>() >= 64);

impl Refusals {
    /// The lanes of a bulkhead of `limit` slots, whose refusals carry
    /// `name`.
    pub(crate) fn new(name: Option<&str>, limit: usize) -> Self {
        let in_use = (limit / SLOTS_A_LANE).clamp(1, LANES).next_power_of_two();
        let lanes = (0..2 * in_use - 1)
            .map(|lane| Lane {
                refused: Default::default(),
                name: name.filter(|_| lane % 2 == 0).map(Arc::from),
            })
            .collect();
        Self { lanes }
    }

    /// Counts a refusal for `reason` in this thread's lane, and gives the
    /// lane's copy of the name for the refusal's error.
    pub(crate) fn refuse(&self, reason: ShedReason) -> Option<Arc<str>> {
        let in_use = self.lanes.len().div_ceil(2);
        let lane = &self.lanes[2 * (this_threads_lane() & (in_use - 1))];
        lane.refused[reason.index()].fetch_add(1, Ordering::Relaxed);
        lane.name.clone()
    }

    /// The bytes of heap the lanes of a bulkhead of `limit` slots take.
    #[cfg(all(test, not(tower_inflight_loom)))]
    pub(crate) fn heap_bytes(name: Option<&str>, limit: usize) -> usize {
        Self::new(name, limit).lanes.len() * std::mem::size_of::<Lane>()
    }

    /// Refusals for `reason`, ever.
    pub(crate) fn count(&self, reason: ShedReason) -> u64 {
        self.lanes
            .iter()
            .map(|lane| lane.refused[reason.index()].load(Ordering::Relaxed))
            .sum()
    }
}

/// A lane for the calling thread (see [`thread_hash`]).
#[inline]
fn this_threads_lane() -> usize {
    const _: () = assert!(LANES.is_power_of_two());
    (thread_hash() >> (u64::BITS - LANES.trailing_zeros())) as usize
}

#[cfg(all(test, not(tower_inflight_loom)))]
mod tests {
    use super::*;

    #[test]
    fn counts_every_refusal_by_reason_and_hands_out_the_name() {
        let refusals = Refusals::new(Some("payments"), 64);
        let names: Vec<_> = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..4)
                .map(|_| scope.spawn(|| refusals.refuse(ShedReason::LimitReached)))
                .collect();
            threads
                .into_iter()
                .map(|thread| thread.join().unwrap())
                .collect()
        });
        refusals.refuse(ShedReason::Bytes);

        assert!(names.iter().all(|name| name.as_deref() == Some("payments")));
        assert_eq!(refusals.count(ShedReason::LimitReached), 4);
        assert_eq!(refusals.count(ShedReason::Bytes), 1);
        assert_eq!(refusals.count(ShedReason::Closed), 0);
    }

    #[test]
    fn threads_running_at_once_spread_over_lanes_in_range() {
        let barrier = std::sync::Barrier::new(8);
        let lanes: Vec<usize> = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..8)
                .map(|_| {
                    scope.spawn(|| {
                        // All alive at once, so each has a stack of its own.
                        barrier.wait();
                        this_threads_lane()
                    })
                })
                .collect();
            threads
                .into_iter()
                .map(|thread| thread.join().unwrap())
                .collect()
        });
        assert!(lanes.iter().all(|&lane| lane < LANES));
        let distinct: std::collections::HashSet<_> = lanes.iter().collect();
        assert!(distinct.len() > 1, "eight threads all in lane {}", lanes[0]);
    }
}
