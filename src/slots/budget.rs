//! The byte budget: how many bytes admitted calls may hold, beside how many
//! calls there are.
//!
//! One atomic word holds the bytes reserved (low 48 bits) and an epoch (high
//! 16 bits) that `reset` bumps: a reservation made before a reset gives
//! nothing back after it, so the count can never be driven below what is
//! really held.

use crate::sync::{AtomicU64, Ordering};

const RESERVED_BITS: u32 = 48;
const RESERVED_MASK: u64 = (1 << RESERVED_BITS) - 1;

/// The largest byte budget, and share, a bulkhead accepts: what a slot's
/// byte record can hold beside its generation (4 TiB).
pub(crate) const MAX_BYTES: u64 = (1 << 42) - 1;

#[derive(Debug)]
pub(crate) struct ByteBudget {
    max: u64,
    state: AtomicU64,
}

/// The epoch a reservation was made in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Epoch(u64);

/// A holder's share of the budget: its bytes (low 48 bits) and the epoch
/// they were reserved in (high 16), in one word, so that a permit stays
/// small enough to move in registers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Share(u64);

impl Share {
    pub(crate) const NONE: Share = Share(0);

    pub(crate) fn new(bytes: u64, epoch: Epoch) -> Self {
        Share((bytes & RESERVED_MASK) | (epoch.0 << RESERVED_BITS))
    }

    #[inline]
    pub(crate) fn bytes(self) -> u64 {
        self.0 & RESERVED_MASK
    }

    pub(crate) fn epoch(self) -> Epoch {
        Epoch(self.0 >> RESERVED_BITS)
    }
}

impl ByteBudget {
    pub(crate) fn new(max: u64) -> Self {
        Self {
            max: max.min(MAX_BYTES),
            state: AtomicU64::new(0),
        }
    }

    /// Reserves `bytes` if they fit beside what is reserved already.
    ///
    /// Every access to the budget's word is `SeqCst`: it is off the fast
    /// path, and its reservations and returns order with the slot records
    /// (see `SlotTable::reserve_bytes`).
    pub(crate) fn reserve(&self, bytes: u64) -> Option<Epoch> {
        let max = self.max;
        self.state
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |state| {
                let reserved = (state & RESERVED_MASK).checked_add(bytes)?;
                (reserved <= max).then_some((state & !RESERVED_MASK) | reserved)
            })
            .ok()
            .map(|state| Epoch(state >> RESERVED_BITS))
    }

    /// Returns `bytes` reserved in `epoch`; nothing if a reset came since.
    pub(crate) fn give_back(&self, bytes: u64, epoch: Epoch) {
        let _ = self
            .state
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |state| {
                (state >> RESERVED_BITS == epoch.0)
                    .then(|| state - bytes.min(state & RESERVED_MASK))
            });
    }

    /// Returns `bytes` of a holder that vanished, whenever they were reserved
    /// since the last reset.
    pub(crate) fn give_back_abandoned(&self, bytes: u64) {
        let _ = self
            .state
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |state| {
                Some(state - bytes.min(state & RESERVED_MASK))
            });
    }

    pub(crate) fn reserved(&self) -> u64 {
        self.state.load(Ordering::SeqCst) & RESERVED_MASK
    }

    /// Forgets every reservation.
    pub(crate) fn reset(&self) {
        let _ = self
            .state
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |state| {
                Some(((state >> RESERVED_BITS).wrapping_add(1)) << RESERVED_BITS)
            });
    }
}

#[cfg(all(test, not(tower_inflight_loom)))]
mod tests {
    use super::*;

    #[test]
    fn reserves_up_to_the_budget_and_no_further() {
        let budget = ByteBudget::new(100);
        let epoch = budget.reserve(60).unwrap();
        assert_eq!(budget.reserve(41), None);
        assert!(budget.reserve(40).is_some());
        budget.give_back(60, epoch);
        assert_eq!(budget.reserved(), 40);
    }

    #[test]
    fn a_reservation_from_before_a_reset_gives_nothing_back() {
        let budget = ByteBudget::new(100);
        let old = budget.reserve(60).unwrap();
        budget.reset();
        let new = budget.reserve(30).unwrap();
        budget.give_back(60, old);
        assert_eq!(budget.reserved(), 30);
        budget.give_back(30, new);
        assert_eq!(budget.reserved(), 0);
    }

    #[test]
    fn an_overflowing_request_is_refused() {
        let budget = ByteBudget::new(MAX_BYTES);
        budget.reserve(10).unwrap();
        assert_eq!(budget.reserve(u64::MAX), None);
    }
}
