//! The permit: one held slot (and, where taken, a share of the byte budget),
//! given back when dropped.

use crate::adaptive::Outcome;
use crate::bulkhead::{Shared, Started};
use crate::ceiling::HeldLease;
use crate::error::{ServiceSaturated, ShedReason};
use crate::slots::Claim;
use crate::sync::Arc;
use std::fmt;

/// One slot of a [`Bulkhead`](crate::Bulkhead), held until the permit is
/// dropped, and the bytes reserved with it, if any.
///
/// A permit is `Send` and `'static`: move it into a spawned task or a
/// response body so that the slot lives exactly as long as the work it stands
/// for. Dropping it frees the slot at once, or hands it to the longest-waiting
/// caller. A permit that is never dropped (`mem::forget`, a leaked future)
/// holds its slot only until `reclaim_after`; after that, its drop does
/// nothing, so it can never free a slot that has been handed to someone else.
#[must_use = "the slot is released as soon as the permit is dropped"]
pub struct Permit {
    shared: Arc<Shared>,
    claim: Claim,
    /// Its share of the byte budget, in bytes, recorded on its slot.
    share: u64,
    /// For an adaptive limit: when the call started, and what its drop
    /// says if [`record`](Self::record) was not called. `None` without an
    /// adaptive limit, or once recorded.
    sample: Option<PendingSample>,
}

/// A permit's sample for the adaptive limit, not yet recorded.
#[derive(Clone, Copy, Debug)]
struct PendingSample(Started);

// Every permit carries one, adaptive or not: kept to a word.
const _: () = assert!(std::mem::size_of::<Option<PendingSample>>() == 8);

// Its bulkhead, its claim, its bytes and its sample, ceiling or not: a
// lease is held beside its claim, by the bulkhead (see `Leases`).
#[cfg(all(target_pointer_width = "64", not(tower_inflight_loom)))]
const _: () = assert!(std::mem::size_of::<Permit>() == 40);

impl PendingSample {
    /// The permit was dropped with no outcome recorded, having `released`
    /// its slot: if a reclaim had freed it, its hold is no latency.
    #[cold]
    fn dropped_unrecorded(self, shared: &Shared, claim: &Claim, released: bool) {
        let outcome = if !released || std::thread::panicking() {
            Outcome::Ignore
        } else {
            self.0.on_drop()
        };
        shared.record_outcome(self.0, claim, outcome);
    }
}

/// One slot of a [`Bulkhead`](crate::Bulkhead), borrowed from it for a
/// scope, from [`Bulkhead::try_acquire_borrowed`](crate::Bulkhead::try_acquire_borrowed).
///
/// The same as a [`Permit`], without a share in the bulkhead's ownership:
/// it cannot outlive the `&Bulkhead` it came from, and carries no bytes.
#[must_use = "the slot is released as soon as the permit is dropped"]
pub struct BorrowedPermit<'a> {
    shared: &'a Shared,
    claim: Claim,
    /// As a [`Permit`]'s.
    sample: Option<PendingSample>,
}

impl<'a> BorrowedPermit<'a> {
    #[inline(always)]
    pub(crate) fn new(shared: &'a Shared, claim: Claim) -> Self {
        // Counted before the permit is built: built first, it had to be kept
        // in memory across the call, which cost the fast path 8 ns. A hook
        // that panics here gives the slot back itself (see `admitted`).
        shared.admitted(&claim, 0);
        let sample = shared.start_sample().map(PendingSample);
        Self {
            shared,
            claim,
            sample,
        }
    }

    /// As [`Permit::record`].
    pub fn record(&mut self, outcome: Outcome) {
        if let Some(pending) = self.sample.take() {
            self.shared.record_outcome(pending.0, &self.claim, outcome);
        }
    }

    /// Whether this slot was reclaimed from an earlier holder that kept it
    /// past `reclaim_after` without releasing it.
    pub fn was_reclaimed(&self) -> bool {
        self.claim.reclaimed()
    }
}

impl Drop for BorrowedPermit<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        let released = self.shared.release_permit(&self.claim);
        // Read, not taken: the permit is gone after this.
        if let Some(pending) = self.sample {
            pending.dropped_unrecorded(self.shared, &self.claim, released);
        }
    }
}

impl fmt::Debug for BorrowedPermit<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BorrowedPermit")
            .field("slot", &self.claim.index())
            .field("bulkhead", &self.shared.config().name.as_deref())
            .finish()
    }
}

/// A share of a bulkhead's byte budget, returned when dropped.
///
/// Split from a [`Permit`] with [`Permit::split_bytes`] when the bytes must
/// outlive the call's slot, or come back before it: the budget stands for a
/// buffer, so it should come back after the last access to that buffer, while
/// the slot comes back when the work completes.
#[must_use = "the bytes are returned as soon as the reservation is dropped"]
pub struct ByteReservation {
    shared: Arc<Shared>,
    /// Its share of the byte budget, in bytes, on no slot.
    share: u64,
}

