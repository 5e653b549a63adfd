//! The ledger: who holds slots, since when.
//!
//! An entry is one atomic word: the deadline until which its claim counts as
//! held (high 42 bits, in clock ticks) and a generation (low 22 bits) that
//! every write bumps. An entry is free when its deadline is 0. A claim
//! writes a free entry by compare-and-exchange; release and reclaim write
//! it back to free by compare-and-exchange of the exact word the claim
//! wrote, so each frees it once, and a holder whose entry was reclaimed (or
//! cleared by a reset) and written again can never free the new holder's.
//! Deadline and generation together make a word unique: it would take 2^22
//! writes of one entry within one tick for a word to repeat.
//!
//! The ledger is twice the largest limit, and the count admits a claim
//! before it writes its entry and takes the count back only after the entry
//! is free: so at least half the entries are free whenever a claim probes.
//! A claim tries its thread's own entry first (the one the thread freed
//! last, still in its cache), then goes on from where the last probe that
//! went further found a free one: a thread that fills the ledger alone
//! finds each next entry in a step, and so does a claim past a run of held
//! entries once another has crossed it.
//!
//! Sweeps for expired entries are rare: one runs only once the earliest
//! deadline of the last sweep has come (see [`Ledger::sweep_due`]).

use crate::sync::{lock, AtomicU64, AtomicUsize, Mutex, Ordering};

pub(super) const GENERATION_BITS: u32 = 22;
const GENERATION_MASK: u64 = (1 << GENERATION_BITS) - 1;
/// The largest deadline a word can hold: about 136 years of ticks.
pub(crate) const MAX_DEADLINE: u64 = u64::MAX >> GENERATION_BITS;

pub(super) fn deadline(word: u64) -> u64 {
    word >> GENERATION_BITS
}

pub(super) fn generation(word: u64) -> u64 {
    word & GENERATION_MASK
}

/// The word of a free entry that followed `word`.
pub(super) fn freed(word: u64) -> u64 {
    word.wrapping_add(1) & GENERATION_MASK
}

#[derive(Debug)]
pub(super) struct Ledger {
    entries: Box<[AtomicU64]>,
    /// Where the last probe that went past its thread's entry found a free
    /// one, plus one: a hint, read and written `Relaxed`.
    cursor: AtomicUsize,
    /// A tick at or before which no held entry expires: every entry held at
    /// the last sweep expires at or after it, and every claim made since
    /// expires later still. Written only under `sweeping`.
    next_sweep: AtomicU64,
    sweeping: Mutex<()>,
}

