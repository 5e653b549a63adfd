//! Where free slots may be: a tree of bitmaps over the slot table, so that a
//! caller finds a free slot, or learns there is none, by reading a word a
//! level (four at a limit of 1,048,576) instead of every slot.
//!
//! A leaf bit stands for a slot, and a bit higher up for a word of the level
//! below. A set bit means "look here": it may be stale (the slot was claimed
//! since), but a clear bit is a promise, so the map only ever errs towards
//! looking closer. Whoever frees a slot (a release, a rollback, a reset, a
//! survey that finds it expired) sets its bits. The fast path claims its own
//! start slot without touching the map, so bits go stale; a search that
//! meets a stale bit clears it.
//!
//! # Clearing, and the one window it opens
//!
//! A clear bit is only a promise while nobody is clearing. To clear the bit
//! of a slot seen held, a cleaner clears it, then reads the slot again: if
//! the slot came free meanwhile (its releaser saw the bit still set and left
//! it), the cleaner takes the slot or sets the bit again. Between the clear
//! and that second read, the slot is free and its bit is clear. So clearing
//! happens in brackets: one cleaner at a time (a `try_lock`), and a count
//! raised as a bracket opens and as it closes. A search that found nothing
//! concludes that the table is full only if no bracket but its own opened or
//! closed while it looked; otherwise it waits for the bracket to close and
//! looks again. A bracket clears at most [`CLEAN_BATCH`] bits, so nobody
//! waits long for one.
//!
//! # Leaked slots
//!
//! A slot whose holder vanished comes free when its deadline passes, with no
//! release to set its bit. `earliest` is a lower bound on the deadline of
//! every held slot whose bit is clear: a cleaner lowers it to the deadline of
//! each slot whose bit it clears, before clearing it. (A second bound,
//! lowered by each byte reservation, does the same for the bytes of vanished
//! holders: a call refused for its bytes surveys the table for them only
//! once it has passed.) Until `earliest`
//! passes, a slot with a clear bit cannot have expired; after, the next
//! search that finds nothing surveys the table (every slot, once), sets the
//! bits of the expired slots, and raises `earliest` to the earliest deadline
//! still held. Under a steady load, a survey comes about once per
//! `reclaim_after`.
//!
//! # Memory ordering
//!
//! Every access to a bit is `SeqCst`, as are the slot accesses it pairs
//! with, for two store-buffering patterns: a releaser frees its slot, then
//! reads the bit; a cleaner clears the bit, then reads the slot. One of them
//! sees the other. The same holds one level up, with a leaf word for the
//! slot.

use crate::sync::{fence, lock, loom_seqcst_fence, AtomicU64, Mutex, MutexGuard, Ordering};

/// Bits a bracket may clear before it closes.
pub(super) const CLEAN_BATCH: usize = 64;
/// Levels of a map over at most 64^4 slots.
const MAX_LEVELS: usize = 4;

#[derive(Debug)]
pub(super) struct FreeMap {
    /// Every level's words, the leaves first.
    words: Box<[AtomicU64]>,
    /// Where each level starts in `words`.
    starts: [usize; MAX_LEVELS],
    levels: usize,
    /// What cleaners and surveys write, on lines of its own: every release
    /// reads the fields above.
    watch: Watch,
}

#[derive(Debug)]
#[repr(align(64))]
struct Watch {
    /// A lower bound on the deadline of every held slot whose bit is clear.
    earliest: AtomicU64,
    /// A lower bound on the deadline of every held slot with bytes recorded.
    earliest_bytes: AtomicU64,
    /// Held by the one cleaner at a time.
    cleaning: Mutex<()>,
    /// Raised as a bracket opens and as it closes: odd while one is open.
    brackets: AtomicU64,
    /// Held by a survey.
    surveying: Mutex<()>,
    /// Raised as a survey starts and as it ends: odd while one runs. While a
    /// survey scans, its bound is raised past every deadline, so a search
    /// that overlapped one cannot trust the bound it read.
    surveys: AtomicU64,
}

/// The counts of brackets and surveys, read when neither was under way: a
/// search that finds nothing trusts it only if they are the same after.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Quiet {
    brackets: u64,
    surveys: u64,
}

impl Quiet {
    /// A survey was running when these counts were read.
    pub(super) fn surveying(&self) -> bool {
        self.surveys % 2 != 0
    }
}

/// What a lower bound on deadlines stands for.
#[derive(Clone, Copy, Debug)]
pub(super) enum Bound {
    /// Held slots whose bit is clear.
    Cleared,
    /// Held slots with bytes recorded.
    Bytes,
}

/// An open bracket: the right to clear bits, for [`CLEAN_BATCH`] of them.
pub(super) struct Bracket<'a> {
    map: &'a FreeMap,
    _cleaning: MutexGuard<'a, ()>,
    pub(super) cleared: usize,
}

impl Drop for Bracket<'_> {
    fn drop(&mut self) {
        // `SeqCst`: a search that reads this count after it reads the bits
        // knows every bit this bracket set again is visible to it.
        self.map.watch.brackets.fetch_add(1, Ordering::SeqCst);
    }
}

