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
//! With a byte budget, a slot also records the bytes its holder reserved,
//! tagged with the holder's generation, so that when a vanished holder's slot
//! is reclaimed, its bytes come back with it; a holder that is merely late
//! finds its record gone and gives back nothing twice.
//!
//! # Memory ordering
//!
//! A claim is `AcqRel`, so whatever the previous holder did happens-before
//! the next holder's work. A release is `SeqCst`, and so are the loads that
//! the waiter queue makes of the slots after it counts a new waiter in: with
//! the releaser's `SeqCst` load of that count, this is the store-buffering
//! pattern that guarantees either the releaser sees the waiter or the waiter
//! sees the freed slot, so no caller parks beside a free slot.

use crate::slots::{ByteBudget, Epoch};
use crate::sync::{lock, AtomicU64, Mutex, Ordering};
use std::cell::Cell;
use std::num::NonZeroU64;

const GENERATION_BITS: u32 = 22;
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
struct Slot {
    word: AtomicU64,
    /// Bytes the holder reserved (high 42 bits) and its generation (low 22).
    bytes: AtomicU64,
    /// Claims of this slot, ever. Only the claimer writes it, right after
    /// its compare-and-exchange, on a cache line it has just made its own.
    claims: AtomicU64,
}

/// A slot held by a claim: its index and the exact word the claim wrote,
/// and two flags. Sixteen bytes with a niche, so that an `Option<Claim>`
/// travels in two registers rather than being pieced together in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Claim {
    word: NonZeroU64,
    /// The slot's index in the low 20 bits; for a weighted claim, the
    /// weight less one and how many of its slots were reclaimed, 20 bits
    /// each; `RECLAIMED` and `SAMPLE` in the top bits.
    tagged_index: u64,
}

const RECLAIMED: u64 = 1 << 63;
const SAMPLE: u64 = 1 << 62;
/// Fields of a weighted claim (see `try_claim_weighted`): each holds up to
/// `MAX_SLOTS`.
const FIELD_BITS: u32 = 20;
const FIELD_MASK: u64 = (1 << FIELD_BITS) - 1;
const INDEX_MASK: u64 = FIELD_MASK;
const WEIGHT_SHIFT: u32 = FIELD_BITS;
const WEIGHT_MASK: u64 = FIELD_MASK << WEIGHT_SHIFT;
const RECLAIMS_SHIFT: u32 = 2 * FIELD_BITS;

impl Claim {
    #[inline]
    fn new(index: usize, word: u64, reclaimed: bool, sample: bool) -> Self {
        // A held word is never 0: its deadline is at least 1.
        let word = NonZeroU64::new(word).unwrap_or(NonZeroU64::MIN);
        let tagged_index =
            index as u64 | (u64::from(reclaimed) * RECLAIMED) | (u64::from(sample) * SAMPLE);
        Self { word, tagged_index }
    }

    #[inline]
    pub(crate) fn index(&self) -> usize {
        (self.tagged_index & INDEX_MASK) as usize
    }

    #[inline]
    pub(crate) fn word(&self) -> u64 {
        self.word.get()
    }

    /// The slot was taken from a holder whose deadline passed without a release.
    #[inline]
    pub(crate) fn reclaimed(&self) -> bool {
        self.tagged_index & RECLAIMED != 0
    }

    /// Whether the claim holds companion slots besides its own.
    #[inline]
    pub(crate) fn is_weighted(&self) -> bool {
        self.tagged_index & WEIGHT_MASK != 0
    }

    /// How many slots the claim holds.
    #[inline]
    pub(crate) fn weight(&self) -> usize {
        ((self.tagged_index & WEIGHT_MASK) >> WEIGHT_SHIFT) as usize + 1
    }

    /// How many of the claim's slots were reclaimed from holders that
    /// vanished (and so were counted as held already).
    #[inline]
    pub(crate) fn reclaimed_slots(&self) -> usize {
        if self.is_weighted() {
            ((self.tagged_index >> RECLAIMS_SHIFT) & FIELD_MASK) as usize
        } else {
            usize::from(self.reclaimed())
        }
    }

