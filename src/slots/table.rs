//! The slot table: the admission count and the ledger together, the whole
//! of the fast path.

use crate::slots::admission::Admission;
use crate::slots::ledger::{self, deadline, Ledger, GENERATION_BITS, MAX_DEADLINE};
use crate::slots::{ByteBudget, Claim};
use crate::sync::{lock, AtomicU64, AtomicUsize, Mutex, Ordering};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, DefaultHasher};

/// The weight of each claim of more than one slot, by its entry and word.
type WeightedClaims = HashMap<(usize, u64), usize, BuildHasherDefault<DefaultHasher>>;

/// The largest `limit` a bulkhead accepts.
pub(crate) const MAX_SLOTS: usize = 1 << 20;

#[derive(Debug)]
pub(crate) struct SlotTable {
    admission: Admission,
    pub(super) ledger: Ledger,
    /// `reclaim_after`, in ticks.
    hold: u64,
    /// The earliest tick a claim is dated from: one past the last reset's,
    /// so that a word written after a reset never repeats one written
    /// before it, however many times an entry is written within a tick (a
    /// clock that stands still, such as a `ManualClock`). A late release
    /// from before the reset then never matches. `Relaxed`: a reset stores
    /// it before its count's `SeqCst` update, which every claim admitted
    /// after the reset reads.
    floor: AtomicU64,
    pub(super) budget: Option<Box<ByteBudget>>,
    /// The entry and weight of each claim of more than one slot, which a
    /// sweep or a reset needs to give back their count. Locked by such a
    /// claim from before it writes its entry until it is listed.
    /// Its keys are the table's own, so it hashes them without a random
    /// seed, which would take 16 bytes in every table; allocated by the
    /// first such claim.
    weighted: Mutex<Option<Box<WeightedClaims>>>,
    /// Slots reclaimed by sweeps and not yet reported (see
    /// [`take_reclaimed`](Self::take_reclaimed)).
    reclaimed: AtomicUsize,
    /// The slots held, as a metrics gauge.
    #[cfg(feature = "metrics")]
    gauge: Option<metrics::Gauge>,
}

impl SlotTable {
    /// A table of `limit` slots, made at `now`, whose claims are held for
    /// `hold` ticks.
    pub(crate) fn new(limit: usize, now: u64, hold: u64, max_bytes: Option<u64>) -> Self {
        let ledger = Ledger::new(limit, now, hold);
        // A byte record beside each entry.
        let budget = max_bytes.map(|max| Box::new(ByteBudget::new(max, ledger.len())));
        Self {
            admission: Admission::new(limit),
            ledger,
            hold,
            floor: AtomicU64::new(0),
            budget,
            weighted: Mutex::default(),
            reclaimed: AtomicUsize::new(0),
            #[cfg(feature = "metrics")]
            gauge: None,
        }
    }

    /// Keeps `gauge` at the slots held.
    #[cfg(feature = "metrics")]
    pub(crate) fn with_gauge(mut self, gauge: metrics::Gauge) -> Self {
        self.gauge = Some(gauge);
        self
    }

    /// Moves the gauge, if there is one, by `slots` slots more held.
    #[inline(always)]
    fn gauge(&self, slots: f64) {
        #[cfg(feature = "metrics")]
        if let Some(gauge) = &self.gauge {
            gauge.increment(slots);
        }
        let _ = slots;
    }

    /// The largest limit: the one the table was made for.
    pub(crate) fn len(&self) -> usize {
        // The ledger is twice the largest limit (see `ledger`).
        self.ledger.len() / 2
    }

    /// The limit in force now.
    pub(crate) fn limit(&self) -> usize {
        self.admission.limit()
    }

    /// Puts `limit` (at most [`len`](Self::len)) in force. Raised, the new
    /// room is there for the next claim; lowered, no one is evicted, and
    /// nothing is admitted until the slots held are under it.
    pub(crate) fn set_limit(&self, limit: usize) {
        self.admission.set_limit(limit.clamp(1, self.len()));
    }

    /// Takes `weight` slots together, or none.
    #[inline(always)]
    pub(crate) fn try_claim_weighted(
        &self,
        now: u64,
        weight: usize,
        order: Ordering,
    ) -> Option<Claim> {
        // Read before the count: a sweep that ends between the two gave its
        // slots back before it moved the date on, so either the count shows
        // them, or this claim goes to the sweep's lock and then finds them.
        let sweep_due = self.ledger.sweep_due(now);
        match self.admission.try_take(weight, order) {
            Some(reclaimed) => Some(self.record(now, weight, reclaimed)),
            None if sweep_due => self.claim_after_sweep(now, weight),
            None => None,
        }
    }

