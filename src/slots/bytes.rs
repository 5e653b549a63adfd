//! The bytes each holder reserved, recorded on its slot and tagged with the
//! holder's generation, so that when a vanished holder's slot is reclaimed
//! its bytes come back with it, and a holder that is merely late finds its
//! record gone and gives back nothing twice.

use crate::slots::free_map::Bound;
use crate::slots::table::{deadline, generation, SlotTable, GENERATION_BITS};
use crate::slots::{ByteBudget, Claim, Epoch};
use crate::sync::Ordering;

impl SlotTable {
    /// Reserves `bytes` of the budget for the holder of `claim` and records
    /// them on its slot. `None` if they do not fit (or there is no budget),
    /// or if `claim` no longer holds its slot: a claim that sat past
    /// `reclaim_after` before it was used, and was taken over meanwhile,
    /// must never write over the record of the slot's new holder.
    pub(crate) fn reserve_bytes(&self, claim: &Claim, bytes: u64) -> Option<Epoch> {
        let budget = self.budget.as_ref()?;
        let epoch = budget.reserve(bytes)?;
        let slot = &self.slot(claim.index());
        let record = (bytes << GENERATION_BITS) | generation(claim.word());
        // Bytes recorded count in their bound, so that a byte refusal knows
        // when a survey may find them expired.
        self.map.lower(Bound::Bytes, deadline(claim.word()));
        // `SeqCst` here and on every access to a record: the holder, a
        // claimer taking the slot over and the sweep for expired bytes each
        // take a record by compare-and-exchange or swap, and the total order
        // over them (and over the slot's word) is what makes the bytes come
        // back once.
        let mut current = slot.bytes.load(Ordering::SeqCst);
        loop {
            if slot.word.load(Ordering::SeqCst) != claim.word() {
                budget.give_back(bytes, epoch);
                return None;
            }
            match slot
                .bytes
                .compare_exchange(current, record, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => break,
                Err(actual) => current = actual,
            }
        }
        // This claim holds the slot, so a record with bytes on it is that of
        // a holder it was taken from (one that used its claim too late):
        // those bytes come back now, once, since the record was taken.
        let stale = current >> GENERATION_BITS;
        if stale != 0 {
            budget.give_back_abandoned(stale);
        }
        // Taken over between the check and the record: the claim that took
        // the slot takes this record too (and gives its bytes back), unless
        // it is undone here first.
        if slot.word.load(Ordering::SeqCst) != claim.word() {
            let undone = slot.bytes.compare_exchange(
                record,
                generation(claim.word()),
                Ordering::SeqCst,
                Ordering::Relaxed,
            );
            if undone.is_ok() {
                budget.give_back(bytes, epoch);
            }
            return None;
        }
        Some(epoch)
    }

    /// Whether `claim` still holds its slot at `now`: no reclaim or reset
    /// has taken it over, and its deadline has not passed (past it, anyone
    /// may reclaim the slot).
    pub(crate) fn holds(&self, claim: &Claim, now: u64) -> bool {
        deadline(claim.word()) > now
            && self.slot(claim.index()).word.load(Ordering::SeqCst) == claim.word()
    }

