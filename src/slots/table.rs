//! The slot table: one atomic word a slot, the whole of the fast path.
//!
//! A slot word packs the deadline until which the slot counts as held (high
//! 42 bits, in clock ticks) and a generation (low 22 bits) that every write to
//! the slot bumps. A slot is free exactly when its deadline has passed; a
//! released slot has deadline 0, which has always passed. There is no "free"
//! value to race for: acquire compares-and-exchanges the exact word it read,
//! and release compares-and-exchanges the exact word acquire wrote, so a
//! holder whose slot was reclaimed (or cleared by `reset`) and handed on can
//! never free the new holder's slot. Deadline and generation together make a
//! word unique: it would take 2^22 writes to one slot within one tick for a
//! word to repeat.
//!
//! With a byte budget, a slot also records the bytes its holder reserved
//! (see `bytes`).
//!
//! # Memory ordering
//!
//! A claim is `AcqRel`, so whatever the previous holder did happens-before
//! the next holder's work. A release is `SeqCst`, and so are the loads that
//! the waiter queue makes of the slots after it counts a new waiter in: with
//! the releaser's `SeqCst` load of that count, this is the store-buffering
//! pattern that guarantees either the releaser sees the waiter or the waiter
//! sees the freed slot, so no caller parks beside a free slot.

use crate::slots::{ByteBudget, Claim};
use crate::sync::{lock, AtomicU64, Mutex, Ordering};
use std::cell::Cell;

pub(super) const GENERATION_BITS: u32 = 22;
const GENERATION_MASK: u64 = (1 << GENERATION_BITS) - 1;
/// The largest deadline a word can hold: about 136 years of ticks.
pub(crate) const MAX_DEADLINE: u64 = u64::MAX >> GENERATION_BITS;

/// The largest `limit` a bulkhead accepts. A saturated acquire reads every
/// slot, so the table must stay small enough to scan in microseconds.
pub(crate) const MAX_SLOTS: usize = 1 << 16;

/// One slot on its own cache line, so callers that hold neighbouring slots
/// do not slow each other down.
#[derive(Debug)]
#[repr(align(64))]
pub(super) struct Slot {
    pub(super) word: AtomicU64,
    /// Bytes the holder reserved (high 42 bits) and its generation (low 22).
    pub(super) bytes: AtomicU64,
    /// Admissions on this slot, ever. Only its holder writes it, on a
    /// cache line it has just made its own.
    pub(super) claims: AtomicU64,
}

#[derive(Debug)]
pub(crate) struct SlotTable {
    pub(super) slots: Box<[Slot]>,
    /// `reclaim_after`, in ticks.
    pub(super) hold: u64,
    pub(super) budget: Option<ByteBudget>,
    /// The other slots of each weighted claim, found by the claim that
    /// stands for them. Touched only by weighted claims and their releases.
    pub(super) companions: Mutex<Vec<(Claim, Box<[Claim]>)>>,
    /// A claim samples the table when its slot's claim count, masked with
    /// this, is 1: at each slot's first claim, then often enough to see
    /// peaks, and rarely enough that the scan costs under a slot's read per
    /// claim.
    sample_mask: u64,
}

pub(super) fn deadline(word: u64) -> u64 {
    word >> GENERATION_BITS
}

pub(super) fn generation(word: u64) -> u64 {
    word & GENERATION_MASK
}

pub(super) fn next_generation(word: u64) -> u64 {
    (word.wrapping_add(1)) & GENERATION_MASK
}