    /// The table looked full with a sweep due: sweeps (or waits for the
    /// sweep under way), and tries again on what it freed.
    #[cold]
    #[inline(never)]
    fn claim_after_sweep(&self, now: u64, weight: usize) -> Option<Claim> {
        self.reclaim_expired(now);
        let reclaimed = self.admission.try_take(weight, Ordering::SeqCst)?;
        Some(self.record(now, weight, reclaimed))
    }

    /// Writes the ledger entry of a claim of `weight` slots the count has
    /// admitted, on slots `reclaimed` from holders that vanished or not.
    #[inline(always)]
    fn record(&self, now: u64, weight: usize, reclaimed: bool) -> Claim {
        self.gauge(weight as f64);
        let now = now.max(self.floor.load(Ordering::Relaxed));
        let held_until = now.saturating_add(self.hold).min(MAX_DEADLINE) << GENERATION_BITS;
        let start = ledger::start(self.ledger.len());
        let (index, word) = if weight == 1 {
            self.ledger.write(start, held_until)
        } else {
            let mut weighted = lock(&self.weighted);
            let (index, word) = self.ledger.write(start, held_until);
            weighted
                .get_or_insert_with(Box::default)
                .insert((index, word), weight);
            (index, word)
        };
        Claim::new(index, word, weight, reclaimed)
    }

    /// Frees the claim's slots if its entry still holds the word it wrote.
    /// Returns how many it freed: none means a reclaim or a reset freed
    /// them already, and they may belong to someone else now.
    #[inline(always)]
    pub(crate) fn release(&self, claim: &Claim) -> usize {
        if !self.ledger.free(claim.index(), claim.word()) {
            return 0;
        }
        let weight = claim.weight();
        if weight > 1 {
            self.unlist(claim.index(), claim.word());
        }
        self.admission.give_back(weight);
        self.gauge(-(weight as f64));
        weight
    }

    /// Takes the entry `index`, freed from `word`, off the list of weighted
    /// claims; returns its weight (1 if it was not listed).
    fn unlist(&self, index: usize, word: u64) -> usize {
        lock(&self.weighted)
            .as_mut()
            .and_then(|weighted| weighted.remove(&(index, word)))
            .unwrap_or(1)
    }

    /// Whether every claim held has passed its deadline at `now` (or none
    /// is held), without freeing any.
    pub(crate) fn holds_only_expired(&self, now: u64) -> bool {
        self.in_flight() == 0 || (self.ledger.sweep_due(now) && self.ledger.holds_only_expired(now))
    }

    /// Frees every claim past its deadline at `now`, with its bytes, if a
    /// sweep is due; returns how many slots it freed. They are counted for
    /// [`take_reclaimed`](Self::take_reclaimed).
    #[cold]
    pub(crate) fn reclaim_expired(&self, now: u64) -> usize {
        let mut slots = 0;
        // Each entry's slots are given back under the sweep's lock, before
        // the sweep moves its date on (see `try_claim_weighted`).
        self.ledger.sweep(now, self.hold, |index, word| {
            self.give_back_recorded_bytes(index, word);
            let weight = self.unlist(index, word);
            self.admission.give_back_freed(weight, true);
            slots += weight;
        });
        if slots > 0 {
            self.gauge(-(slots as f64));
            self.reclaimed.fetch_add(slots, Ordering::Relaxed);
        }
        slots
    }

    /// Slots reclaimed since the last call: for the caller to report.
    #[inline]
    pub(crate) fn take_reclaimed(&self) -> usize {
        if self.reclaimed.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        self.reclaimed.swap(0, Ordering::Relaxed)
    }

    /// Frees every slot, whoever holds it, at `now`: their holders'
    /// releases find new words and free nothing. Claims admitted but not
    /// yet written stay counted, and are released as any.
    pub(crate) fn reset(&self, now: u64) {
        self.floor
            .fetch_max(now.saturating_add(1), Ordering::Relaxed);
        let mut slots = 0;
        self.ledger.clear(|index, word| {
            self.give_back_recorded_bytes(index, word);
            slots += self.unlist(index, word);
        });
        self.admission.give_back_freed(slots, false);
        self.gauge(-(slots as f64));
    }