    /// The holder of `claim` takes its `bytes` off its slot's record, to give
    /// them back or to hold them apart from the slot. `false` if they are no
    /// longer there: a reclaim or a reset has already given them back.
    pub(crate) fn unrecord_bytes(&self, claim: &Claim, bytes: u64) -> bool {
        let record = (bytes << GENERATION_BITS) | generation(claim.word());
        self.slot(claim.index())
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
    pub(super) fn recover_abandoned_bytes(&self, claim: &Claim) {
        self.give_back_recorded_bytes(claim.index(), claim.word());
    }

    /// After slot `index` was rewritten to `word` (a new generation) over a
    /// holder that vanished: gives back the bytes that holder had recorded.
    pub(super) fn give_back_recorded_bytes(&self, index: usize, word: u64) {
        let Some(budget) = &self.budget else { return };
        let record = self
            .slot(index)
            .bytes
            .swap(generation(word), Ordering::SeqCst);
        let abandoned = record >> GENERATION_BITS;
        if abandoned != 0 && generation(record) != generation(word) {
            budget.give_back_abandoned(abandoned);
        }
    }

    /// Gives back the bytes of every holder that kept its slot past its
    /// deadline; returns whether any came back (or may have: a survey was
    /// running, and the caller should try again).
    ///
    /// A claim recovers an expired holder's bytes only when it lands on that
    /// very slot, and a free slot earlier in a caller's search may always be
    /// taken first: so when the budget looks spent, this looks for such bytes
    /// everywhere before a call is shed for them. It reads every slot, but
    /// only once the earliest deadline among the holders with bytes (as of
    /// the last survey, lowered by each reservation since) has passed, so
    /// that a flood of calls refused for their bytes does not read the whole
    /// table each.
    #[cold]
    pub(crate) fn recover_expired_bytes(&self, now: u64) -> bool {
        if self.budget.is_none() {
            return false;
        }
        // A survey running now may be of the bytes, whose bound it has
        // raised while it scans: waited for, and then this one looks
        // itself, and the caller tries again either way.
        let waited = self.map.surveying();
        if waited {
            self.map.wait_for_survey();
        }
        if !self.map.may_have_expired(Bound::Bytes, now) {
            return waited;
        }
        let recovered = self
            .map
            .survey(Bound::Bytes, now, || {
                let mut earliest = u64::MAX;
                let mut recovered = false;
                for index in 0..self.len() {
                    let word = self.slot(index).word.load(Ordering::SeqCst);
                    let until = deadline(word);
                    if until > now {
                        earliest = earliest.min(until);
                    } else if until != 0 && self.recover_expired_record(index, word) {
                        recovered = true;
                        // Its slot, expired, is free: seen by searches too.
                        self.map.mark_free(index);
                    }
                }
                (earliest, recovered)
            })
            .unwrap_or(false);
        waited || recovered
    }

    /// Takes the byte record of the expired holder of slot `index`, whose
    /// word was read as `word`, and gives its bytes back; returns whether
    /// there were any.
    ///
    /// It takes the holder's record (tagged with the holder's generation)
    /// and leaves the slot's word alone. Taking the record with a
    /// compare-and-exchange is what makes the bytes come back exactly once:
    /// if a claimer takes the slot meanwhile, its own swap of the record
    /// either came first (and gave the bytes back) or finds the record
    /// emptied; a record the new holder stores has its generation, so it
    /// does not match. The slot, expired already, is free for anyone; the
    /// claim that takes it counts it as reclaimed, so the count of reclaims
    /// and of slots held stay one with the table. The late holder finds its
    /// record gone and gives back nothing.
    fn recover_expired_record(&self, index: usize, word: u64) -> bool {
        let Some(budget) = &self.budget else {
            return false;
        };
        let slot = self.slot(index);
        let record = slot.bytes.load(Ordering::SeqCst);
        let abandoned = record >> GENERATION_BITS;
        // The record is the expired holder's only if the word is still its
        // word: read again after the record, so that the record and the word
        // were both the holder's at once. (A record's identity is its 22-bit
        // generation: a thread stalled between these reads and the exchange
        // for 2^22 claims of this one slot could still take a live holder's
        // record; a slot claimed that often in so short a stall is out of
        // reach.)
        if abandoned == 0
            || generation(record) != generation(word)
            || slot.word.load(Ordering::SeqCst) != word
        {
            return false;
        }
        let taken = slot
            .bytes
            .compare_exchange(
                record,
                generation(word),
                Ordering::SeqCst,
                Ordering::Relaxed,
            )
            .is_ok();
        if taken {
            budget.give_back_abandoned(abandoned);
        }
        taken
    }
}

#[cfg(all(test, not(tower_inflight_loom)))]
mod tests {
    use super::*;

    const HOLD: u64 = 100;

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

    /// A survey of the free map, running as a call is refused for its
    /// bytes, does not keep the call from looking for expired bytes itself.
    #[test]
    fn a_byte_refusal_during_another_survey_still_finds_expired_bytes() {
        use crate::slots::free_map::Bound;
        use std::sync::Arc;
        const N: usize = 1 << 20;
        for _ in 0..3 {
            let table = Arc::new(SlotTable::new(N, HOLD, Some(1000)));
            let leaked = table.try_claim(1, Ordering::SeqCst).unwrap();
            assert!(table.reserve_bytes(&leaked, 1000).is_some());
            let now = 2 + HOLD;
            let mine = table.try_claim(1, Ordering::SeqCst).unwrap();
            assert!(
                table.reserve_bytes(&mine, 1).is_none(),
                "the budget is spent"
            );
            // A search saw the free map's bound pass: it surveys.
            table.map.lower(Bound::Cleared, 1);
            let surveyor = {
                let table = table.clone();
                std::thread::spawn(move || table.survey(now))
            };
            while !table.map.surveying() && !surveyor.is_finished() {
                std::hint::spin_loop();
            }
            assert!(table.recover_expired_bytes(now));
            assert!(
                table.reserve_bytes(&mine, 1).is_some(),
                "refused beside an expired holder's bytes"
            );
            surveyor.join().unwrap();
        }
    }

    /// Two calls refused for their bytes at once: the second to survey finds
    /// nothing left to recover (the first did), but the bytes are free, so
    /// the reservation tried again after the survey succeeds. This is why
    /// `Shared::permit_with_bytes` tries again whatever the survey says.
    #[test]
    fn a_second_refusal_finds_the_bytes_the_first_recovered() {
        let table = SlotTable::new(4, HOLD, Some(1000));
        let leaked = table.try_claim(1, Ordering::SeqCst).unwrap();
        assert!(table.reserve_bytes(&leaked, 1000).is_some());
        let now = 2 + HOLD;
        let (a, b) = (
            table.try_claim(3, Ordering::SeqCst).unwrap(),
            table.try_claim(3, Ordering::SeqCst).unwrap(),
        );
        assert!(table.reserve_bytes(&a, 1).is_none());
        assert!(table.reserve_bytes(&b, 1).is_none());
        assert!(table.recover_expired_bytes(now));
        assert!(table.reserve_bytes(&b, 1).is_some());
        assert!(!table.recover_expired_bytes(now), "nothing left to recover");
        assert!(
            table.reserve_bytes(&a, 1).is_some(),
            "yet 999 bytes are free"
        );
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
}
