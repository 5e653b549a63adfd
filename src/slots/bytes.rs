//! The byte budget: how many bytes admitted calls may hold, beside how many
//! calls there are.
//!
//! One atomic word holds the bytes reserved. The bytes each holder reserved
//! on its slot are recorded beside its ledger entry and tagged with the
//! holder's generation, so that when a vanished holder's entry is
//! reclaimed (or reset) its bytes come back with it, and a holder that is
//! merely late finds its record gone and gives back nothing twice. Bytes
//! split off into a reservation of their own come back when it is dropped.
//!
//! Every access to a record, and to the entry words they are checked
//! against, is `SeqCst`: the holder, the sweep and the entry's next holder
//! each take a record by compare-and-exchange or swap, and the total order
//! over them is what makes the bytes come back once.

use crate::slots::ledger::{generation, GENERATION_BITS};
use crate::slots::table::SlotTable;
use crate::slots::Claim;
use crate::sync::{AtomicU64, Ordering};

/// The largest byte budget, and share, a bulkhead accepts: what a slot's
/// byte record can hold beside its generation (4 TiB).
pub(crate) const MAX_BYTES: u64 = (1 << 42) - 1;

#[derive(Debug)]
pub(crate) struct ByteBudget {
    max: u64,
    reserved: AtomicU64,
    /// The bytes each ledger entry's holder reserved, tagged with its
    /// generation.
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

    /// Gives back `bytes` reserved earlier: each reservation once.
    pub(crate) fn give_back(&self, bytes: u64) {
        let before = self.reserved.fetch_sub(bytes, Ordering::SeqCst);
        debug_assert!(before >= bytes, "bytes given back twice");
    }

    /// Bytes reserved now.
    pub(crate) fn reserved(&self) -> u64 {
        self.reserved.load(Ordering::SeqCst)
    }
}

impl SlotTable {
    /// Reserves `bytes` of the budget for the holder of `claim` and records
    /// them beside its entry. `false` if they do not fit (or there is no
    /// budget), or if `claim` no longer holds its entry: a claim that sat
    /// past `reclaim_after` before it was used, and was swept meanwhile,
    /// must never write over the record of the entry's next holder.
    pub(crate) fn reserve_bytes(&self, claim: &Claim, bytes: u64) -> bool {
        let Some(budget) = self
            .budget
            .as_deref()
            .filter(|budget| budget.reserve(bytes))
        else {
            return false;
        };
        let (entry, record) = (
            self.ledger.entry(claim.index()),
            &budget.records[claim.index()],
        );
        let mine = (bytes << GENERATION_BITS) | generation(claim.word());
        let mut current = record.load(Ordering::SeqCst);
        loop {
            if entry.load(Ordering::SeqCst) != claim.word() {
                budget.give_back(bytes);
                return false;
            }
            match record.compare_exchange(current, mine, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => break,
                Err(actual) => current = actual,
            }
        }
        // This claim holds the entry, so a record with bytes on it is that
        // of a holder swept before it recorded them: they come back now,
        // once, since the record was taken.
        let stale = current >> GENERATION_BITS;
        if stale != 0 {
            budget.give_back(stale);
        }
        // Swept between the check and the record: the sweep gave back what
        // it found, and this record is undone here unless the entry's next
        // holder took it first (and gave its bytes back).
        if entry.load(Ordering::SeqCst) != claim.word() {
            let undone = record.compare_exchange(
                mine,
                generation(claim.word()),
                Ordering::SeqCst,
                Ordering::Relaxed,
            );
            if undone.is_ok() {
                budget.give_back(bytes);
            }
            return false;
        }
        true
    }

    /// The holder of `claim` takes its `bytes` off its entry's record, to
    /// give them back or to hold them apart from the slot. `false` if they
    /// are no longer there: a reclaim or a reset has given them back.
    pub(crate) fn unrecord_bytes(&self, claim: &Claim, bytes: u64) -> bool {
        let mine = (bytes << GENERATION_BITS) | generation(claim.word());
        // A record is told apart by its 22-bit generation: the entry still
        // holding this claim's word rules out a newer holder's.
        let swept = self.ledger.entry(claim.index()).load(Ordering::SeqCst) != claim.word();
        !swept
            && self.budget.as_deref().is_some_and(|budget| {
                budget.records[claim.index()]
                    .compare_exchange(
                        mine,
                        generation(claim.word()),
                        Ordering::SeqCst,
                        Ordering::Relaxed,
                    )
                    .is_ok()
            })
    }

