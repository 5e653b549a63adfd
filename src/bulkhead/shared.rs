//! The state every clone of a bulkhead shares, and what is done with it:
//! the claim path (the fast path first), admission and its bookkeeping, the
//! turn of the minute for the status windows, byte reservation, and
//! refusals.

use crate::adaptive::{AdaptiveLimit, Outcome, Sample};
use crate::bulkhead::drain::DrainSignal;
use crate::bulkhead::{Clock, Leases, Permit};
use crate::ceiling::HeldLease;
use crate::config::{Config, ConfigError};
use crate::error::{ServiceSaturated, ShedReason};
use crate::observe::{Observer, Rollups, Totals};
use crate::slots::{Claim, SlotTable};
use crate::sync::{Arc, Ordering};
use crate::wait::{Codel, SaturationSignal, WaitEnd, Waiters};
use std::time::Duration;

/// The longest call whose latency is a sample: its start is kept in 32
/// bits of microseconds (about 71 minutes), with some room for the coarse
/// clock's ticks.
const MAX_SAMPLED: Duration = Duration::from_secs(4_000);

/// Whether a bulkhead's status keeps a day's history of minutes for its
/// windows (about 150 bytes a minute).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum History {
    Kept,
    /// For a keyed bulkhead's keys, which report their totals alone, and
    /// may be many.
    None,
}

// Not aligned to a cache line: glibc's allocations so aligned cost about
// twice their size in resident memory while they come and go (as a keyed
// bulkhead's keys do). The `Arc`'s counts, which every owned permit
// writes, may share a line with the admission count, which every claim
// writes too, and two keys' states may share a line where they meet: a
// trade of some contention between hot keys for half the memory.
pub(crate) struct Shared {
    pub(super) slots: SlotTable,
    pub(super) clock: Clock,
    pub(super) waiters: Waiters,
    pub(super) observer: Observer,
    // The settings a bulkhead may not have are boxed, so that one without
    // them (a keyed bulkhead's key, most often) pays a word for each.
    pub(super) saturation: Option<Box<SaturationSignal>>,
    pub(super) codel: Option<Box<Codel>>,
    pub(super) drain: DrainSignal,
    /// The adaptive limit, if the configuration has one.
    adaptive: Option<Box<AdaptiveLimit>>,
    /// The ceiling, if the configuration has one, and its leases. Boxed:
    /// a bulkhead without one pays a word.
    leases: Option<Box<Leases>>,
    /// Shared: the keys of a keyed bulkhead, most of them configured
    /// alike, keep one configuration between them. (A `std` `Arc` under
    /// loom too: it is never written, and its count is no model's concern.)
    pub(super) config: std::sync::Arc<Config>,
}

impl Shared {
    /// The state of a bulkhead built from `config` with a limit of `limit`
    /// (the configuration's own, or a key's), or the field at fault.
    pub(super) fn new(
        config: std::sync::Arc<Config>,
        limit: usize,
        history: History,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        let clock = match &config.clock {
            Some(manual) => Clock::Manual(manual.clone()),
            None => Clock::system(),
        };
        let hold = clock.hold(config.reclaim_after).ok_or_else(|| {
            // `validate` refuses these already; never build a table whose
            // holds are cut short.
            ConfigError::new("reclaim_after", "is over the longest hold a slot can date")
        })?;
        let rollups = match history {
            History::Kept => Rollups::new(clock.ticks_per_minute(), clock.now() - 1),
            History::None => Rollups::without_history(clock.ticks_per_minute()),
        };
        // The limit in force at first: an adaptive one starts lower.
        let initial = config
            .adaptive
            .as_ref()
            .map_or(limit, |adaptive| adaptive.initial_for(limit));
        let observer = Observer::new(
            config.name.as_deref(),
            initial,
            config.on_event.clone(),
            rollups,
            config.adaptive.is_some(),
        );
        let slots = SlotTable::new(limit, clock.now(), hold, config.max_bytes);
        slots.set_limit(initial);
        let adaptive = config
            .adaptive
            .as_ref()
            .map(|adaptive| Box::new(AdaptiveLimit::new(adaptive, limit)));
        #[cfg(feature = "metrics")]
        let slots = slots.with_gauge(observer.in_flight_gauge());
        Ok(Shared {
            slots,
            clock,
            waiters: Waiters::new(),
            observer,
            saturation: config
                .saturation_signal
                .as_deref()
                .map(|&thresholds| Box::new(SaturationSignal::new(thresholds))),
            codel: config
                .codel
                .as_deref()
                .map(|&settings| Box::new(Codel::new(settings))),
            drain: DrainSignal::default(),
            adaptive,
            leases: Leases::new(&config).map(Box::new),
            config,
        })
    }
}