impl Permit {
    #[inline(always)]
    pub(crate) fn new(shared: Arc<Shared>, claim: Claim) -> Self {
        Self::with_share(shared, claim, 0)
    }

    /// A permit for `claim` and the bytes of `share`, recorded on its slot
    /// already.
    #[inline(always)]
    pub(crate) fn with_share(shared: Arc<Shared>, claim: Claim, share: u64) -> Self {
        // Counted before the permit is built, as for `BorrowedPermit::new`.
        shared.admitted(&claim, share);
        let sample = shared.start_sample().map(PendingSample);
        Self {
            shared,
            claim,
            share,
            sample,
        }
    }

    /// Tells the bulkhead's adaptive limit how the call went, now: its
    /// latency is measured to this moment. Without it, a permit dropped is
    /// a [`Success`](Outcome::Success) measured to its drop (or ignored if
    /// its thread is panicking, or its slot was reclaimed). Only the first outcome counts; without an
    /// adaptive limit it does nothing. The layers record their calls'
    /// outcomes themselves.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_inflight::adaptive::{Adaptive, Outcome};
    /// use tower_inflight::{Bulkhead, Config};
    ///
    /// let bulkhead = Bulkhead::new(
    ///     Config::new(100, Duration::from_secs(30)).adaptive(Adaptive::default()),
    /// );
    /// let mut permit = bulkhead.try_acquire().unwrap();
    /// // The call was answered from a cache: no sample of the dependency.
    /// permit.record(Outcome::Ignore);
    /// ```
    pub fn record(&mut self, outcome: Outcome) {
        if let Some(pending) = self.sample.take() {
            self.shared.record_outcome(pending.0, &self.claim, outcome);
        }
    }

    /// Unless [`record`](Self::record) is called, the permit's drop is no
    /// sample: a layer's call cancelled before it finished says nothing.
    #[inline]
    pub(crate) fn ignore_unless_recorded(&mut self) {
        if let Some(pending) = &mut self.sample {
            pending.0.ignore_on_drop();
        }
    }

    /// Records the outcome of a call that ended with `result`: an error is
    /// classified by the adaptive limit (a timeout is a drop).
    #[inline]
    pub(crate) fn record_result<T>(&mut self, result: Result<&T, &crate::BoxError>) {
        if self.sample.is_none() {
            return;
        }
        let outcome = match (result, self.shared.adaptive()) {
            (Ok(_), _) => Outcome::Success,
            (Err(error), Some(adaptive)) => adaptive.classify_error(&**error),
            (Err(_), None) => Outcome::Ignore,
        };
        self.record(outcome);
    }

    /// Records the outcome of a call that failed with `error`, of any type
    /// (see `AdaptiveLimit::classify_any`).
    #[cfg(feature = "http")]
    pub(crate) fn record_error(&mut self, error: &dyn std::any::Any) {
        if self.sample.is_none() {
            return;
        }
        let outcome = self
            .shared
            .adaptive()
            .map_or(Outcome::Ignore, |adaptive| adaptive.classify_any(error));
        self.record(outcome);
    }

    /// Takes the permit's bytes off its slot's record; 0 if a reclaim or a
    /// reset has given them back already.
    fn take_bytes(&mut self) -> u64 {
        let share = std::mem::take(&mut self.share);
        if share != 0 && self.shared.slots().unrecord_bytes(&self.claim, share) {
            share
        } else {
            0
        }
    }

    /// Whether this slot was reclaimed from an earlier holder that kept it
    /// past `reclaim_after` without releasing it: a leak, or a
    /// `reclaim_after` shorter than your slowest legitimate call.
    pub fn was_reclaimed(&self) -> bool {
        self.claim.reclaimed()
    }

    /// The ledger entry this permit holds, by index: for tests that model
    /// the table.
    #[doc(hidden)]
    pub fn slot_indices(&self) -> Vec<usize> {
        vec![self.claim.index()]
    }

    /// The bytes of the budget this permit holds (0 if none were reserved, or
    /// they were split off).
    pub fn bytes(&self) -> u64 {
        self.share
    }

    /// Moves the permit's bytes into a reservation of their own, which
    /// returns them when dropped, whether before or after the slot.
    ///
    /// Bytes still held by a permit come back with its slot if the permit is
    /// leaked and the slot reclaimed; a split-off reservation is yours: it
    /// comes back when dropped, and only then (as a lock guard keeps its
    /// lock until it is dropped).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_inflight::{Bulkhead, Config};
    ///
    /// let bulkhead = Bulkhead::new(Config::new(4, Duration::from_secs(30)).max_bytes(1024));
    /// let mut permit = bulkhead.try_acquire_bytes(600).unwrap();
    /// let buffer_bytes = permit.split_bytes();
    /// drop(permit); // the call is done...
    /// assert_eq!(bulkhead.bytes_reserved(), 600); // ...but its buffer lives on
    /// drop(buffer_bytes);
    /// assert_eq!(bulkhead.bytes_reserved(), 0);
    /// ```
    pub fn split_bytes(&mut self) -> ByteReservation {
        ByteReservation {
            shared: self.shared.clone(),
            share: self.take_bytes(),
        }
    }
}