    pub(crate) fn give_back_bytes(&self, bytes: u64) {
        if let Some(budget) = &self.budget {
            budget.give_back(bytes);
        }
    }

    pub(crate) fn bytes_reserved(&self) -> u64 {
        self.budget.as_deref().map_or(0, ByteBudget::reserved)
    }

    /// After entry `index` was freed from `word` by a sweep or a reset:
    /// gives back the bytes its holder had recorded, if they are still
    /// there.
    pub(super) fn give_back_recorded_bytes(&self, index: usize, word: u64) {
        let Some(budget) = &self.budget else {
            return;
        };
        let record = &budget.records[index];
        let held = record.load(Ordering::SeqCst);
        let taken = generation(held) == generation(word)
            && held >> GENERATION_BITS != 0
            && record
                .compare_exchange(held, generation(word), Ordering::SeqCst, Ordering::Relaxed)
                .is_ok();
        if taken {
            budget.give_back(held >> GENERATION_BITS);
        }
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

    const HOLD: u64 = 100;

    fn table(limit: usize) -> SlotTable {
        SlotTable::new(limit, 1, HOLD, Some(1000))
    }

    #[test]
    fn reclaiming_a_slot_gives_back_the_bytes_its_holder_recorded() {
        let table = table(1);
        let old = table.try_claim(1, Ordering::Relaxed).unwrap();
        assert!(table.reserve_bytes(&old, 800));
        assert_eq!(table.bytes_reserved(), 800);
        let new = table.try_claim(1 + HOLD, Ordering::Relaxed).unwrap();
        assert_eq!(table.bytes_reserved(), 0);
        assert!(
            !table.unrecord_bytes(&old, 800),
            "the late holder finds nothing to give back"
        );
        assert!(table.reserve_bytes(&new, 900));
        assert!(table.unrecord_bytes(&new, 900));
    }

    #[test]
    fn expired_bytes_come_back_with_their_slot_once() {
        let table = table(2);
        let leaked = table.try_claim(1, Ordering::Relaxed).unwrap();
        assert!(table.reserve_bytes(&leaked, 800));
        assert_eq!(table.reclaim_expired(HOLD), 0, "not expired yet");
        assert_eq!(table.bytes_reserved(), 800);
        assert_eq!(table.reclaim_expired(1 + HOLD), 1);
        assert_eq!((table.bytes_reserved(), table.in_flight()), (0, 0));
        assert_eq!(table.reclaim_expired(1 + HOLD), 0, "once only");
        assert!(
            !table.unrecord_bytes(&leaked, 800),
            "the late holder finds nothing"
        );
    }

    #[test]
    fn a_grant_swept_before_it_records_its_bytes_records_nothing() {
        let table = table(1);
        let late = table.try_claim(1, Ordering::Relaxed).unwrap();
        assert_eq!(table.reclaim_expired(1 + HOLD), 1);
        let next = table.try_claim(1 + HOLD, Ordering::Relaxed).unwrap();
        assert!(!table.reserve_bytes(&late, 300));
        assert_eq!(table.bytes_reserved(), 0);
        assert!(table.reserve_bytes(&next, 700));
        assert_eq!(table.bytes_reserved(), 700);
    }

    #[test]
    fn a_record_stored_by_the_entry_s_next_holder_is_never_taken() {
        let table = table(1);
        let leaked = table.try_claim(1, Ordering::Relaxed).unwrap();
        assert!(table.reserve_bytes(&leaked, 600));
        let next = table.try_claim(1 + HOLD, Ordering::Relaxed).unwrap();
        assert_eq!(
            table.bytes_reserved(),
            0,
            "the sweep took the leaked bytes back"
        );
        assert!(table.reserve_bytes(&next, 700));
        assert_eq!(table.reclaim_expired(1 + HOLD), 0);
        assert_eq!(table.bytes_reserved(), 700);
        assert!(
            table.unrecord_bytes(&next, 700),
            "its record is still there"
        );
    }
}