/// When and how a call started, for its adaptive limit's sample: 8 bytes,
/// for every permit carries one.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Started {
    /// On [`Clock::precise_elapsed`], in microseconds, wrapping: a latency
    /// is the difference, right for calls of up to 71 minutes.
    at_micros: u32,
    /// Calls in flight once it was admitted, plus one (never 0, the niche
    /// `Option` takes), and [`Started::IGNORED`] if its permit's drop is no
    /// sample.
    in_flight: std::num::NonZeroU32,
}

impl Started {
    /// The mark of a call whose permit's drop is no sample.
    const IGNORED: u32 = 1 << 31;

    /// Its permit's drop, unless an outcome is recorded first, is no
    /// sample.
    pub(crate) fn ignore_on_drop(&mut self) {
        self.in_flight |= Self::IGNORED;
    }

    /// What its permit's drop says, if no outcome was recorded first.
    pub(crate) fn on_drop(self) -> Outcome {
        if self.in_flight.get() & Self::IGNORED == 0 {
            Outcome::Success
        } else {
            Outcome::Ignore
        }
    }
}

impl Shared {
    /// A slot for a caller that may not wait, or the refusal made a
    /// [`ServiceSaturated`], on one clock read.
    #[inline(always)]
    pub(crate) fn claim_or_shed(&self) -> Result<Claim, ServiceSaturated> {
        self.claim_weighted_or_shed(
            1,
            #[inline(always)]
            |claim| claim,
        )
    }

    /// [`claim_or_shed`](Self::claim_or_shed) for `weight` slots at once,
    /// the claim made what the caller returns by `made` (inlined), so that
    /// the refusal is built in the caller's own `Result`: built in a
    /// `Result<Claim, _>` and then mapped, its 48 bytes would be copied
    /// with wide loads that stall on the narrow stores that have just
    /// written them (store forwarding).
    #[inline(always)]
    pub(crate) fn claim_weighted_or_shed<T>(
        &self,
        weight: usize,
        made: impl FnOnce(Claim) -> T,
    ) -> Result<T, ServiceSaturated> {
        let now = self.clock.now();
        let claim = match self.try_claim_weighted(weight, now) {
            Ok(claim) => claim,
            Err(reason) => return Err(self.saturated_at(reason, now)),
        };
        match &self.leases {
            None => Ok(made(claim)),
            Some(leases) => self.lease_without_round_trip(leases, claim, now).map(made),
        }
    }

    /// For a bulkhead with a ceiling, the lease of a caller that holds its
    /// local slots and may not wait for a round trip: the ceiling's answer
    /// without one; both or neither.
    #[cold]
    fn lease_without_round_trip(
        &self,
        leases: &Leases,
        claim: Claim,
        now: u64,
    ) -> Result<Claim, ServiceSaturated> {
        // The slots go back if the ceiling's code panics.
        let unwinding = OnUnwind::new(|| self.give_back_unused(&claim));
        let answer = leases.try_acquire();
        unwinding.disarm();
        match answer {
            Ok(Some(lease)) => {
                leases.hold(&claim, lease);
                Ok(claim)
            }
            Ok(None) => Ok(claim),
            Err(reason) => {
                self.give_back_unused(&claim);
                Err(self.saturated_at(reason, now))
            }
        }
    }

    /// The ceiling and its leases, if the configuration has a ceiling.
    pub(crate) fn leases(&self) -> Option<&Leases> {
        self.leases.as_deref()
    }

    /// `claim`, about to be made a permit, holds `lease` until it goes
    /// back.
    pub(crate) fn hold_lease(&self, claim: &Claim, lease: HeldLease) {
        if let Some(leases) = &self.leases {
            leases.hold(claim, lease);
        }
    }

