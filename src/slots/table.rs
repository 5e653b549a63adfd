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
//! A claim first tries the slot where its thread starts (see `Lanes`), which
//! is usually the one the thread released last, without reading anything
//! else; past it, the free map (see `free_map`) leads to a free slot, or
//! tells that there is none, in a few words whatever the limit. Counts of
//! admissions and of slots held are kept in the thread's lane.
//!
//! A slot takes 16 bytes. In a table of up to [`SMALL_TABLE`] slots, each is
//! spread onto a cache line of its own, so callers that hold neighbouring
//! slots do not slow each other down; a larger table packs four slots a line,
//! where callers rarely land on the same line.
//!
//! # Memory ordering
//!
//! A claim is `AcqRel`, so whatever the previous holder did happens-before
//! the next holder's work. A release is `SeqCst`, and so are the loads that
//! the waiter queue makes of the slots after it counts a new waiter in: with
//! the releaser's `SeqCst` load of that count, this is the store-buffering
//! pattern that guarantees either the releaser sees the waiter or the waiter
//! sees the freed slot, so no caller parks beside a free slot.

use crate::slots::free_map::{Bound, Bracket, FreeMap, CLEAN_BATCH};
use crate::slots::lanes::{self, Lanes, ThreadLane};
use crate::slots::{ByteBudget, Claim};
use crate::sync::{lock, AtomicU64, Mutex, Ordering};

pub(super) const GENERATION_BITS: u32 = 22;
const GENERATION_MASK: u64 = (1 << GENERATION_BITS) - 1;
/// The largest deadline a word can hold: about 136 years of ticks.
pub(crate) const MAX_DEADLINE: u64 = u64::MAX >> GENERATION_BITS;

/// The largest `limit` a bulkhead accepts: what a claim's index can name.
pub(crate) const MAX_SLOTS: usize = 1 << 20;

/// How many times a search that fell short looks again because releases
/// were counted while it looked (see `SlotTable::look_settled`).
const RECHECKS: usize = 4;

/// Tables up to this many slots put each slot on a cache line of its own.
pub(crate) const SMALL_TABLE: usize = 1024;

/// Searches that could not trust what they saw before one holds a bracket
/// open throughout (see `look`).
/// (One under loom, so that the models reach the held bracket.)
const TRIES_BEFORE_HOLDING: usize = if cfg!(tower_inflight_loom) { 1 } else { 3 };

/// A claim is chosen to sample the slots held (for the minute's peak, and
/// for the hold-time histogram) when its thread's admissions, masked with
/// this, are 0.
const SAMPLE_MASK: u64 = 63;

#[derive(Debug, Default)]
#[repr(align(16))]
pub(super) struct Slot {
    pub(super) word: AtomicU64,
    /// Bytes the holder reserved (high 42 bits) and its generation (low 22).
    pub(super) bytes: AtomicU64,
}

#[derive(Debug)]
pub(crate) struct SlotTable {
    /// The slots, slot `i` at `i << spread`; the others are padding.
    slots: Box<[Slot]>,
    spread: u32,
    len: usize,
    pub(super) map: FreeMap,
    lanes: Lanes,
    /// `reclaim_after`, in ticks.
    pub(super) hold: u64,
    pub(super) budget: Option<ByteBudget>,
    /// The other slots of each weighted claim, found by the claim that
    /// stands for them. Touched only by weighted claims and their releases.
    pub(super) companions: Mutex<Vec<(Claim, Box<[Claim]>)>>,
    /// Held slots that a reset freed: they never count out.
    reset_held: AtomicU64,
    /// The slots held, as a metrics gauge, moved wherever the lanes are.
    #[cfg(feature = "metrics")]
    gauge: Option<metrics::Gauge>,
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

/// What a search through the free map is for.
#[derive(Clone, Copy)]
enum Want {
    /// Take the first free slot, writing this held word over it.
    Take { held_until: u64 },
    /// Count free slots, up to this many.
    Count(usize),
}

impl Want {
    /// Whether a search that counted `found` free slots (1 for one taken)
    /// has what it wants.
    fn is_met(self, found: usize) -> bool {
        match self {
            Want::Take { .. } => found >= 1,
            Want::Count(wanted) => found >= wanted,
        }
    }
}

/// A search through the free map, from the top, starting each word where
/// `start` leads, so that threads spread out.
struct Search<'a> {
    table: &'a SlotTable,
    now: u64,
    order: Ordering,
    start: usize,
    want: Want,
    counted: usize,
    bracket: Option<Bracket<'a>>,
    /// Brackets this search opened and closed (each raised the count twice).
    own_brackets: u64,
    /// Its bracket is held from start to end, and never closed between.
    held_throughout: bool,
    /// A bit cleared here was set again: something came free behind us.
    set_again: bool,
}