impl SlotTable {
    pub(crate) fn new(limit: usize, hold: u64, max_bytes: Option<u64>) -> Self {
        let slots = (0..limit)
            .map(|_| Slot {
                word: AtomicU64::new(0),
                bytes: AtomicU64::new(0),
                claims: AtomicU64::new(0),
            })
            .collect();
        Self {
            slots,
            hold,
            budget: max_bytes.map(ByteBudget::new),
            companions: Mutex::new(Vec::new()),
            sample_mask: (limit.max(64) as u64).next_power_of_two() - 1,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Takes the first free slot at or after this thread's start index.
    #[inline(always)]
    pub(crate) fn try_claim(&self, now: u64, order: Ordering) -> Option<Claim> {
        let (index, word, until) = self.take_free(now, order)?;
        // The admissions this claim would make the slot's count, if it is
        // admitted (see `count_admission`).
        let claims = self.slots[index]
            .claims
            .load(Ordering::Relaxed)
            .wrapping_add(1);
        let claim = Claim::new(index, word, until != 0, claims & self.sample_mask == 1);
        if claim.reclaimed() {
            self.recover_abandoned_bytes(&claim);
        }
        Some(claim)
    }

    /// Writes a held word over the first free slot found; returns its index,
    /// the word written and the deadline it replaced.
    #[inline(always)]
    pub(super) fn take_free(&self, now: u64, order: Ordering) -> Option<(usize, u64, u64)> {
        let held_until = now.saturating_add(self.hold).min(MAX_DEADLINE) << GENERATION_BITS;
        // A local slice and two plain ranges (from the start index to the
        // end, then from 0): indexing `self.slots` with a wrapping index
        // reloaded the table's address and length and checked bounds on
        // every slot, and a shed scans them all.
        let slots = &self.slots[..];
        let take = |index: usize| {
            let slot = &slots[index];
            let word = slot.word.load(order);
            let until = deadline(word);
            let new = held_until | next_generation(word);
            // `AcqRel`: acquires what the previous holder did before its
            // release, and releases the weighted-claim count raised before
            // it (see `Waiters::unchanged`). A failure learns nothing, so
            // `Relaxed`.
            (until <= now
                && slot
                    .word
                    .compare_exchange(word, new, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok())
            .then_some((index, new, until))
        };
        let start = start_index(slots.len());
        (start..slots.len())
            .find_map(take)
            .or_else(|| (0..start).find_map(take))
    }

    /// Frees the claim's slots that still hold the words it wrote. Returns
    /// how many it freed: fewer than its weight means some were reclaimed or
    /// reset since, and belong to someone else now.
    #[inline(always)]
    pub(crate) fn release(&self, claim: &Claim) -> usize {
        let companions = if claim.is_weighted() {
            self.release_companions(claim)
        } else {
            0
        };
        usize::from(self.release_one(claim)) + companions
    }

    #[inline(always)]
    pub(super) fn release_one(&self, claim: &Claim) -> bool {
        let freed = generation(claim.word());
        // `SeqCst`: one side of the store-buffering pattern with the waiter
        // queue (this store, then the releaser's load of the parked count,
        // against an arrival's count, then its load of the slots): one of
        // the two sees the other, so nobody parks beside this slot.
        self.slots[claim.index()]
            .word
            .compare_exchange(claim.word(), freed, Ordering::SeqCst, Ordering::Relaxed)
            .is_ok()
    }

    /// Frees every slot, whoever holds it. Each word gets a new generation, so
    /// the permits that held them can no longer release anything.
    pub(crate) fn reset(&self) {
        lock(&self.companions).clear();
        for slot in self.slots.iter() {
            // `SeqCst`, as a release is: a slot freed here is found by
            // waiters exactly as a released one is.
            let previous = slot
                .word
                .fetch_update(Ordering::SeqCst, Ordering::Relaxed, |word| {
                    Some(next_generation(word))
                })
                .unwrap_or_else(|word| word);
            // An empty record tagged with the new generation, never 0: a
            // holder from before the reset that is about to record its bytes
            // compares against the record it read, which no longer matches.
            slot.bytes
                .store(next_generation(previous), Ordering::SeqCst);
        }
        if let Some(budget) = &self.budget {
            budget.reset();
        }
    }

    /// Counts the admission of `claim`, a call that got its slot: on the
    /// slot's own count, which only its holder writes, so a plain store does
    /// without a locked instruction. A claim given back without being
    /// admitted (its caller went away, its bytes did not fit) is never
    /// counted, so the total only ever grows.
    #[inline(always)]
    pub(crate) fn count_admission(&self, claim: &Claim) {
        let slot = &self.slots[claim.index()];
        let claims = slot.claims.load(Ordering::Relaxed).wrapping_add(1);
        slot.claims.store(claims, Ordering::Relaxed);
    }

    /// Admissions on every slot, ever.
    pub(crate) fn claims(&self) -> u64 {
        self.slots
            .iter()
            .map(|slot| slot.claims.load(Ordering::Relaxed))
            .sum()
    }

    /// The tick at which `claim` was made.
    pub(crate) fn claimed_at(&self, claim: &Claim) -> u64 {
        deadline(claim.word()).saturating_sub(self.hold)
    }

    /// How many slots are held at `now`.
    pub(crate) fn held(&self, now: u64) -> usize {
        self.slots
            .iter()
            .filter(|slot| deadline(slot.word.load(Ordering::Relaxed)) > now)
            .count()
    }

    /// Whether any slot is free at `now`, without taking it.
    pub(crate) fn any_free(&self, now: u64) -> bool {
        self.has_free(now, 1)
    }
}

/// Where this thread starts its scan: a per-thread hash mapped onto
/// `0..len` by a multiply and a shift (a division would cost more than the
/// rest of the claim), so threads spread out over the table instead of all
/// fighting over slot 0, while one thread keeps finding the slot it released.
#[inline]
fn start_index(len: usize) -> usize {
    thread_local! {
        static HASH: Cell<u32> = const { Cell::new(0) };
    }
    let hash = HASH.with(|hash| {
        let mut value = hash.get();
        if value == 0 {
            value = new_thread_hash();
            hash.set(value);
        }
        value
    });
    ((u64::from(hash) * len as u64) >> 32) as usize
}

#[cold]
fn new_thread_hash() -> u32 {
    use std::sync::atomic::AtomicU32;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // Successive threads land far apart: Fibonacci hashing of a counter.
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    n.wrapping_mul(0x9E37_79B9).max(1)
}

#[cfg(all(test, not(tower_inflight_loom)))]
mod tests {
    use super::*;

    const HOLD: u64 = 100;

    #[test]
    fn claims_until_full_then_refuses() {
        let table = SlotTable::new(3, HOLD, None);
        let claims: Vec<_> = (0..3)
            .map(|_| table.try_claim(1, Ordering::Relaxed))
            .collect();
        assert!(claims.iter().all(Option::is_some));
        assert_eq!(table.held(1), 3);
        assert_eq!(table.try_claim(1, Ordering::Relaxed), None);
    }

    #[test]
    fn release_frees_exactly_one_slot() {
        let table = SlotTable::new(2, HOLD, None);
        let a = table.try_claim(1, Ordering::Relaxed).unwrap();
        let _b = table.try_claim(1, Ordering::Relaxed).unwrap();
        assert_eq!(table.release(&a), 1);
        assert_eq!(table.held(1), 1);
        assert_eq!(table.release(&a), 0, "a second release must do nothing");
        assert_eq!(table.held(1), 1);
    }

    #[test]
    fn expired_slot_is_reclaimed_and_late_release_leaves_new_holder() {
        let table = SlotTable::new(1, HOLD, None);
        let old = table.try_claim(1, Ordering::Relaxed).unwrap();
        assert!(!old.reclaimed());
        assert_eq!(table.try_claim(HOLD, Ordering::Relaxed), None);
        let new = table.try_claim(1 + HOLD, Ordering::Relaxed).unwrap();
        assert!(new.reclaimed());
        assert_eq!(table.release(&old), 0);
        assert_eq!(table.held(1 + HOLD), 1);
        assert_eq!(table.release(&new), 1);
    }

    #[test]
    fn reset_in_the_same_tick_gives_new_holders_new_words() {
        let table = SlotTable::new(1, HOLD, None);
        let old = table.try_claim(5, Ordering::Relaxed).unwrap();
        table.reset();
        let new = table.try_claim(5, Ordering::Relaxed).unwrap();
        assert_ne!(old.word(), new.word());
        assert_eq!(table.release(&old), 0);
        assert_eq!(table.held(5), 1);
    }

    #[test]
    fn generation_wraps_without_touching_the_deadline() {
        let word = (7 << GENERATION_BITS) | GENERATION_MASK;
        assert_eq!(next_generation(word), 0);
        assert_eq!(deadline(word), 7);
    }

    #[test]
    fn huge_hold_saturates_instead_of_wrapping() {
        let table = SlotTable::new(1, u64::MAX, None);
        let claim = table.try_claim(1, Ordering::Relaxed).unwrap();
        assert_eq!(deadline(claim.word()), MAX_DEADLINE);
        assert_eq!(table.held(MAX_DEADLINE - 1), 1);
    }

    #[test]
    fn start_index_stays_in_range() {
        for len in [1, 2, 3, 25, 64, MAX_SLOTS] {
            assert!(start_index(len) < len);
        }
    }
}