    /// Gives back the lease `claim` holds, if it holds one: before its
    /// slots, so that a local caller handed them asks for its own lease
    /// after this one is given back. Cold: a bulkhead without a ceiling
    /// never calls it.
    #[cold]
    fn give_back_lease(&self, leases: &Leases, claim: &Claim) {
        // The slots go back if the lease's drop (the ceiling's code)
        // panics, which skips the caller's release of them.
        let unwinding = OnUnwind::new(|| {
            self.slots.release(claim);
            self.waiters.after_release(&self.slots, &self.clock);
        });
        leases.give_back(claim);
        unwinding.disarm();
    }

    /// Turns away the callers asking for a lease: the bulkhead was closed
    /// (recorded already), or its waiting callers `cancelled`.
    pub(crate) fn turn_away_leasing(&self, cancelled: bool) {
        if let Some(leases) = &self.leases {
            leases.turn_away(cancelled);
        }
    }

    /// Whether a call may have to wait for its slots, and so goes by a
    /// future: a `wait` budget, or a ceiling's lease (a round trip).
    #[inline(always)]
    pub(crate) fn may_wait(&self) -> bool {
        self.config.wait.is_some() || self.has_ceiling()
    }

    /// Whether admission has a step after the local slots (a lease), so
    /// that it must go through [`Acquire`](crate::Acquire).
    #[inline(always)]
    pub(crate) fn has_ceiling(&self) -> bool {
        self.leases.is_some()
    }

    /// The fast path: one load to see that nobody is parked (and that the
    /// bulkhead is open), one compare-and-exchange on the count, one on a
    /// free ledger entry. A shed reads the count and the sweep's date.
    // `always`: the claim must reach the permit in registers; a call here
    // returns it through memory, and the reload stalls on the narrower
    // stores that have just written it (store forwarding).
    #[inline(always)]
    pub(crate) fn try_claim_weighted(&self, weight: usize, now: u64) -> Result<Claim, ShedReason> {
        if weight != 1 && (weight == 0 || weight > self.slots.len()) {
            return Err(ShedReason::InvalidWeight);
        }
        if self.waiters.calm() {
            // A caller that parks after this load arrived, in effect, after
            // this one: it finds every slot held too.
            return self
                .slots
                .try_claim_weighted(now, weight, Ordering::Relaxed)
                .ok_or(ShedReason::LimitReached);
        }
        self.claim_behind_parked(weight)
    }

    #[cold]
    fn claim_behind_parked(&self, weight: usize) -> Result<Claim, ShedReason> {
        if self.waiters.is_closed() {
            return Err(ShedReason::Closed);
        }
        self.waiters
            .claim_behind_parked(&self.slots, &self.clock, weight)
            .ok_or(ShedReason::LimitReached)
    }

    /// The bulkhead's clock.
    pub(crate) fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Called for every permit made, just before it is built: `claim` and
    /// the bytes of `share` (recorded on its slot already) are counted in.
    #[inline(always)]
    pub(crate) fn admitted(&self, claim: &Claim, share: u64) {
        // Counted first: a minute turned here is recorded without it.
        // Relaxed: a count, which publishes nothing.
        self.slots.admitted().fetch_add(1, Ordering::Relaxed);
        self.observer.admitted();
        if claim.sample() {
            self.observer.rollups.see_in_flight(self.slots.in_flight());
        }
        let at = self.slots.claimed_at(claim);
        if self.observer.rollups.minute_turned(at.saturating_sub(1)) {
            self.turn_minute(at, 1);
        }
        if claim.reclaimed() || self.observer.has_hook() {
            self.admitted_events(claim, share);
        }
    }