impl SlotTable {
    pub(crate) fn new(limit: usize, hold: u64, max_bytes: Option<u64>) -> Self {
        let spread = if limit <= SMALL_TABLE { 2 } else { 0 };
        let slots = (0..limit << spread).map(|_| Slot::default()).collect();
        Self {
            slots,
            spread,
            len: limit,
            map: FreeMap::new(limit),
            lanes: Lanes::new(),
            hold,
            budget: max_bytes.map(ByteBudget::new),
            companions: Mutex::new(Vec::new()),
            reset_held: AtomicU64::new(0),
            #[cfg(feature = "metrics")]
            gauge: None,
        }
    }

    /// Keeps `gauge` at the slots held (a reset sets it to 0 itself).
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

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    #[inline(always)]
    pub(super) fn slot(&self, index: usize) -> &Slot {
        &self.slots[index << self.spread]
    }

    /// Takes a free slot: this thread's start slot if it is free, else the
    /// first the free map leads to. `None` only when every slot was seen
    /// held (see `free_map` for when that can be trusted).
    #[inline(always)]
    pub(crate) fn try_claim(&self, now: u64, order: Ordering) -> Option<Claim> {
        let thread = lanes::current();
        let (index, word, until) = self.take_free_from(thread, now, order)?;
        Some(self.claim(index, word, until, thread))
    }

    #[inline(always)]
    fn claim(&self, index: usize, word: u64, until: u64, thread: ThreadLane) -> Claim {
        let sample = self.lanes.admitted_here(thread) & SAMPLE_MASK == 0;
        let claim = Claim::new(index, word, until != 0, sample);
        if claim.reclaimed() {
            self.recover_abandoned_bytes(&claim);
        }
        claim
    }

    #[inline(always)]
    fn held_until(&self, now: u64) -> u64 {
        now.saturating_add(self.hold).min(MAX_DEADLINE) << GENERATION_BITS
    }

