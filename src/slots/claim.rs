//! A claim: the ledger entry a caller holds and the exact word it wrote
//! there, its weight, and whether it took slots a sweep reclaimed.

use std::num::NonZeroU64;

/// Sixteen bytes with a niche, so that an `Option<Claim>` travels in two
/// registers rather than being pieced together in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Claim {
    word: NonZeroU64,
    /// The entry's index (low 21 bits), the weight less one (the next 20),
    /// and `RECLAIMED` in the top bit.
    tagged_index: u64,
}

const INDEX_BITS: u32 = 21;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;
const WEIGHT_MASK: u64 = ((1 << 20) - 1) << INDEX_BITS;
const RECLAIMED: u64 = 1 << 63;

/// A claim samples the slots held (for the minute's peak, and for the
/// hold-time histogram) when its word's generation, masked with this, is
/// 1: the first claim of each entry, and one in 32 after (a claim and its
/// release each bump the generation).
const SAMPLE_MASK: u64 = 63;

impl Claim {
    #[inline(always)]
    pub(super) fn new(index: usize, word: u64, weight: usize, reclaimed: bool) -> Self {
        // A held word is never 0: its deadline is at least 1.
        let word = NonZeroU64::new(word).unwrap_or(NonZeroU64::MIN);
        let tagged_index =
            index as u64 | ((weight as u64 - 1) << INDEX_BITS) | (u64::from(reclaimed) * RECLAIMED);
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

    /// How many slots the claim holds.
    #[inline]
    pub(crate) fn weight(&self) -> usize {
        ((self.tagged_index & WEIGHT_MASK) >> INDEX_BITS) as usize + 1
    }

    /// The claim was admitted on slots that a sweep had just reclaimed from
    /// holders that kept them past `reclaim_after`.
    #[inline]
    pub(crate) fn reclaimed(&self) -> bool {
        self.tagged_index & RECLAIMED != 0
    }

    /// This claim is one of those chosen to sample how many slots are held.
    #[inline]
    pub(crate) fn sample(&self) -> bool {
        self.word.get() & SAMPLE_MASK == 1
    }
}