    /// Whether `weight` slots could be had at `now`: free under the limit,
    /// or once a sweep frees an expired claim. Reads the whole ledger only
    /// when full with a sweep due.
    pub(crate) fn has_room(&self, now: u64, weight: usize) -> bool {
        self.admission.fits(weight) || self.ledger.any_expired(now, self.hold)
    }

    /// The claims admitted since the table was made, beside the admission
    /// word (see `admission`): counted by the bulkhead as it makes each
    /// permit, since a claim given back unused is no admission.
    pub(crate) fn admitted(&self) -> &AtomicU64 {
        &self.admission.admitted
    }

    /// Slots held: admitted or handed to a waiting caller, and not yet
    /// released, given back or reclaimed. One load.
    #[inline]
    pub(crate) fn in_flight(&self) -> usize {
        self.admission.held()
    }

    /// The tick at which `claim` was made.
    pub(crate) fn claimed_at(&self, claim: &Claim) -> u64 {
        deadline(claim.word()).saturating_sub(self.hold)
    }

    /// Whether the claim that wrote `word` into entry `index` still holds
    /// it at `now`: it has been neither released nor freed by a sweep or a
    /// reset, and its deadline has not passed.
    pub(crate) fn holds(&self, index: usize, word: u64, now: u64) -> bool {
        deadline(word) > now && self.ledger.entry(index).load(Ordering::SeqCst) == word
    }

    /// Whether entry `index` is free: for tests.
    #[cfg(any(test, feature = "test-util"))]
    pub(crate) fn is_released(&self, index: usize) -> bool {
        index < self.ledger.len() && deadline(self.ledger.entry(index).load(Ordering::SeqCst)) == 0
    }
}

#[cfg(test)]
impl SlotTable {
    /// Takes one slot, if one is free under the limit in force (after a
    /// sweep, if one is due); the load that decides is made with `order`.
    pub(crate) fn try_claim(&self, now: u64, order: Ordering) -> Option<Claim> {
        self.try_claim_weighted(now, 1, order)
    }

    /// Whether a sweep is due: some claim may have passed its deadline.
    #[cfg(not(tower_inflight_loom))]
    pub(crate) fn sweep_due(&self, now: u64) -> bool {
        self.ledger.sweep_due(now)
    }

    /// How many entries are held at `now`, by reading each.
    pub(crate) fn held(&self, now: u64) -> usize {
        (0..self.ledger.len())
            .filter(|&index| deadline(self.ledger.entry(index).load(Ordering::SeqCst)) > now)
            .count()
    }
}

#[cfg(all(test, not(tower_inflight_loom)))]
mod tests {
    use super::*;

    const HOLD: u64 = 100;

    fn table(limit: usize) -> SlotTable {
        SlotTable::new(limit, 1, HOLD, None)
    }

    #[test]
    fn claims_until_full_then_refuses() {
        let table = table(3);
        let claims: Vec<_> = (0..3)
            .map(|_| table.try_claim(1, Ordering::Relaxed))
            .collect();
        assert!(claims.iter().all(Option::is_some));
        assert_eq!((table.held(1), table.in_flight()), (3, 3));
        assert_eq!(table.try_claim(1, Ordering::Relaxed), None);
    }

    #[test]
    fn release_frees_exactly_one_slot() {
        let table = table(2);
        let a = table.try_claim(1, Ordering::Relaxed).unwrap();
        let _b = table.try_claim(1, Ordering::Relaxed).unwrap();
        assert_eq!(table.release(&a), 1);
        assert_eq!(table.release(&a), 0, "a second release must do nothing");
        assert_eq!((table.held(1), table.in_flight()), (1, 1));
    }

    #[test]
    fn expired_slot_is_reclaimed_and_late_release_leaves_new_holder() {
        let table = table(1);
        let old = table.try_claim(1, Ordering::Relaxed).unwrap();
        assert!(!old.reclaimed());
        assert_eq!(table.try_claim(HOLD, Ordering::Relaxed), None);
        let new = table.try_claim(1 + HOLD, Ordering::Relaxed).unwrap();
        assert!(new.reclaimed());
        assert_eq!(table.take_reclaimed(), 1);
        assert_eq!(table.release(&old), 0);
        assert_eq!(table.in_flight(), 1);
        assert_eq!(table.release(&new), 1);
        assert_eq!(table.in_flight(), 0);
    }

