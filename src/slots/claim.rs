//! A claim: the slot a caller holds and the exact word it wrote there, with,
//! for a weighted claim, its weight and how many of its slots were reclaimed.

use std::num::NonZeroU64;

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
const GRANTED: u64 = 1 << 61;
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
    pub(super) fn new(index: usize, word: u64, reclaimed: bool, sample: bool) -> Self {
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
    pub(super) fn weighted(mut self, weight: usize, reclaims: usize) -> Self {
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

    /// The claim, marked as made on behalf of a waiting caller: its slots
    /// were counted as held (in the in-flight gauge) when it was made, not
    /// when it becomes a permit, since a reclaim may take them meanwhile.
    pub(crate) fn granted_to_waiter(mut self) -> Self {
        self.tagged_index |= GRANTED;
        self
    }

    /// One slot, neither reclaimed nor handed to a waiting caller nor
    /// sampled: the common claim, whose admission counts one slot held and
    /// nothing else.
    #[inline(always)]
    pub(crate) fn is_plain(&self) -> bool {
        self.tagged_index & (RECLAIMED | SAMPLE | GRANTED | WEIGHT_MASK) == 0
    }

    /// Whether the claim was made on behalf of a waiting caller.
    #[inline]
    pub(crate) fn granted(&self) -> bool {
        self.tagged_index & GRANTED != 0
    }
}