    /// The claim, marked as standing for `weight` slots, `reclaims` of which
    /// were reclaimed (and as reclaimed if any was).
    fn weighted(mut self, weight: usize, reclaims: usize) -> Self {
        let reclaims = reclaims as u64;
        self.tagged_index = (self.tagged_index & !RECLAIMED)
            | ((weight as u64 - 1) << WEIGHT_SHIFT)
            | (reclaims << RECLAIMS_SHIFT)
            | (u64::from(reclaims > 0) * RECLAIMED);
        self
    }

    /// This claim is one of those chosen to sample how many slots are held.
    #[inline]
    pub(crate) fn sample(&self) -> bool {
        self.tagged_index & SAMPLE != 0
    }
}

#[derive(Debug)]
pub(crate) struct SlotTable {
    slots: Box<[Slot]>,
    /// `reclaim_after`, in ticks.
    hold: u64,
    budget: Option<ByteBudget>,
    /// The other slots of each weighted claim, found by the claim that
    /// stands for them. Touched only by weighted claims and their releases.
    companions: Mutex<Vec<(Claim, Box<[Claim]>)>>,
    /// A claim samples the table when its slot's claim count, masked with
    /// this, is 1: at each slot's first claim, then often enough to see
    /// peaks, and rarely enough that the scan costs under a slot's read per
    /// claim.
    sample_mask: u64,
}

fn deadline(word: u64) -> u64 {
    word >> GENERATION_BITS
}

fn generation(word: u64) -> u64 {
    word & GENERATION_MASK
}