    #[test]
    fn a_sweep_runs_only_once_the_earliest_deadline_has_come() {
        let table = table(2);
        let _early = table.try_claim(10, Ordering::Relaxed).unwrap();
        let _late = table.try_claim(50, Ordering::Relaxed).unwrap();
        // Made at 1: no claim can expire before 1 + HOLD.
        assert!(!table.sweep_due(HOLD));
        assert_eq!(table.reclaim_expired(1 + HOLD), 0);
        assert!(
            !table.sweep_due(10 + HOLD - 1),
            "the next is the early claim's"
        );
        assert_eq!(table.reclaim_expired(10 + HOLD), 1);
        assert!(
            !table.sweep_due(50 + HOLD - 1),
            "the next is the later claim's"
        );
        assert_eq!(table.reclaim_expired(50 + HOLD), 1);
        assert_eq!(table.in_flight(), 0);
    }

    #[test]
    fn a_look_for_expired_claims_that_finds_none_moves_the_sweep_on() {
        let table = table(1);
        let _held = table.try_claim(50, Ordering::Relaxed).unwrap();
        assert!(table.sweep_due(1 + HOLD), "the bound from its making");
        assert!(!table.has_room(1 + HOLD, 1));
        assert!(!table.sweep_due(1 + HOLD), "the next look costs one load");
        assert!(table.has_room(50 + HOLD, 1));
        assert_eq!(table.in_flight(), 1, "a look frees nothing");
    }

    #[test]
    fn reset_in_the_same_tick_gives_new_holders_new_words() {
        let table = table(1);
        let old = table.try_claim(5, Ordering::Relaxed).unwrap();
        table.reset(5);
        assert_eq!(table.in_flight(), 0);
        let new = table.try_claim(5, Ordering::Relaxed).unwrap();
        assert_ne!(old.word(), new.word());
        assert_eq!(table.release(&old), 0);
        assert_eq!(table.in_flight(), 1);
    }

    #[test]
    fn a_weighted_claim_is_all_or_nothing_and_reclaimed_whole() {
        let table = table(3);
        let _one = table.try_claim(1, Ordering::Relaxed).unwrap();
        assert_eq!(table.try_claim_weighted(1, 3, Ordering::Relaxed), None);
        assert_eq!(table.in_flight(), 1, "a refused weight takes nothing");
        let heavy = table.try_claim_weighted(1, 2, Ordering::Relaxed).unwrap();
        assert_eq!((heavy.weight(), table.in_flight()), (2, 3));
        assert_eq!(table.reclaim_expired(1 + HOLD), 3);
        assert_eq!(table.in_flight(), 0);
        assert_eq!(table.release(&heavy), 0, "its late release frees nothing");
        assert_eq!(table.in_flight(), 0);
    }

    #[test]
    fn a_lowered_limit_evicts_no_one_and_admits_no_one_until_under_it() {
        let table = table(4);
        let held: Vec<_> = (0..3)
            .map(|_| table.try_claim(1, Ordering::Relaxed).unwrap())
            .collect();
        table.set_limit(2);
        assert_eq!((table.limit(), table.in_flight()), (2, 3));
        assert_eq!(table.try_claim(1, Ordering::Relaxed), None);
        table.release(&held[0]);
        assert_eq!(table.try_claim(1, Ordering::Relaxed), None, "2 held of 2");
        table.release(&held[1]);
        assert!(table.try_claim(1, Ordering::Relaxed).is_some());
        table.set_limit(usize::MAX);
        assert_eq!(table.limit(), 4, "never over the table's size");
    }

    #[test]
    fn huge_hold_saturates_instead_of_wrapping() {
        let table = SlotTable::new(1, 1, u64::MAX, None);
        let claim = table.try_claim(1, Ordering::Relaxed).unwrap();
        assert_eq!(deadline(claim.word()), MAX_DEADLINE);
        assert_eq!(table.held(MAX_DEADLINE - 1), 1);
        assert!(!table.sweep_due(MAX_DEADLINE - 1));
    }

    #[test]
    fn a_full_ledger_of_a_million_finds_the_one_free_entry() {
        const N: usize = MAX_SLOTS;
        let table = table(N);
        let claims: Vec<_> = (0..N)
            .map(|_| table.try_claim(1, Ordering::Relaxed).unwrap())
            .collect();
        assert_eq!(table.try_claim(1, Ordering::Relaxed), None);
        table.release(&claims[N / 2]);
        assert!(table.try_claim(1, Ordering::Relaxed).is_some());
        assert_eq!(table.in_flight(), N);
    }
}