impl FreeMap {
    /// A map of `len` slots, every one free.
    pub(super) fn new(len: usize) -> Self {
        assert!(len <= 1 << (6 * MAX_LEVELS), "a table too large to map");
        let mut starts = [0; MAX_LEVELS];
        let mut levels = 0;
        let mut total = 0;
        let mut below = len.max(1);
        loop {
            starts[levels] = total;
            let words = below.div_ceil(64);
            total += words;
            levels += 1;
            if words == 1 {
                break;
            }
            below = words;
        }
        let words = (0..total).map(|_| AtomicU64::new(0)).collect();
        let map = Self {
            words,
            starts,
            levels,
            watch: Watch {
                earliest: AtomicU64::new(u64::MAX),
                earliest_bytes: AtomicU64::new(u64::MAX),
                cleaning: Mutex::new(()),
                brackets: AtomicU64::new(0),
                surveying: Mutex::new(()),
                surveys: AtomicU64::new(0),
            },
        };
        for index in 0..len {
            map.mark_free(index);
        }
        map
    }

    pub(super) fn levels(&self) -> usize {
        self.levels
    }

    /// Word `index` of `level`.
    #[inline(always)]
    pub(super) fn word(&self, level: usize, index: usize) -> &AtomicU64 {
        &self.words[self.starts[level] + index]
    }

    /// Slot `index` may be free: sets its bit, and every bit above it that
    /// is clear. A releaser calls this after freeing the slot.
    ///
    /// Each bit is read before it is set: it is usually set still (the fast
    /// path leaves bits stale), and a read leaves the line shared between
    /// threads. A bit seen set does not end the climb: whoever set it may
    /// not have set the bits above it yet.
    #[inline(always)]
    pub(super) fn mark_free(&self, index: usize) {
        loom_seqcst_fence();
        // The leaves come first in `words`.
        let (leaf, bit) = (&self.words[index / 64], 1 << (index % 64));
        if leaf.load(Ordering::SeqCst) & bit == 0 {
            leaf.fetch_or(bit, Ordering::SeqCst);
        }
        if self.levels > 1 {
            self.mark_above(index / 64);
        }
    }

    /// The climb of [`mark_free`](Self::mark_free) above the leaves, for
    /// leaf word `position`.
    fn mark_above(&self, position: usize) {
        let mut position = position;
        for level in 1..self.levels {
            loom_seqcst_fence();
            let bit = 1 << (position % 64);
            let word = self.word(level, position / 64);
            if word.load(Ordering::SeqCst) & bit == 0 {
                word.fetch_or(bit, Ordering::SeqCst);
            }
            position /= 64;
        }
    }

    /// Sets bit `position` of `level` and every bit above it: a cleaner
    /// that cleared them and then saw something free below.
    #[cold]
    pub(super) fn set_again(&self, level: usize, position: usize) {
        let mut position = position;
        for level in level..self.levels {
            loom_seqcst_fence();
            let bit = 1 << (position % 64);
            self.word(level, position / 64)
                .fetch_or(bit, Ordering::SeqCst);
            position /= 64;
        }
    }

    /// Clears bit `position` of `level`; returns the word as it was.
    /// Only under an open bracket.
    pub(super) fn clear(&self, _bracket: &Bracket<'_>, level: usize, position: usize) -> u64 {
        let bit = 1 << (position % 64);
        let before = self
            .word(level, position / 64)
            .fetch_and(!bit, Ordering::SeqCst);
        loom_seqcst_fence();
        before
    }

    fn bound(&self, of: Bound) -> &AtomicU64 {
        match of {
            Bound::Cleared => &self.watch.earliest,
            Bound::Bytes => &self.watch.earliest_bytes,
        }
    }

    /// Lowers a bound to `deadline`: before the bit of a slot held until
    /// then is cleared, or bytes are recorded on it.
    pub(super) fn lower(&self, of: Bound, deadline: u64) {
        let bound = self.bound(of);
        if bound.load(Ordering::SeqCst) > deadline {
            bound.fetch_min(deadline, Ordering::SeqCst);
        }
        loom_seqcst_fence();
    }

    /// Whether a slot under the bound may have expired at `now`.
    pub(super) fn may_have_expired(&self, of: Bound, now: u64) -> bool {
        self.bound(of).load(Ordering::SeqCst) <= now
    }