    /// The slots a sweep reclaimed for this admission are reported, and
    /// the event hook hears of the admission. The permit does not exist
    /// yet: if the hook panics, the slots and bytes are given back here, as
    /// the permit's drop would.
    #[cold]
    #[inline(never)]
    fn admitted_events(&self, claim: &Claim, share: u64) {
        struct GiveBackOnUnwind<'a> {
            shared: &'a Shared,
            claim: Claim,
            share: u64,
            armed: bool,
        }
        impl Drop for GiveBackOnUnwind<'_> {
            fn drop(&mut self) {
                if self.armed {
                    let _ = self.shared.let_go(&self.claim, self.share);
                }
            }
        }
        let mut guard = GiveBackOnUnwind {
            shared: self,
            claim: *claim,
            share,
            armed: true,
        };
        self.report_reclaimed();
        self.observer.admitted_event();
        guard.armed = false;
    }

    /// The holder of `claim` lets go of its slots, and of the bytes of
    /// `share` still recorded on them: a permit's drop, or an event hook
    /// that panicked before the permit was built.
    #[inline(always)]
    pub(crate) fn let_go(&self, claim: &Claim, share: u64) -> bool {
        if share != 0 {
            self.give_back_share(claim, share);
        }
        self.release_permit(claim)
    }

    /// Takes the bytes of `share` off the slot of `claim` and gives them
    /// back to the budget; nothing if a reclaim or a reset gave them back
    /// already.
    fn give_back_share(&self, claim: &Claim, share: u64) {
        if self.slots.unrecord_bytes(claim, share) {
            self.give_back_bytes(share);
        }
    }

    /// Gives the bytes of `share`, no longer recorded on any slot, back to
    /// the budget.
    pub(crate) fn give_back_bytes(&self, share: u64) {
        if share != 0 {
            self.slots.give_back_bytes(share);
            self.observer.bytes(|| self.slots.bytes_reserved());
        }
    }

    /// Records the totals as they were when the minute of `now` began, that
    /// is, less the `new_admissions` that noticed the minute had turned.
    #[cold]
    fn turn_minute(&self, now: u64, new_admissions: u64) {
        let mut totals = self.totals();
        totals.admitted -= new_admissions.min(totals.admitted);
        self.observer
            .rollups
            .turn(now.saturating_sub(1), totals, self.slots.in_flight());
    }

    /// Reports the slots that sweeps reclaimed since the last report:
    /// counted, a warning and an event each. A sweep frees every expired
    /// slot, and the claim that swept takes only its own: the others go to
    /// whoever is parked, as released ones would.
    pub(crate) fn report_reclaimed(&self) {
        let reclaimed = self.slots.take_reclaimed();
        if reclaimed > 0 {
            self.give_back_freed_leases();
            self.waiters.after_release(&self.slots, &self.clock);
            self.observer.reclaimed_with_events(reclaimed);
            self.observer.bytes(|| self.slots.bytes_reserved());
        }
    }

    /// Gives back the leases of claims that a sweep or a reset freed: their
    /// permits were leaked, and will never give them back.
    pub(crate) fn give_back_freed_leases(&self) {
        if let Some(leases) = &self.leases {
            // A held word's deadline is never 0.
            leases.give_back_freed(|index, word| self.slots.holds(index, word, 0));
        }
    }

    /// The holder of `claim` gives it back (in `Permit::drop`). Returns
    /// whether it still held it: false if a reclaim or a reset freed it.
    #[inline(always)]
    pub(crate) fn release_permit(&self, claim: &Claim) -> bool {
        if let Some(leases) = &self.leases {
            self.give_back_lease(leases, claim);
        }
        let released = self.slots.release(claim) > 0;
        if released {
            // The hold time costs a clock read: only sampled claims pay it,
            // and only for the metrics that record it.
            let held = (cfg!(feature = "metrics") && claim.sample()).then(|| {
                let held = self
                    .clock
                    .now()
                    .saturating_sub(self.slots.claimed_at(claim));
                self.clock.duration(held)
            });
            self.observer.released(held);
        }
        // The clock is read only if somebody is parked.
        self.waiters.after_release(&self.slots, &self.clock);
        if self.drain.is_draining() {
            self.wake_drains_if_done();
        }
        released
    }

    /// A drain is under way: if nothing is in flight or waiting now, it is
    /// woken.
    #[cold]
    fn wake_drains_if_done(&self) {
        if self.slots.in_flight() == 0 && self.waiters.parked() == 0 {
            self.drain.finished();
        }
    }

    /// What a drain waits for: calls in flight and callers waiting. Slots
    /// of holders that vanished, past their deadline, are reclaimed first:
    /// no release will ever end them.
    pub(super) fn left_to_drain(&self) -> (usize, usize) {
        let mut in_flight = self.slots.in_flight();
        if in_flight > 0 && self.slots.reclaim_expired(self.clock.now()) > 0 {
            // Reported, and handed to whoever is parked.
            self.report_reclaimed();
            in_flight = self.slots.in_flight();
        }
        (in_flight, self.waiters.parked())
    }

    /// Makes `claim` a permit that holds `bytes` of the byte budget too, or
    /// gives the claim back unused and sheds with [`ShedReason::Bytes`]: a
    /// call refused for its bytes is never counted as admitted. Without a
    /// byte budget, or for no bytes, the permit alone.
    #[inline(always)]
    pub(crate) fn permit(
        shared: &Arc<Shared>,
        claim: Claim,
        bytes: u64,
    ) -> Result<Permit, ServiceSaturated> {
        if bytes == 0 || shared.config.max_bytes.is_none() {
            return Ok(Permit::new(shared.clone(), claim));
        }
        Self::permit_with_bytes(shared, claim, bytes)
    }

    fn permit_with_bytes(
        shared: &Arc<Shared>,
        claim: Claim,
        bytes: u64,
    ) -> Result<Permit, ServiceSaturated> {
        let mut reserved = shared.slots.reserve_bytes(&claim, bytes);
        if !reserved {
            // With their slots: the bytes of holders past their deadlines.
            let recovered = shared.slots.reclaim_expired(shared.clock.now()) > 0;
            // Tried again whether or not this call recovered any: another
            // may have, between the first try and the sweep.
            reserved = shared.slots.reserve_bytes(&claim, bytes);
            if recovered {
                // Bytes of holders that vanished were what filled the budget;
                // their slots came back with them: reported, and handed to
                // whoever is parked rather than left until the next release.
                shared.report_reclaimed();
            }
        }
        shared.observer.bytes(|| shared.slots.bytes_reserved());
        if reserved {
            Ok(Permit::with_share(shared.clone(), claim, bytes))
        } else {
            shared.give_back_unused(&claim);
            Err(shared.saturated(ShedReason::Bytes))
        }
    }

    /// Gives back a claim that never became a permit (its caller went away,
    /// or its bytes did not fit), and hands its slots on. It is not counted
    /// as admitted. If a reclaim or a reset freed its slots meanwhile, they
    /// were given back then, and this frees nothing.
    pub(crate) fn give_back_unused(&self, claim: &Claim) {
        if let Some(leases) = &self.leases {
            self.give_back_lease(leases, claim);
        }
        self.slots.release(claim);
        self.waiters.after_release(&self.slots, &self.clock);
        self.report_reclaimed();
    }

    pub(super) fn totals(&self) -> Totals {
        self.report_reclaimed();
        self.observer
            .totals(self.slots.admitted().load(Ordering::Relaxed))
    }

    pub(crate) fn observer(&self) -> &Observer {
        &self.observer
    }

    pub(crate) fn saturation(&self) -> Option<&SaturationSignal> {
        self.saturation.as_deref()
    }

    /// The wait budget of a caller about to park: `wait`, or CoDel's
    /// target while the line stands.
    pub(crate) fn wait_budget(&self, wait: Duration) -> Duration {
        match &self.codel {
            Some(codel) => codel.budget(wait, self.waiters.parked()),
            None => wait,
        }
    }

    /// A wait ended (`probe`: the saturation signal's probe): the signal
    /// counts it, and if the line is empty now, CoDel's interval restarts.
    pub(crate) fn wait_ended(&self, end: WaitEnd, probe: bool) {
        self.signal_wait_ended(end, probe);
        if let Some(codel) = &self.codel {
            codel.seen(self.waiters.parked());
        }
        if self.drain.is_draining() {
            self.wake_drains_if_done();
        }
    }

    /// The saturation signal counts a wait that ended (or, for a probe that
    /// never parked, a slot found or a refusal), and reports a change.
    pub(crate) fn signal_wait_ended(&self, end: WaitEnd, probe: bool) {
        if let Some(signal) = &self.saturation {
            if let Some(raised) = signal.wait_ended(end, probe) {
                self.observer.saturation_signal(raised);
            }
        }
    }

    /// Whether a caller arriving now would be admitted without waiting.
    pub(crate) fn has_room(&self) -> bool {
        self.waiters.parked() == 0 && self.slots.has_room(self.clock.now(), 1)
    }

    /// Whether `call` can take a slot itself, with no wait and no round
    /// trip: there is room, and no ceiling to ask.
    pub(crate) fn has_room_for_call(&self) -> bool {
        !self.has_ceiling() && self.has_room()
    }

    /// The error for a call shed now (and the record of it).
    pub(crate) fn saturated(&self, reason: ShedReason) -> ServiceSaturated {
        self.saturated_at(reason, self.clock.now())
    }

    /// [`saturated`](Self::saturated) at `now`, already read.
    #[cold]
    pub(crate) fn saturated_at(&self, reason: ShedReason, now: u64) -> ServiceSaturated {
        if self.observer.rollups.minute_turned(now - 1) {
            self.turn_minute(now, 0);
        }
        // A sweep that freed slots another caller took first.
        self.report_reclaimed();
        if reason.is_for_want_of_a_slot() {
            self.see_in_flight_when_refused();
        }
        ServiceSaturated::new(
            self.observer.rejected(reason),
            self.slots.limit(),
            reason,
            self.config.retry_after,
        )
    }

    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    /// A caller was refused a slot, or parked: the slots held then are a
    /// candidate for the minute's in-flight peak. Not always every slot:
    /// with weights, slots too few for a weight, or set aside for a
    /// weighted caller at the head of the line, stand free. They are
    /// counted only while the peak is below the limit: once it is the
    /// limit, nothing can raise it, so sheds under overload skip it.
    pub(crate) fn see_in_flight_when_refused(&self) {
        let rollups = &self.observer.rollups;
        if rollups.peak_below(self.slots.limit()) {
            rollups.see_in_flight(self.slots.in_flight());
        }
    }

    /// Puts `limit` in force, between 1 and the configured limit. Raised,
    /// the new room goes to the callers waiting first; lowered, no one is
    /// evicted, and no one is admitted until the calls in flight are under
    /// it.
    #[cfg(all(test, not(tower_inflight_loom)))]
    pub(crate) fn set_limit(&self, limit: usize) {
        self.slots.set_limit(limit);
        self.waiters.after_release(&self.slots, &self.clock);
    }

    /// Where a call admitted now starts, for its adaptive limit's sample;
    /// `None` without one.
    #[inline(always)]
    pub(crate) fn start_sample(&self) -> Option<Started> {
        self.adaptive.as_ref().map(|_| self.started_now())
    }

    #[cold]
    fn started_now(&self) -> Started {
        // `in_flight` is at most `MAX_SLOTS` (2^20): plus one, it is not 0
        // and leaves the top bit free.
        let in_flight = self.slots.in_flight() as u32 + 1;
        Started {
            // Truncated on purpose: latencies are differences, wrapping.
            at_micros: self.clock.precise_elapsed().as_micros() as u32,
            in_flight: std::num::NonZeroU32::new(in_flight).unwrap_or(std::num::NonZeroU32::MIN),
        }
    }

    /// The adaptive limit, if the configuration has one.
    pub(crate) fn adaptive(&self) -> Option<&AdaptiveLimit> {
        self.adaptive.as_deref()
    }

    /// A call that started at `started`, on `claim`, ended with `outcome`:
    /// a sample for the adaptive limit, unless it is to be ignored, or ran
    /// too long for its start, kept in 32 bits of microseconds (71 min), to
    /// tell its latency.
    pub(crate) fn record_outcome(&self, started: Started, claim: &Claim, outcome: Outcome) {
        let (Some(adaptive), false) = (&self.adaptive, outcome == Outcome::Ignore) else {
            return;
        };
        let held = self
            .clock
            .now()
            .saturating_sub(self.slots.claimed_at(claim));
        if self.clock.duration(held) >= MAX_SAMPLED {
            return;
        }
        let now = self.clock.precise_elapsed();
        let micros = (now.as_micros() as u32).wrapping_sub(started.at_micros);
        let sample = Sample::new(
            Duration::from_micros(u64::from(micros)),
            (started.in_flight.get() & !Started::IGNORED) as usize - 1,
            outcome == Outcome::Dropped,
            now,
        );
        let (moved, baseline) = adaptive.update(
            &sample,
            || self.slots.limit(),
            |to| self.slots.set_limit(to),
        );
        if let Some((from, to)) = moved {
            // Out of the algorithm's lock: a waker or a hook may record
            // another sample on this bulkhead.
            self.waiters.after_release(&self.slots, &self.clock);
            self.observer.limit_changed(from, to);
        }
        self.observer.baseline_latency(baseline);
    }

    pub(crate) fn waiters(&self) -> &Waiters {
        &self.waiters
    }

    pub(crate) fn slots(&self) -> &SlotTable {
        &self.slots
    }

    #[inline]
    pub(crate) fn now(&self) -> u64 {
        self.clock.now()
    }
}

