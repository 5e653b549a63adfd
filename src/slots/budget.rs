//! The byte budget: how many bytes admitted calls may hold, beside how many
//! calls there are.
//!
//! One atomic word holds the bytes reserved. Bytes held on a slot are
//! recorded beside its ledger entry (see `bytes`), so that a sweep or a
//! reset that frees the slot gives them back exactly once; bytes split off
//! into a reservation of their own come back when it is dropped.

use crate::sync::{AtomicU64, Ordering};

/// The largest byte budget, and share, a bulkhead accepts: what a slot's
/// byte record can hold beside its generation (4 TiB).
pub(crate) const MAX_BYTES: u64 = (1 << 42) - 1;

#[derive(Debug)]
pub(crate) struct ByteBudget {
    max: u64,
    reserved: AtomicU64,
    /// The bytes each ledger entry's holder reserved, tagged with its
    /// generation (see `bytes`).
    pub(super) records: Box<[AtomicU64]>,
}

impl ByteBudget {
    /// A budget of `max` bytes for a ledger of `entries`.
    pub(crate) fn new(max: u64, entries: usize) -> Self {
        Self {
            max: max.min(MAX_BYTES),
            reserved: AtomicU64::new(0),
            records: (0..entries).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Reserves `bytes`, if they fit within the budget beside what is
    /// reserved already.
    pub(crate) fn reserve(&self, bytes: u64) -> bool {
        let max = self.max;
        self.reserved
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |reserved| {
                reserved.checked_add(bytes).filter(|&total| total <= max)
            })
            .is_ok()
    }

    /// Gives back `bytes` reserved earlier. Never below zero: each
    /// reservation is given back once (see `bytes`), so the floor only
    /// guards the count against a bug of ours.
    pub(crate) fn give_back(&self, bytes: u64) {
        let _ = self
            .reserved
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |reserved| {
                debug_assert!(reserved >= bytes, "bytes given back twice");
                Some(reserved - bytes.min(reserved))
            });
    }

    /// Bytes reserved now.
    pub(crate) fn reserved(&self) -> u64 {
        self.reserved.load(Ordering::SeqCst)
    }
}

#[cfg(all(test, not(tower_inflight_loom)))]
mod tests {
    use super::*;

    #[test]
    fn reserves_up_to_the_budget_and_no_further() {
        let budget = ByteBudget::new(100, 0);
        assert!(budget.reserve(60));
        assert!(!budget.reserve(41));
        assert!(budget.reserve(40));
        budget.give_back(60);
        assert_eq!(budget.reserved(), 40);
    }

    #[test]
    fn an_overflowing_request_is_refused() {
        let budget = ByteBudget::new(MAX_BYTES, 0);
        assert!(budget.reserve(10));
        assert!(!budget.reserve(u64::MAX));
        assert_eq!(budget.reserved(), 10);
    }
}