    /// Opens a bracket, unless another cleaner has one open.
    pub(super) fn try_bracket(&self) -> Option<Bracket<'_>> {
        let cleaning = match self.watch.cleaning.try_lock() {
            Ok(guard) => guard,
            #[cfg(not(tower_inflight_loom))]
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(_) => return None,
        };
        Some(self.open(cleaning))
    }

    /// Opens a bracket, waiting for another cleaner's to close: for a search
    /// that keeps it open from start to end, so that no other can open.
    pub(super) fn bracket(&self) -> Bracket<'_> {
        self.open(lock(&self.watch.cleaning))
    }

    fn open<'a>(&'a self, cleaning: MutexGuard<'a, ()>) -> Bracket<'a> {
        self.watch.brackets.fetch_add(1, Ordering::SeqCst);
        loom_seqcst_fence();
        Bracket {
            map: self,
            _cleaning: cleaning,
            cleared: 0,
        }
    }

    /// The counts of brackets and surveys, once neither is under way:
    /// waits for an open bracket to close and a running survey to end.
    pub(super) fn settled(&self) -> Quiet {
        loop {
            let quiet = self.quiet();
            if quiet.brackets % 2 != 0 {
                drop(lock(&self.watch.cleaning));
            } else if quiet.surveys % 2 != 0 {
                drop(lock(&self.watch.surveying));
            } else {
                return quiet;
            }
        }
    }

    /// The counts of brackets and surveys, now. After the loads that came
    /// before (a search's loads of the bits, relaxed on the fast path).
    pub(super) fn quiet(&self) -> Quiet {
        fence(Ordering::Acquire);
        loom_seqcst_fence();
        Quiet {
            brackets: self.watch.brackets.load(Ordering::SeqCst),
            surveys: self.watch.surveys.load(Ordering::SeqCst),
        }
    }

    /// Whether a survey is running now.
    pub(super) fn surveying(&self) -> bool {
        self.quiet().surveying()
    }

    /// Waits for a running survey to end.
    pub(super) fn wait_for_survey(&self) {
        drop(lock(&self.watch.surveying));
    }

    /// Whether `before`, less `own` brackets opened and closed by the
    /// caller, is what the counts are now.
    pub(super) fn still(&self, before: Quiet, own: u64) -> bool {
        let now = self.quiet();
        !before.surveying()
            && now.surveys == before.surveys
            && now.brackets == before.brackets + 2 * own
    }

    /// Surveys for the bound: the caller runs `scan` (which deals with the
    /// expired slots and returns the earliest deadline still held) unless
    /// another survey has already raised the bound past `now`. Returns what
    /// `scan` returned, if it ran.
    pub(super) fn survey<T>(
        &self,
        of: Bound,
        now: u64,
        scan: impl FnOnce() -> (u64, T),
    ) -> Option<T> {
        let _surveying = lock(&self.watch.surveying);
        if !self.may_have_expired(of, now) {
            return None;
        }
        let bound = self.bound(of);
        self.watch.surveys.fetch_add(1, Ordering::SeqCst);
        // Raised first, then lowered to what the scan saw: a cleaner that
        // lowers it meanwhile keeps its deadline (`fetch_min`), and every
        // slot held before the scan reads it is in the scan's minimum. A
        // search meanwhile reads a bound too high, and knows it by the count
        // of surveys.
        bound.store(u64::MAX, Ordering::SeqCst);
        loom_seqcst_fence();
        let (earliest, result) = scan();
        bound.fetch_min(earliest, Ordering::SeqCst);
        self.watch.surveys.fetch_add(1, Ordering::SeqCst);
        Some(result)
    }

    /// Sets every bit: after a reset, every slot is free.
    pub(super) fn mark_all_free(&self, len: usize) {
        for index in 0..len {
            self.mark_free(index);
        }
    }
}

#[cfg(all(test, not(tower_inflight_loom)))]
mod tests {
    use super::*;

    #[test]
    fn levels_grow_by_64() {
        for (len, levels) in [(1, 1), (64, 1), (65, 2), (4096, 2), (4097, 3), (1 << 20, 4)] {
            assert_eq!(FreeMap::new(len).levels(), levels, "{len} slots");
        }
    }

    #[test]
    fn a_new_map_has_every_slot_free_and_no_bit_beyond() {
        let map = FreeMap::new(130);
        assert_eq!(map.word(0, 0).load(Ordering::SeqCst), u64::MAX);
        assert_eq!(map.word(0, 1).load(Ordering::SeqCst), u64::MAX);
        assert_eq!(map.word(0, 2).load(Ordering::SeqCst), 0b11);
        assert_eq!(map.word(1, 0).load(Ordering::SeqCst), 0b111);
    }

    #[test]
    fn clearing_then_marking_free_sets_the_bits_above_again() {
        let map = FreeMap::new(4097);
        let bracket = map.try_bracket().unwrap();
        // Empty the leaf word of slot 4096, and the words above it.
        map.clear(&bracket, 0, 4096);
        map.clear(&bracket, 1, 64);
        map.clear(&bracket, 2, 1);
        drop(bracket);
        assert_eq!(map.word(2, 0).load(Ordering::SeqCst), 0b01);
        map.mark_free(4096);
        assert_eq!(map.word(0, 64).load(Ordering::SeqCst), 1);
        assert_eq!(map.word(1, 1).load(Ordering::SeqCst), 1);
        assert_eq!(map.word(2, 0).load(Ordering::SeqCst), 0b11);
    }

    #[test]
    fn one_bracket_at_a_time_and_the_count_tells_when_one_was_open() {
        let map = FreeMap::new(8);
        let before = map.settled();
        let bracket = map.try_bracket().unwrap();
        assert!(map.try_bracket().is_none());
        assert!(!map.still(before, 0));
        drop(bracket);
        assert!(map.still(before, 1));
        assert_eq!(map.settled(), map.quiet());
    }
}
