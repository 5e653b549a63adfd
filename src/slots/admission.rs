//! The admission count: the slots held, the limit in force, and the slots
//! reclaimed and not yet taken again, in one word.
//!
//! The count and the limit live in one word so that a claim compares the
//! count with the limit it is admitted under in the same
//! compare-and-exchange that takes its slots: a limit lowered meanwhile
//! makes the exchange fail and the claim read again, so no claim is ever
//! admitted over the limit in force when it was admitted. The reclaimed
//! slots ride along at no cost, so that each of the claims that take them
//! up learns it (`Permit::was_reclaimed`).
//!
//! # Memory ordering
//!
//! A claim's exchange is `AcqRel`: it acquires the work of the holders whose
//! releases it follows in the word's modification order. A release is
//! `SeqCst`, and so is the load a waiting caller makes after it counts
//! itself in among the parked: with the releaser's `SeqCst` load of that
//! count afterwards, this is the store-buffering pattern that guarantees
//! either the releaser sees the waiter or the waiter sees the freed slots.

use crate::sync::{AtomicU64, Ordering};

/// Each field holds up to `MAX_SLOTS` (2^20).
const FIELD_BITS: u32 = 21;
const HELD: u64 = (1 << FIELD_BITS) - 1;
const LIMIT_SHIFT: u32 = FIELD_BITS;
const RECLAIMED_SHIFT: u32 = 2 * FIELD_BITS;
const RECLAIMED_ONE: u64 = 1 << RECLAIMED_SHIFT;

/// The word, and beside it on one cache line the total of claims admitted,
/// which every admission writes too: on lines of their own, two cores
/// taking slots at once would pass two lines back and forth, not one.
#[derive(Debug)]
#[repr(C, align(16))]
pub(super) struct Admission {
    /// Slots held (low 21 bits), the limit in force (the next 21), and
    /// slots freed by reclaim that no claim has taken since (the top 22).
    word: AtomicU64,
    /// Claims admitted, by any path: counted by the bulkhead as it makes
    /// each permit.
    pub(super) admitted: AtomicU64,
}

fn limit_of(word: u64) -> u64 {
    (word >> LIMIT_SHIFT) & HELD
}

impl Admission {
    pub(super) fn new(limit: usize) -> Self {
        Self {
            word: AtomicU64::new((limit as u64) << LIMIT_SHIFT),
            admitted: AtomicU64::new(0),
        }
    }

    /// Takes `weight` slots if they fit under the limit in force; the load
    /// that decides is made with `order`. `Some(true)` if any of them had
    /// been reclaimed and not taken since.
    #[inline(always)]
    pub(super) fn try_take(&self, weight: usize, order: Ordering) -> Option<bool> {
        let weight = weight as u64;
        let mut word = self.word.load(order);
        loop {
            if (word & HELD) + weight > limit_of(word) {
                return None;
            }
            let reclaimed = (word >> RECLAIMED_SHIFT).min(weight);
            match self.word.compare_exchange_weak(
                word,
                word + weight - reclaimed * RECLAIMED_ONE,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Some(reclaimed > 0),
                Err(actual) => word = actual,
            }
        }
    }

    /// Gives back `weight` slots taken by [`try_take`](Self::try_take).
    #[inline(always)]
    pub(super) fn give_back(&self, weight: usize) {
        // `SeqCst`: the releaser's side of the store-buffering pattern.
        let before = self.word.fetch_sub(weight as u64, Ordering::SeqCst);
        debug_assert!(before & HELD >= weight as u64, "a count below zero");
    }

    /// Gives back `weight` slots freed by a sweep (`reclaimed`: the claims
    /// that take them next learn it) or by a reset (not: a reset frees
    /// everything alike, and forgets the reclaimed ones too).
    pub(super) fn give_back_freed(&self, weight: usize, reclaimed: bool) {
        let weight = weight as u64;
        let _ = self
            .word
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |word| {
                let unclaimed = match reclaimed {
                    true => ((word >> RECLAIMED_SHIFT) + weight).min(HELD),
                    false => 0,
                };
                Some(
                    ((word & !(u64::MAX << RECLAIMED_SHIFT)) - weight)
                        | unclaimed << RECLAIMED_SHIFT,
                )
            });
    }

    /// Slots held now.
    #[inline]
    pub(super) fn held(&self) -> usize {
        (self.word.load(Ordering::SeqCst) & HELD) as usize
    }

    /// The limit in force now.
    #[inline]
    pub(super) fn limit(&self) -> usize {
        limit_of(self.word.load(Ordering::Relaxed)) as usize
    }

    /// Whether `weight` slots fit under the limit now.
    #[inline]
    pub(super) fn fits(&self, weight: usize) -> bool {
        let word = self.word.load(Ordering::SeqCst);
        (word & HELD) + weight as u64 <= limit_of(word)
    }

    /// Puts `limit` in force. The slots held stay held: with fewer allowed
    /// than are held, no claim fits until enough are given back.
    pub(super) fn set_limit(&self, limit: usize) {
        let _ = self
            .word
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |word| {
                Some((word & !(HELD << LIMIT_SHIFT)) | ((limit as u64) << LIMIT_SHIFT))
            });
    }
}

#[cfg(all(test, not(tower_inflight_loom)))]
mod tests {
    use super::*;

    /// The word and the admissions total are one 16-byte block at 16-byte
    /// alignment: whatever the allocation, they never fall on two cache
    /// lines.
    #[test]
    fn the_word_and_the_total_are_one_aligned_block() {
        assert_eq!(std::mem::size_of::<Admission>(), 16);
        assert_eq!(std::mem::align_of::<Admission>(), 16);
        let admission = Admission::new(4);
        let word = std::ptr::addr_of!(admission.word) as usize;
        let total = std::ptr::addr_of!(admission.admitted) as usize;
        assert_eq!((word % 16, total - word), (0, 8));
    }
}