impl Ledger {
    /// A ledger for `limit` slots, created at `now`, whose claims are held
    /// for `hold` ticks.
    pub(super) fn new(limit: usize, now: u64, hold: u64) -> Self {
        Self {
            entries: (0..2 * limit).map(|_| AtomicU64::new(0)).collect(),
            cursor: AtomicUsize::new(0),
            next_sweep: AtomicU64::new(now.saturating_add(hold)),
            sweeping: Mutex::new(()),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(super) fn entry(&self, index: usize) -> &AtomicU64 {
        &self.entries[index]
    }

    /// Writes `held_until` (a deadline, shifted) into entry `start` if it
    /// is free, else into the first free entry from the cursor; returns its
    /// index and the word written. The caller holds a count, so there is a
    /// free entry (see the module docs).
    #[inline(always)]
    pub(super) fn write(&self, start: usize, held_until: u64) -> (usize, u64) {
        match self.take(start, held_until) {
            Some(word) => (start, word),
            None => self.probe(held_until),
        }
    }

    #[cold]
    #[inline(never)]
    fn probe(&self, held_until: u64) -> (usize, u64) {
        let mut index = self.cursor.load(Ordering::Relaxed) % self.entries.len();
        loop {
            if let Some(word) = self.take(index, held_until) {
                self.cursor.store(index + 1, Ordering::Relaxed);
                return (index, word);
            }
            index += 1;
            if index == self.entries.len() {
                index = 0;
            }
        }
    }

    /// Writes `held_until` into entry `index` if it is free (trying again
    /// while it stays free); returns the word written.
    #[inline(always)]
    fn take(&self, index: usize, held_until: u64) -> Option<u64> {
        let entry = &self.entries[index];
        let mut word = entry.load(Ordering::Relaxed);
        while deadline(word) == 0 {
            let new = held_until | freed(word);
            // `SeqCst`, as every access the byte records order against (see
            // `bytes`); a failure learns nothing.
            match entry.compare_exchange(word, new, Ordering::SeqCst, Ordering::Relaxed) {
                Ok(_) => return Some(new),
                Err(actual) => word = actual,
            }
        }
        None
    }

    /// Frees entry `index` if it still holds `word`.
    #[inline(always)]
    pub(super) fn free(&self, index: usize, word: u64) -> bool {
        // `SeqCst`, as every access the byte records order against.
        self.entries[index]
            .compare_exchange(word, freed(word), Ordering::SeqCst, Ordering::Relaxed)
            .is_ok()
    }

    /// Whether some entry may have passed its deadline at `now`.
    #[inline(always)]
    pub(super) fn sweep_due(&self, now: u64) -> bool {
        self.next_sweep.load(Ordering::Acquire) <= now
    }

    /// Frees every entry past its deadline at `now`, if a sweep is due,
    /// handing each freed word to `freed_one` (under the sweep's lock).
    /// Callers that arrive while one sweeps wait for it, then find nothing
    /// due: none is shed beside an expired entry that a sweep is about to
    /// free.
    #[cold]
    pub(super) fn sweep(&self, now: u64, hold: u64, mut freed_one: impl FnMut(usize, u64)) {
        self.scan(now, hold, |index, word| {
            if self.free(index, word) {
                freed_one(index, word);
            }
            true
        });
    }

    /// Whether any entry is past its deadline at `now`, without freeing it.
    /// A look that finds none moves the sweep's date on, as a sweep would,
    /// so that the next costs one load.
    pub(super) fn any_expired(&self, now: u64, hold: u64) -> bool {
        !self.scan(now, hold, |_, _| false)
    }

    /// Whether no entry is held past `now`: every claim held has passed its
    /// deadline. Reads only; frees nothing.
    pub(super) fn holds_only_expired(&self, now: u64) -> bool {
        self.entries
            .iter()
            .all(|entry| deadline(entry.load(Ordering::SeqCst)) <= now)
    }

    /// If a sweep is due, hands each entry past its deadline at `now` to
    /// `expired`, under the sweep's lock, until it returns `false`. A scan
    /// that goes through moves the sweep's date on to the earliest deadline
    /// still held, and returns `true`.
    fn scan(&self, now: u64, hold: u64, mut expired: impl FnMut(usize, u64) -> bool) -> bool {
        if !self.sweep_due(now) {
            return true;
        }
        let _sweeping = lock(&self.sweeping);
        if !self.sweep_due(now) {
            return true;
        }
        // Claims made from now on expire at `now + hold` or later.
        let mut earliest = now.saturating_add(hold);
        for (index, entry) in self.entries.iter().enumerate() {
            let word = entry.load(Ordering::SeqCst);
            match deadline(word) {
                0 => {}
                until if until <= now => {
                    if !expired(index, word) {
                        return false;
                    }
                }
                until => earliest = earliest.min(until),
            }
        }
        self.next_sweep.store(earliest, Ordering::Release);
        true
    }

    /// Frees every held entry, whoever holds it, handing each held word to
    /// `freed_one`, under the sweep's lock (so that no sweep gives back what
    /// this frees, or bytes from before it). Each gets a new generation, so
    /// the claims that held them can no longer free anything.
    pub(super) fn clear(&self, mut freed_one: impl FnMut(usize, u64)) {
        let _sweeping = lock(&self.sweeping);
        for (index, entry) in self.entries.iter().enumerate() {
            // `SeqCst`, as a release is: waiters find these as released.
            let held = entry.fetch_update(Ordering::SeqCst, Ordering::Relaxed, |word| {
                (deadline(word) != 0).then(|| freed(word))
            });
            if let Ok(word) = held {
                freed_one(index, word);
            }
        }
    }
}

/// Where the calling thread starts probing a ledger of `len` entries: its
/// hash mapped onto `0..len` by a multiply and a shift. A thread returns to
/// the entry it freed last, still in its cache, and threads spread out over
/// the ledger.
#[inline(always)]
pub(super) fn start(len: usize) -> usize {
    // Loom runs each thread on stacks placed anew in every execution: a
    // start from the stack would make its models nondeterministic.
    if cfg!(tower_inflight_loom) {
        return 0;
    }
    (((crate::sync::thread_hash() >> 32) * len as u64) >> 32) as usize
}