/// Runs its step if dropped before it is disarmed: a step that must happen
/// even if a ceiling's code (a user's) panics before it.
struct OnUnwind<F: FnMut()> {
    step: F,
    armed: bool,
}

impl<F: FnMut()> OnUnwind<F> {
    fn new(step: F) -> Self {
        Self { step, armed: true }
    }

    fn disarm(mut self) {
        self.armed = false;
    }
}

impl<F: FnMut()> Drop for OnUnwind<F> {
    fn drop(&mut self) {
        if self.armed {
            (self.step)();
        }
    }
}

#[cfg(all(test, not(tower_inflight_loom)))]
mod tests {
    use crate::{Bulkhead, Config, ManualClock};
    use std::time::Duration;

    /// What a key of a keyed bulkhead allocates for its bulkhead of limit
    /// 4: its shared state behind an `Arc` (two counts beside it), one
    /// refusal lane and a ledger of two entries a slot. Its configuration
    /// is the keyed bulkhead's, it keeps no history of minutes, and the
    /// settings it does not have take a word each. (`tests/allocations.rs`
    /// counts what a plain bulkhead allocates; `tests/keyed_memory.rs`
    /// what a key does, everything included.)
    #[test]
    fn a_key_s_bulkhead_of_four_slots_keeps_at_most_half_a_kib() {
        use std::mem::size_of;
        let limit = 4;
        let bytes = 2 * size_of::<usize>()
            + size_of::<super::Shared>()
            + crate::observe::Refusals::heap_bytes(None, limit)
            + 2 * limit * size_of::<u64>();
        // With feature `metrics`, the handles of its series too (they
        // record nothing unless the key is one to report).
        let most = if cfg!(any(feature = "metrics", feature = "tracing")) {
            1024
        } else {
            512
        };
        assert!(bytes <= most, "{bytes} bytes");
    }