    /// Writes `held_until` over slot `index` if it is free at `now`;
    /// returns its index, the word written and the deadline it replaced.
    #[inline(always)]
    fn take(
        &self,
        index: usize,
        now: u64,
        held_until: u64,
        order: Ordering,
    ) -> Option<(usize, u64, u64)> {
        let slot = self.slot(index);
        let word = slot.word.load(order);
        let until = deadline(word);
        let new = held_until | next_generation(word);
        // `AcqRel`: acquires what the previous holder did before its
        // release, and releases the weighted-claim count raised before it
        // (see `Waiters::unchanged`). A failure learns nothing, so `Relaxed`.
        (until <= now
            && slot
                .word
                .compare_exchange(word, new, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok())
        .then_some((index, new, until))
    }

    /// Takes this thread's start slot if it is free, else the first free
    /// slot the free map leads to; returns its index, the word written and
    /// the deadline it replaced.
    #[inline(always)]
    pub(super) fn take_free(&self, now: u64, order: Ordering) -> Option<(usize, u64, u64)> {
        self.take_free_from(lanes::current(), now, order)
    }

    #[inline(always)]
    fn take_free_from(
        &self,
        thread: ThreadLane,
        now: u64,
        order: Ordering,
    ) -> Option<(usize, u64, u64)> {
        let start = thread.start(self.len);
        let held_until = self.held_until(now);
        match self.take(start, now, held_until, order) {
            Some(taken) => Some(taken),
            None => self.search(now, order, start, held_until),
        }
    }

    #[cold]
    #[inline(never)]
    fn search(
        &self,
        now: u64,
        order: Ordering,
        start: usize,
        held_until: u64,
    ) -> Option<(usize, u64, u64)> {
        let mut found = None;
        self.look_settled(now, order, start, Want::Take { held_until }, |taken| {
            found = Some(taken);
        });
        found
    }

    /// Whether at least `wanted` slots are free at `now`, without taking
    /// them.
    pub(crate) fn has_free(&self, now: u64, wanted: usize) -> bool {
        let start = lanes::current().start(self.len);
        self.look_settled(now, Ordering::SeqCst, start, Want::Count(wanted), |_| {}) >= wanted
    }

    /// [`look`](Self::look), and again while releases were counted as it
    /// looked, a few times at most.
    ///
    /// A search is not a snapshot: it may look while another caller moves,
    /// releasing a slot the search has not reached yet, then taking one it
    /// has passed. Each slot was held when it looked, yet one was free all
    /// along. A caller counts its release out before it claims again, so a
    /// search that falls short while no release was counted can be trusted;
    /// one that falls short while releases were counted looks again (under
    /// such churn a slot comes free soon, or the caller is shed).
    fn look_settled(
        &self,
        now: u64,
        order: Ordering,
        start: usize,
        want: Want,
        mut taken: impl FnMut((usize, u64, u64)),
    ) -> usize {
        let mut released = self.lanes.counted_out();
        // At least `Acquire`, and `SeqCst` when it looks again: a slot seen
        // taken by a caller that had just released another acquires the
        // count out it made first.
        let mut order = match order {
            Ordering::Relaxed => Ordering::Acquire,
            order => order,
        };
        let mut found = 0;
        for _ in 0..=RECHECKS {
            found = self.look(now, order, start, want, &mut taken);
            if want.is_met(found) {
                return found;
            }
            let now_released = self.lanes.counted_out();
            if now_released == released {
                return found;
            }
            released = now_released;
            order = Ordering::SeqCst;
        }
        found
    }

    /// Whether any slot is free at `now`, without taking it.
    pub(crate) fn any_free(&self, now: u64) -> bool {
        self.has_free(now, 1)
    }

    /// Searches the free map until it has what it wants or can trust that
    /// there is not enough: no bracket but its own opened, and no survey ran,
    /// while it looked, and no slot with a clear bit can have expired.
    /// Returns how many free slots it counted (1 for a slot taken, handed to
    /// `taken`).
    ///
    /// A search that could not trust what it saw looks again; after a few
    /// tries it holds a bracket open from start to end, so that no other
    /// cleaner can open one meanwhile, and so cannot be made to look again
    /// by cleaners that keep coming.
    fn look(
        &self,
        now: u64,
        order: Ordering,
        start: usize,
        want: Want,
        mut taken: impl FnMut((usize, u64, u64)),
    ) -> usize {
        for attempt in 0.. {
            let mut search = Search {
                table: self,
                now,
                order,
                start,
                want,
                counted: 0,
                bracket: None,
                own_brackets: 0,
                held_throughout: attempt >= TRIES_BEFORE_HOLDING,
                set_again: false,
            };
            let quiet = if search.held_throughout {
                search.bracket = Some(self.map.bracket());
                // A survey may start between a look and the read: only a
                // read that finds none running is a baseline.
                loop {
                    let quiet = self.map.quiet();
                    if !quiet.surveying() {
                        break quiet;
                    }
                    self.map.wait_for_survey();
                }
            } else {
                self.map.settled()
            };
            let top = self.map.levels() - 1;
            if let Some(found) = search.word(top, 0) {
                taken(found);
                return 1;
            }
            if let Want::Count(wanted) = want {
                if search.counted >= wanted {
                    return search.counted;
                }
            }
            if search.set_again {
                continue;
            }
            if self.map.may_have_expired(Bound::Cleared, now) {
                drop(search.bracket.take());
                self.survey(now);
                continue;
            }
            // Its own bracket closes first, unless held throughout: then it
            // is still open, and counted in `quiet` already.
            if !search.held_throughout {
                drop(search.bracket.take());
            }
            if self.map.still(quiet, search.own_brackets) {
                return search.counted;
            }
            // Another cleaner's bracket was open, or a survey ran, while this
            // search looked: a bit cleared, or a bound raised, may have
            // hidden a slot that came free. Look again once they are done.
        }
        unreachable!("`0..` does not end")
    }

    /// Sets the bits of every slot expired at `now`, and raises the free
    /// map's bound to the earliest deadline still held.
    #[cold]
    pub(crate) fn survey(&self, now: u64) {
        self.map.survey(Bound::Cleared, now, || {
            let mut earliest = u64::MAX;
            for index in 0..self.len {
                let until = deadline(self.slot(index).word.load(Ordering::SeqCst));
                if until > now {
                    earliest = earliest.min(until);
                } else {
                    self.map.mark_free(index);
                }
            }
            (earliest, ())
        });
    }

    /// Frees every slot whose deadline has passed at `now` and gives back
    /// the bytes its holder recorded: slots of holders that vanished, which
    /// no release will free. Returns how many it freed (they counted as
    /// held, and are reclaimed now). Reads every slot: for a drain, which
    /// has no claim to reclaim them.
    #[cold]
    pub(crate) fn reclaim_expired(&self, now: u64) -> usize {
        let mut reclaimed = 0;
        for index in 0..self.len {
            let slot = self.slot(index);
            let word = slot.word.load(Ordering::SeqCst);
            let until = deadline(word);
            if until == 0 || until > now {
                continue;
            }
            let freed = next_generation(word);
            // `SeqCst`, as a release is.
            if slot
                .word
                .compare_exchange(word, freed, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok()
            {
                self.give_back_recorded_bytes(index, freed);
                self.map.mark_free(index);
                reclaimed += 1;
            }
        }
        reclaimed
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
        // `SeqCst`: one side of two store-buffering patterns. With the
        // waiter queue: this store, then the releaser's load of the parked
        // count, against an arrival's count, then its load of the slots.
        // With the free map: this store, then the load of the slot's bit,
        // against a cleaner's clear of the bit, then its load of the slot.
        let released = self
            .slot(claim.index())
            .word
            .compare_exchange(claim.word(), freed, Ordering::SeqCst, Ordering::Relaxed)
            .is_ok();
        if released {
            self.map.mark_free(claim.index());
        }
        released
    }

    /// Frees every slot, whoever holds it. Each word gets a new generation, so
    /// the permits that held them can no longer release anything.
    pub(crate) fn reset(&self) {
        lock(&self.companions).clear();
        let mut freed = 0;
        for index in 0..self.len {
            let slot = self.slot(index);
            // `SeqCst`, as a release is: a slot freed here is found by
            // waiters exactly as a released one is.
            let previous = slot
                .word
                .fetch_update(Ordering::SeqCst, Ordering::Relaxed, |word| {
                    Some(next_generation(word))
                })
                .unwrap_or_else(|word| word);
            freed += u64::from(deadline(previous) != 0);
            // An empty record tagged with the new generation, never 0: a
            // holder from before the reset that is about to record its bytes
            // compares against the record it read, which no longer matches.
            slot.bytes
                .store(next_generation(previous), Ordering::SeqCst);
        }
        self.map.mark_all_free(self.len);
        // The slots it freed were counted in (or will be, by a claim being
        // admitted now) and will never be counted out: their holders'
        // releases find new words. A claim given back unused finds its slot
        // gone and counts it in (see `Shared::give_back_unused`).
        self.reset_held.fetch_add(freed, Ordering::Relaxed);
        if let Some(budget) = &self.budget {
            budget.reset();
        }
    }

    /// Counts the admission of a call that got its slot, and `newly_held`
    /// slots held (usually one: the common case costs one counter), on this
    /// thread's lane. A claim given back without being admitted (its caller
    /// went away, its bytes did not fit) is never counted, so the total only
    /// ever grows.
    #[inline(always)]
    pub(crate) fn count_admission(&self, newly_held: usize) {
        self.lanes.admit(lanes::current());
        if newly_held > 0 {
            self.gauge(newly_held as f64);
        }
        match newly_held {
            1 => {}
            // Counted as held already: the admission's one is counted out
            // again, after it, as a count out (see `Lanes::held`: a count in
            // that went below zero could hide a slot held all along).
            0 => self.lanes.count_out(1),
            more => self.lanes.adjust(more as u64 - 1),
        }
    }

    /// `slots` more slots are held (handed to a waiting caller).
    pub(crate) fn count_in(&self, slots: usize) {
        if slots > 0 {
            self.lanes.adjust(slots as u64);
            self.gauge(slots as f64);
        }
    }

    /// `slots` slots are held no more.
    #[inline(always)]
    pub(crate) fn count_out(&self, slots: usize) {
        self.lanes.count_out(slots);
        self.gauge(-(slots as f64));
    }

    /// How long a claim holds its slot before it may be reclaimed, in
    /// ticks (`reclaim_after`, and the clock's margin).
    pub(crate) fn hold(&self) -> u64 {
        self.hold
    }

    /// Admissions, ever.
    pub(crate) fn claims(&self) -> u64 {
        self.lanes.admitted()
    }

    /// Slots held: admitted or handed to a waiting caller, and not yet
    /// released, given back or reclaimed. A slot whose holder vanished
    /// counts until it is reclaimed. In time that does not grow with the
    /// limit.
    pub(crate) fn in_flight(&self) -> usize {
        // The resets first: a reset between the two reads then counts too
        // much, never too little.
        let reset_held = self.reset_held.load(Ordering::Relaxed);
        let held = self.lanes.held().saturating_sub(reset_held);
        (held as usize).min(self.len)
    }

    /// The tick at which `claim` was made.
    pub(crate) fn claimed_at(&self, claim: &Claim) -> u64 {
        deadline(claim.word()).saturating_sub(self.hold)
    }

    /// Whether slot `index` is released (its deadline is 0): for tests.
    pub(crate) fn is_released(&self, index: usize) -> bool {
        index < self.len && deadline(self.slot(index).word.load(Ordering::SeqCst)) == 0
    }

    /// How many slots are held at `now`, by reading each: for tests.
    #[cfg(test)]
    pub(crate) fn held(&self, now: u64) -> usize {
        (0..self.len)
            .filter(|&index| deadline(self.slot(index).word.load(Ordering::Relaxed)) > now)
            .count()
    }
}

impl<'a> Search<'a> {
    /// Looks under word `index` of `level`, from where `start` leads.
    fn word(&mut self, level: usize, index: usize) -> Option<(usize, u64, u64)> {
        let shift = ((self.start >> (6 * level)) % 64) as u32;
        let bits = self
            .table
            .map
            .word(level, index)
            .load(self.order)
            .rotate_right(shift);
        let mut rest = bits;
        while rest != 0 {
            let position = index * 64 + ((rest.trailing_zeros() + shift) % 64) as usize;
            rest &= rest - 1;
            let found = if level == 0 {
                self.slot(position)
            } else {
                self.word(level - 1, position)
                    .or_else(|| self.below_is_empty(level, position))
            };
            if found.is_some() {
                return found;
            }
            if let Want::Count(wanted) = self.want {
                if self.counted >= wanted {
                    return None;
                }
            }
        }
        None
    }

    /// Slot `index`, whose bit is set: taken or counted if free, its bit
    /// cleared if held.
    fn slot(&mut self, index: usize) -> Option<(usize, u64, u64)> {
        let table = self.table;
        let slot = table.slot(index);
        let mut word = slot.word.load(self.order);
        // Whether this search cleared the bit, and left the leaf word empty.
        let mut cleared = None;
        loop {
            if deadline(word) <= self.now {
                match self.want {
                    Want::Take { held_until } => {
                        let new = held_until | next_generation(word);
                        match slot.word.compare_exchange(
                            word,
                            new,
                            Ordering::AcqRel,
                            Ordering::Relaxed,
                        ) {
                            Ok(_) => {
                                if cleared.is_some() {
                                    // Its bit stays clear while it is ours.
                                    table.map.lower(Bound::Cleared, deadline(new));
                                }
                                return Some((index, new, deadline(word)));
                            }
                            Err(actual) => {
                                word = actual;
                                continue;
                            }
                        }
                    }
                    Want::Count(_) => {
                        if cleared.is_some() {
                            table.map.set_again(0, index);
                        }
                        self.counted += 1;
                        return None;
                    }
                }
            }
            // Held. Its deadline is remembered before its bit is cleared,
            // and whenever another holder is found in it afterwards.
            table.map.lower(Bound::Cleared, deadline(word));
            if cleared.is_none() {
                // The bit is stale: cleared, if no other cleaner is at work.
                let before = self.clear(0, index)?;
                cleared = Some(before & !(1 << (index % 64)) == 0);
            }
            // Read again: if it came free, its releaser may have seen the
            // bit still set and left it so.
            let again = slot.word.load(Ordering::SeqCst);
            if again == word {
                break;
            }
            word = again;
        }
        if cleared == Some(true) {
            self.empty_above(1, index / 64);
        }
        None
    }

    /// Word `position` of `level - 1` had nothing to give: if it is empty,
    /// the bit that leads to it is cleared.
    fn below_is_empty(&mut self, level: usize, position: usize) -> Option<(usize, u64, u64)> {
        if self
            .table
            .map
            .word(level - 1, position)
            .load(Ordering::SeqCst)
            == 0
        {
            self.empty_above(level, position);
        }
        None
    }

    /// Word `position` of `level - 1` looked empty: clears its bit in
    /// `level`, reads it again, and sets the bit again if it is not empty
    /// now. Climbs while the words it clears become empty.
    fn empty_above(&mut self, level: usize, position: usize) {
        let map = &self.table.map;
        let (mut level, mut position) = (level, position);
        while level < map.levels() {
            if map.word(level - 1, position).load(Ordering::SeqCst) != 0 {
                return;
            }
            let Some(before) = self.clear(level, position) else {
                return;
            };
            if map.word(level - 1, position).load(Ordering::SeqCst) != 0 {
                map.set_again(level, position);
                self.set_again = true;
                return;
            }
            if before & !(1 << (position % 64)) != 0 {
                return;
            }
            level += 1;
            position /= 64;
        }
    }

    /// Clears bit `position` of `level` under this search's bracket; returns
    /// the word as it was, or `None` if another cleaner has a bracket open.
    fn clear(&mut self, level: usize, position: usize) -> Option<u64> {
        let map = &self.table.map;
        let bracket = self.bracket()?;
        bracket.cleared += 1;
        Some(map.clear(bracket, level, position))
    }

    /// The open bracket, opened if need be; `None` if another cleaner has
    /// one open. A bracket that has cleared its batch is closed and another
    /// opened, so that a search waiting for it never waits long.
    fn bracket(&mut self) -> Option<&mut Bracket<'a>> {
        if !self.held_throughout
            && self
                .bracket
                .as_ref()
                .is_some_and(|bracket| bracket.cleared >= CLEAN_BATCH)
        {
            self.bracket = None;
        }
        if self.bracket.is_none() {
            self.bracket = Some(self.table.map.try_bracket()?);
            // Counted as opened and closed: it closes before the count is
            // compared (see `look`).
            self.own_brackets += 1;
        }
        self.bracket.as_mut()
    }
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
    fn a_claim_given_back_across_a_reset_leaves_the_count_even() {
        let table = SlotTable::new(4, HOLD, None);
        let refused = table.try_claim(1, Ordering::Relaxed).unwrap();
        table.reset();
        assert_eq!(table.release(&refused), 0);
        // What `Shared::give_back_unused` does for a claim never counted in
        // whose slot was taken over.
        table.count_in(1);
        let _held = table.try_claim(2, Ordering::Relaxed).unwrap();
        table.count_admission(1);
        assert_eq!(table.in_flight(), 1);
    }

    /// A survey of a million slots takes long enough for another claim to
    /// search while it scans, with the bound raised: that claim must wait
    /// for it rather than trust the bound.
    #[test]
    fn a_claim_during_a_survey_is_not_shed_beside_an_expired_slot() {
        use std::sync::Arc;
        const N: usize = 1 << 20;
        let table = Arc::new(SlotTable::new(N, HOLD, None));
        let mut claims: Vec<Claim> = (0..N)
            .map(|_| table.try_claim(1, Ordering::SeqCst).unwrap())
            .collect();
        claims.sort_by_key(Claim::index);
        let _leaked = claims.split_off(N - 2);
        for claim in &claims {
            assert_eq!(table.release(claim), 1);
        }
        for _ in 0..N - 2 {
            table.try_claim(50, Ordering::SeqCst).unwrap();
        }
        assert!(table.try_claim(50, Ordering::SeqCst).is_none());
        let expired = 1 + HOLD;
        let surveyor = {
            let table = table.clone();
            std::thread::spawn(move || table.try_claim(expired, Ordering::SeqCst).is_some())
        };
        while table.map.may_have_expired(Bound::Cleared, expired) {
            std::hint::spin_loop();
        }
        let mine = table.try_claim(expired, Ordering::SeqCst);
        assert!(surveyor.join().unwrap());
        assert!(mine.is_some(), "shed while a slot had expired");
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
}