fn next_generation(word: u64) -> u64 {
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
        let slot = &self.slots[index];
        // Not `fetch_add`: the slot is ours, so a plain store does, without
        // a locked instruction.
        let claims = slot.claims.load(Ordering::Relaxed).wrapping_add(1);
        slot.claims.store(claims, Ordering::Relaxed);
        let claim = Claim::new(index, word, until != 0, claims & self.sample_mask == 1);
        if claim.reclaimed() {
            self.recover_abandoned_bytes(&claim);
        }
        Some(claim)
    }

    /// Writes a held word over the first free slot found; returns its index,
    /// the word written and the deadline it replaced.
    #[inline(always)]
    fn take_free(&self, now: u64, order: Ordering) -> Option<(usize, u64, u64)> {
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

    /// Takes `weight` slots together, or none: one claim stands for them all
    /// (the others are its companions, released with it). Counts as one
    /// claim, and is made only when `weight` slots look free, so that a
    /// weighted caller waiting at the head of the line does not churn slots
    /// on every release.
    pub(crate) fn try_claim_weighted(
        &self,
        now: u64,
        weight: usize,
        order: Ordering,
    ) -> Option<Claim> {
        if weight <= 1 {
            return self.try_claim(now, order);
        }
        if !self.has_free(now, weight) {
            return None;
        }
        let mut companions = Vec::with_capacity(weight - 1);
        for _ in 1..weight {
            let Some((index, word, until)) = self.take_free(now, order) else {
                // A caller on the fast path took one meanwhile: all or nothing.
                self.roll_back(&companions, now);
                return None;
            };
            if until != 0 {
                self.give_back_recorded_bytes(index, word);
            }
            companions.push(Claim::new(index, word, until != 0, false));
        }
        let Some(primary) = self.try_claim(now, order) else {
            self.roll_back(&companions, now);
            return None;
        };
        let reclaims = companions.iter().filter(|c| c.reclaimed()).count();
        let claim = primary.weighted(weight, reclaims + usize::from(primary.reclaimed()));
        let mut table = lock(&self.companions);
        // Entries of weighted claims that were leaked and reclaimed since.
        table.retain(|(primary, _)| {
            self.slots[primary.index()].word.load(Ordering::Relaxed) == primary.word()
        });
        table.push((claim, companions.into_boxed_slice()));
        Some(claim)
    }

    /// Gives back the slots of a weighted claim that could not be completed.
    /// A slot taken over from a vanished holder is left expired rather than
    /// released, so that it still counts as reclaimed when it is next
    /// claimed (its bytes have come back already).
    #[cold]
    fn roll_back(&self, companions: &[Claim], now: u64) {
        for companion in companions {
            let deadline = if companion.reclaimed() { now } else { 0 };
            let expired = (deadline << GENERATION_BITS) | generation(companion.word());
            let _ = self.slots[companion.index()].word.compare_exchange(
                companion.word(),
                expired,
                Ordering::SeqCst,
                Ordering::Relaxed,
            );
        }
    }

    /// Whether at least `wanted` slots are free at `now`.
    fn has_free(&self, now: u64, wanted: usize) -> bool {
        self.slots
            .iter()
            .filter(|slot| deadline(slot.word.load(Ordering::SeqCst)) <= now)
            .take(wanted)
            .count()
            == wanted
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
    fn release_one(&self, claim: &Claim) -> bool {
        let freed = generation(claim.word());
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
            let _ = slot
                .word
                .fetch_update(Ordering::SeqCst, Ordering::Relaxed, |word| {
                    Some(next_generation(word))
                });
            slot.bytes.store(0, Ordering::SeqCst);
        }
        if let Some(budget) = &self.budget {
            budget.reset();
        }
    }

    /// Frees the other slots of a weighted claim. Each is freed only if it
    /// still holds the word written for this claim, as any slot is, so a late
    /// release frees nothing that has been handed on.
    #[cold]
    fn release_companions(&self, claim: &Claim) -> usize {
        let mut table = lock(&self.companions);
        let Some(at) = table.iter().position(|(primary, _)| primary == claim) else {
            return 0;
        };
        let (_, companions) = table.swap_remove(at);
        drop(table);
        companions
            .iter()
            .filter(|companion| self.release_one(companion))
            .count()
    }

    /// Reserves `bytes` of the budget for the holder of `claim` and records
    /// them on its slot. `None` if they do not fit (or there is no budget).
    pub(crate) fn reserve_bytes(&self, claim: &Claim, bytes: u64) -> Option<Epoch> {
        let epoch = self.budget.as_ref()?.reserve(bytes)?;
        let record = (bytes << GENERATION_BITS) | generation(claim.word());
        self.slots[claim.index()]
            .bytes
            .store(record, Ordering::SeqCst);
        Some(epoch)
    }

    /// The holder of `claim` takes its `bytes` off its slot's record, to give
    /// them back or to hold them apart from the slot. `false` if they are no
    /// longer there: a reclaim or a reset has already given them back.
    pub(crate) fn unrecord_bytes(&self, claim: &Claim, bytes: u64) -> bool {
        let record = (bytes << GENERATION_BITS) | generation(claim.word());
        self.slots[claim.index()]
            .bytes
            .compare_exchange(
                record,
                generation(claim.word()),
                Ordering::SeqCst,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    pub(crate) fn give_back_bytes(&self, bytes: u64, epoch: Epoch) {
        if let Some(budget) = &self.budget {
            budget.give_back(bytes, epoch);
        }
    }

    pub(crate) fn bytes_reserved(&self) -> u64 {
        self.budget.as_ref().map_or(0, ByteBudget::reserved)
    }

    /// After `claim` took a slot whose holder vanished: gives back the bytes
    /// that holder had recorded.
    #[cold]
    fn recover_abandoned_bytes(&self, claim: &Claim) {
        self.give_back_recorded_bytes(claim.index(), claim.word());
    }

    /// After slot `index` was rewritten to `word` (a new generation) over a
    /// holder that vanished: gives back the bytes that holder had recorded.
    fn give_back_recorded_bytes(&self, index: usize, word: u64) {
        let Some(budget) = &self.budget else { return };
        let record = self.slots[index]
            .bytes
            .swap(generation(word), Ordering::SeqCst);
        let abandoned = record >> GENERATION_BITS;
        if abandoned != 0 && generation(record) != generation(word) {
            budget.give_back_abandoned(abandoned);
        }
    }

    /// Gives back the bytes of every holder that kept its slot past its
    /// deadline; returns whether any came back.
    ///
    /// A claim recovers an expired holder's bytes only when it lands on that
    /// very slot, and a free slot earlier in a caller's scan may always be
    /// taken first: so when the budget looks spent, this looks for such bytes
    /// everywhere before a call is shed for them.
    ///
    /// It takes the holder's record (tagged with the holder's generation)
    /// and leaves the slot's word alone. Taking the record with a
    /// compare-and-exchange is what makes the bytes come back exactly once:
    /// if a claimer takes the slot meanwhile, its own swap of the record
    /// either came first (and gave the bytes back) or finds the record
    /// emptied; a record the new holder stores has its generation, so it
    /// never matches. The slot, expired already, is free for anyone; the
    /// claim that takes it counts it as reclaimed, so the count of reclaims
    /// and of slots held stay one with the table. The late holder finds its
    /// record gone and gives back nothing.
    #[cold]
    pub(crate) fn recover_expired_bytes(&self, now: u64) -> bool {
        let Some(budget) = &self.budget else {
            return false;
        };
        let mut recovered = false;
        for slot in self.slots.iter() {
            let word = slot.word.load(Ordering::SeqCst);
            let until = deadline(word);
            if until == 0 || until > now {
                continue;
            }
            let record = slot.bytes.load(Ordering::SeqCst);
            let abandoned = record >> GENERATION_BITS;
            if abandoned == 0 || generation(record) != generation(word) {
                continue;
            }
            if slot
                .bytes
                .compare_exchange(
                    record,
                    generation(word),
                    Ordering::SeqCst,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                budget.give_back_abandoned(abandoned);
                recovered = true;
            }
        }
        recovered
    }

    /// Claims of every slot, ever.
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
    fn reclaiming_a_slot_gives_back_the_bytes_its_holder_recorded() {
        let table = SlotTable::new(1, HOLD, Some(1000));
        let old = table.try_claim(1, Ordering::Relaxed).unwrap();
        table.reserve_bytes(&old, 800).unwrap();
        assert_eq!(table.bytes_reserved(), 800);
        let new = table.try_claim(1 + HOLD, Ordering::Relaxed).unwrap();
        assert_eq!(table.bytes_reserved(), 0);
        assert!(
            !table.unrecord_bytes(&old, 800),
            "the late holder finds nothing to give back"
        );
        table.reserve_bytes(&new, 900).unwrap();
        assert!(table.unrecord_bytes(&new, 900));
    }

    #[test]
    fn expired_bytes_are_found_wherever_their_slot_is() {
        let table = SlotTable::new(2, HOLD, Some(1000));
        let leaked = table.try_claim(1, Ordering::Relaxed).unwrap();
        table.reserve_bytes(&leaked, 800).unwrap();
        assert!(!table.recover_expired_bytes(HOLD), "not expired yet");
        assert_eq!(table.bytes_reserved(), 800);
        assert!(table.recover_expired_bytes(1 + HOLD));
        assert_eq!(table.bytes_reserved(), 0);
        assert!(!table.recover_expired_bytes(1 + HOLD), "once only");
        assert!(
            !table.unrecord_bytes(&leaked, 800),
            "the late holder finds nothing"
        );
        // The slot itself is left for the next claim, which reclaims it.
        assert_eq!(table.held(1 + HOLD), 0);
        let mut reclaimer = None;
        while let Some(claim) = table.try_claim(1 + HOLD, Ordering::Relaxed) {
            if claim.index() == leaked.index() {
                reclaimer = Some(claim);
            }
        }
        assert!(reclaimer.is_some_and(|claim| claim.reclaimed()));
        assert_eq!(table.bytes_reserved(), 0, "nothing given back twice");
    }

    #[test]
    fn a_record_stored_by_the_slot_s_next_holder_is_never_taken() {
        let table = SlotTable::new(1, HOLD, Some(1000));
        let leaked = table.try_claim(1, Ordering::Relaxed).unwrap();
        table.reserve_bytes(&leaked, 600).unwrap();
        let next = table.try_claim(1 + HOLD, Ordering::Relaxed).unwrap();
        assert_eq!(
            table.bytes_reserved(),
            0,
            "the claim took the leaked bytes back"
        );
        table.reserve_bytes(&next, 700).unwrap();
        assert!(!table.recover_expired_bytes(1 + HOLD));
        assert_eq!(table.bytes_reserved(), 700);
        assert!(
            table.unrecord_bytes(&next, 700),
            "its record is still there"
        );
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