/// Slots handed to a waiting caller that has not made them a permit yet:
/// the bytes it needs come with its call. Given back, unused, if dropped,
/// and handed on to the next in line.
pub(crate) struct Granted {
    shared: Arc<Shared>,
    claim: Option<Claim>,
    /// Its lease under the ceiling, once it has one.
    lease: Option<HeldLease>,
}

impl Granted {
    /// Slots claimed for a caller that will make them a permit later: they
    /// count as held from now.
    pub(crate) fn new(shared: Arc<Shared>, claim: Claim) -> Self {
        Self {
            shared,
            claim: Some(claim),
            lease: None,
        }
    }

    /// The grant, holding `lease` beside its slots.
    pub(crate) fn with_lease(mut self, lease: Option<HeldLease>) -> Self {
        self.lease = lease;
        self
    }

    /// Makes sure the grant still holds what it was granted, counting
    /// nothing: kept past its lease (a service polled ready, called much
    /// later), another replica may hold the lease, so both go back and the
    /// call is shed; kept past `reclaim_after` (a caller that took up its
    /// handed slot late), its slots may have been reclaimed, so they go
    /// back and the grant claims its weight afresh, as if it had not
    /// waited (keeping its lease, if it has one).
    pub(crate) fn renew(&mut self) -> Result<(), ServiceSaturated> {
        let Some(claim) = self.claim else {
            unreachable!("a grant holds its claim until made a permit")
        };
        let shared = &self.shared;
        let now = shared.now();
        if self.lease.as_ref().is_some_and(|lease| lease.lapsed()) {
            self.claim = None;
            // The lease first, then the slots, as every permit gives them.
            drop(self.lease.take());
            shared.give_back_unused(&claim);
            return Err(shared.saturated_at(ShedReason::ClusterLimit, now));
        }
        if !shared.slots().holds(claim.index(), claim.word(), now) {
            self.claim = None;
            shared.give_back_unused(&claim);
            // Read again: giving back may have waited for the line's lock
            // and run the event hook, and the fresh claim is dated by it.
            let now = shared.now();
            let fresh = shared
                .try_claim_weighted(claim.weight(), now)
                .map_err(|reason| shared.saturated_at(reason, now))?;
            self.claim = Some(fresh);
        }
        Ok(())
    }

    /// The permit, with `bytes` of the budget beside its slots, once the
    /// grant is [renewed](Self::renew); or the slots given back and the
    /// call shed if it cannot be, or if the bytes do not fit.
    pub(crate) fn into_permit(mut self, bytes: u64) -> Result<Permit, ServiceSaturated> {
        self.renew()?;
        self.into_renewed_permit(bytes)
    }

    /// The permit of a grant just [renewed](Self::renew), counted as
    /// admitted now, with `bytes` of the budget beside its slots (or the
    /// slots given back and the call shed if the bytes do not fit).
    pub(crate) fn into_renewed_permit(mut self, bytes: u64) -> Result<Permit, ServiceSaturated> {
        let Some(claim) = self.claim.take() else {
            unreachable!("a grant is made a permit once")
        };
        // Held beside the claim, and given back with it, however the
        // permit's making ends.
        if let Some(lease) = self.lease.take() {
            self.shared.hold_lease(&claim, lease);
        }
        Shared::permit(&self.shared, claim, bytes)
    }
}

impl Drop for Granted {
    fn drop(&mut self) {
        // The lease first, as for a permit.
        drop(self.lease.take());
        if let Some(claim) = self.claim.take() {
            self.shared.give_back_unused(&claim);
        }
    }
}

impl fmt::Debug for Granted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Granted")
            .field("slot", &self.claim.map(|claim| claim.index()))
            .finish()
    }
}

impl ByteReservation {
    /// How many bytes this reservation holds.
    pub fn bytes(&self) -> u64 {
        self.share
    }
}

impl Drop for Permit {
    #[inline(always)]
    fn drop(&mut self) {
        let released = self.shared.let_go(&self.claim, self.share);
        // Read, not taken: the permit is gone after this.
        if let Some(pending) = self.sample {
            pending.dropped_unrecorded(&self.shared, &self.claim, released);
        }
    }
}

impl Drop for ByteReservation {
    fn drop(&mut self) {
        self.shared.give_back_bytes(self.share);
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("slot", &self.claim.index())
            .field("bytes", &self.share)
            .field("bulkhead", &self.shared.config().name.as_deref())
            .finish()
    }
}

impl fmt::Debug for ByteReservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ByteReservation")
            .field("bytes", &self.share)
            .field("bulkhead", &self.shared.config().name.as_deref())
            .finish()
    }
}
