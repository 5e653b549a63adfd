//! Weighted claims: `weight` slots taken together, or none. One claim stands
//! for them all; the others are its companions, released with it.

use crate::slots::table::{generation, SlotTable, GENERATION_BITS};
use crate::slots::Claim;
use crate::sync::{lock, Ordering};

impl SlotTable {
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
            self.slot(primary.index()).word.load(Ordering::Relaxed) == primary.word()
        });
        table.push((claim, companions.into_boxed_slice()));
        Some(claim)
    }

    /// Gives back the slots of a weighted claim that could not be completed.
    /// A slot taken over from a vanished holder is left expired rather than
    /// released, so that it still counts as reclaimed when it is next
    /// claimed (its bytes have come back already).
    #[cold]
    pub(super) fn roll_back(&self, companions: &[Claim], now: u64) {
        for companion in companions {
            let deadline = if companion.reclaimed() { now } else { 0 };
            let expired = (deadline << GENERATION_BITS) | generation(companion.word());
            let rolled_back = self.slot(companion.index()).word.compare_exchange(
                companion.word(),
                expired,
                Ordering::SeqCst,
                Ordering::Relaxed,
            );
            if rolled_back.is_ok() {
                self.map.mark_free(companion.index());
            }
        }
    }

    /// The slots `claim` holds, its own first: for tests.
    pub(crate) fn slot_indices(&self, claim: &Claim) -> Vec<usize> {
        let mut indices = vec![claim.index()];
        if claim.is_weighted() {
            let table = lock(&self.companions);
            if let Some((_, companions)) = table.iter().find(|(primary, _)| {
                primary.index() == claim.index() && primary.word() == claim.word()
            }) {
                indices.extend(companions.iter().map(Claim::index));
            }
        }
        indices
    }

    /// Frees the other slots of a weighted claim. Each is freed only if it
    /// still holds the word written for this claim, as any slot is, so a late
    /// release frees nothing that has been handed on.
    #[cold]
    pub(super) fn release_companions(&self, claim: &Claim) -> usize {
        let mut table = lock(&self.companions);
        // By index and word: the flags of a claim (handed to a waiter, sampled)
        // may differ from those of the entry recorded when it was made.
        let Some(at) = table.iter().position(|(primary, _)| {
            primary.index() == claim.index() && primary.word() == claim.word()
        }) else {
            return 0;
        };
        let (_, companions) = table.swap_remove(at);
        drop(table);
        companions
            .iter()
            .filter(|companion| self.release_one(companion))
            .count()
    }
}