    /// Claims given back unused across a reset, whether or not a sweep
    /// reclaimed slots for them: the count comes out even.
    #[test]
    fn claims_given_back_across_a_reset_leave_the_count_even() {
        for leaked in [false, true] {
            let clock = ManualClock::new();
            let bulkhead =
                Bulkhead::new(Config::new(2, Duration::from_secs(1)).clock(clock.clone()));
            if leaked {
                let _other = bulkhead.try_acquire().unwrap();
                std::mem::forget(bulkhead.try_acquire().unwrap());
                clock.advance(Duration::from_secs(2));
            }
            let shared = bulkhead.shared();
            let claim = shared.try_claim_weighted(2, shared.now()).unwrap();
            assert_eq!(claim.reclaimed(), leaked);
            bulkhead.reset();
            shared.give_back_unused(&claim);
            assert_eq!(bulkhead.in_flight(), 0, "leaked: {leaked}");
            let _held = (
                bulkhead.try_acquire().unwrap(),
                bulkhead.try_acquire().unwrap(),
            );
            assert_eq!(bulkhead.in_flight(), 2, "leaked: {leaked}");
        }
    }

    /// A weighted claim swept past its deadline and given back unused
    /// after others took its slots: the count comes out even.
    #[test]
    fn a_claim_swept_and_given_back_late_leaves_the_count_even() {
        for takers in 0..=3usize {
            let clock = ManualClock::new();
            let bulkhead =
                Bulkhead::new(Config::new(3, Duration::from_secs(1)).clock(clock.clone()));
            let shared = bulkhead.shared();
            let claim = shared.try_claim_weighted(3, shared.now()).unwrap();
            clock.advance(Duration::from_secs(2));
            let held: Vec<_> = (0..takers)
                .map(|_| bulkhead.try_acquire().unwrap())
                .collect();
            shared.give_back_unused(&claim);
            assert_eq!(bulkhead.in_flight(), takers, "{takers} took");
            // Swept by the first taker, which found the table full.
            let swept = if takers > 0 { 3 } else { 0 };
            assert_eq!(bulkhead.status().totals.reclaimed, swept, "{takers} took");
            drop(held);
            assert_eq!(bulkhead.in_flight(), 0, "{takers} took");
        }
    }

    /// A lowered limit evicts no one and admits no one until the calls in
    /// flight are under it; `limit()` and a shed's error say the limit in
    /// force.
    #[test]
    fn a_lowered_limit_evicts_no_one() {
        let bulkhead = Bulkhead::new(Config::new(3, Duration::from_secs(30)));
        let (a, b) = (
            bulkhead.try_acquire().unwrap(),
            bulkhead.try_acquire().unwrap(),
        );
        bulkhead.shared().set_limit(1);
        assert_eq!((bulkhead.limit(), bulkhead.in_flight()), (1, 2));
        assert_eq!((bulkhead.available(), bulkhead.status().available), (0, 0));
        assert_eq!(bulkhead.try_acquire().unwrap_err().limit(), 1);
        drop(a);
        assert!(bulkhead.try_acquire().is_err(), "one held of one");
        drop(b);
        let _c = bulkhead.try_acquire().unwrap();
        bulkhead.shared().set_limit(0);
        assert_eq!(bulkhead.limit(), 1, "never below one");
        bulkhead.shared().set_limit(usize::MAX);
        assert_eq!(bulkhead.limit(), 3, "never over the configured limit");
    }

    /// A raised limit hands its new room to the callers waiting, oldest
    /// first, before any newcomer.
    #[tokio::test]
    async fn a_raised_limit_hands_its_room_to_the_callers_waiting() {
        let bulkhead =
            Bulkhead::new(Config::new(3, Duration::from_secs(30)).wait(Duration::from_secs(10)));
        bulkhead.shared().set_limit(1);
        let _held = bulkhead.try_acquire().unwrap();
        let (first, second) = (bulkhead.clone(), bulkhead.clone());
        let mut first = tokio_test::task::spawn(async move { first.acquire().await });
        let mut second = tokio_test::task::spawn(async move { second.acquire().await });
        assert!(first.poll().is_pending() && second.poll().is_pending());
        bulkhead.shared().set_limit(2);
        assert!(first.is_woken());
        let std::task::Poll::Ready(Ok(_first)) = first.poll() else {
            panic!("the oldest caller waiting was not handed the new room")
        };
        assert!(second.poll().is_pending());
        assert!(
            bulkhead.try_acquire().is_err(),
            "no newcomer ahead of the line"
        );
        bulkhead.shared().set_limit(3);
        assert!(matches!(second.poll(), std::task::Poll::Ready(Ok(_))));
    }

    /// The in-flight gauge follows a claim reclaimed from under its holder.
    #[cfg(feature = "metrics")]
    #[test]
    fn the_gauge_follows_a_claim_lost_to_a_reclaimer() {
        use metrics_util::debugging::{DebugValue, DebuggingRecorder};
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let clock = ManualClock::new();
        let bulkhead = metrics::with_local_recorder(&recorder, || {
            Bulkhead::new(Config::new(2, Duration::from_secs(1)).clock(clock.clone()))
        });
        let shared = bulkhead.shared();
        let claim = shared.try_claim_weighted(2, shared.now()).unwrap();
        clock.advance(Duration::from_secs(2));
        let taker = bulkhead.try_acquire().unwrap();
        shared.give_back_unused(&claim);
        let gauge = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .find_map(|(key, _, _, value)| {
                (key.key().name() == "tower_inflight_in_flight").then_some(value)
            });
        let Some(DebugValue::Gauge(gauge)) = gauge else {
            panic!("no in-flight gauge")
        };
        assert_eq!((gauge.into_inner(), bulkhead.in_flight()), (1.0, 1));
        drop(taker);
    }
}
