//! Random sequences of operations on one bulkhead, checked after every step
//! against a reference model of its slot engine: one admission count (the
//! weights of the live claims), the live claims themselves (weight,
//! deadline, bytes recorded on the claim), and the byte budget. The model
//! knows no positions: which ledger entry a claim writes is
//! the engine's business.
//!
//! - A claim of weight `w` is admitted iff `count + w <= limit`. If it does
//!   not fit and some claim is past its deadline, a sweep frees every claim
//!   past its deadline (their weights and recorded bytes), and the claim is
//!   tried once more.
//! - The slots a sweep frees are reclaimed slots until claims take them up:
//!   each claim takes up to its weight of them, and its permit
//!   `was_reclaimed()` iff it took any. A release adds none; a reset
//!   forgets them.
//! - Bytes are reserved if they fit; if not, the same sweep runs and they
//!   are tried once more; if they still do not fit, the slot goes back and
//!   the call is shed for its bytes.
//! - A release frees a claim (and its recorded bytes) only while the claim
//!   is live: a late release after a sweep or a reset frees nothing.
//! - A reset frees every live claim with its recorded bytes; bytes split
//!   off into a reservation come back when it is dropped, reset or not.
//!   Claims made after a reset are dated a tick (a microsecond) after it at
//!   the earliest, so that their words never repeat one from before it.
//!
//! `reclaim_after` is timed with a `ManualClock` in whole microseconds, so the
//! model's deadlines are exact: a claim made at `t` may be swept from
//! `t + hold` on, not a microsecond before.

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::FileFailurePersistence;
use std::collections::BTreeMap;
use std::time::Duration;
use tower_inflight::{
    Bulkhead, ByteReservation, Config, ManualClock, Permit, ServiceSaturated, ShedReason,
};

/// `reclaim_after`, in microseconds.
const HOLD_US: u64 = 100_000;
const MAX_BYTES: u64 = 1_000;

#[derive(Clone, Debug)]
enum Op {
    TryAcquire,
    TryAcquireBytes(u64),
    /// `try_acquire_weighted`, with weights from 0 to one over the largest limit.
    TryAcquireWeighted(usize),
    /// Drops a held permit (any of them: it may have been reclaimed or reset).
    Release(Index),
    /// `mem::forget`s a held permit.
    Forget(Index),
    /// Splits a held permit's bytes into a reservation of their own.
    SplitBytes(Index),
    DropReservation(Index),
    /// Moves the manual clock on, in microseconds.
    Advance(u64),
    Reset,
    /// `try_acquire` until shed (for the large tables).
    Fill,
    /// Drops every other held permit, from the one at `Index` on.
    ReleaseHalf(Index),
}

/// The operations on a large table: fills and mass releases besides the
/// others, so that a table of thousands of slots goes full and empty.
fn large_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => op(),
        1 => Just(Op::Fill),
        1 => any::<Index>().prop_map(Op::ReleaseHalf),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => Just(Op::TryAcquire),
        5 => (0..=700u64).prop_map(Op::TryAcquireBytes),
        3 => (0..=5usize).prop_map(Op::TryAcquireWeighted),
        5 => any::<Index>().prop_map(Op::Release),
        2 => any::<Index>().prop_map(Op::Forget),
        2 => any::<Index>().prop_map(Op::SplitBytes),
        2 => any::<Index>().prop_map(Op::DropReservation),
        3 => (0..=40_000u64).prop_map(Op::Advance),
        1 => Just(Op::Advance(HOLD_US - 1)),
        1 => Just(Op::Advance(1)),
        1 => Just(Op::Advance(HOLD_US)),
        1 => Just(Op::Reset),
    ]
}

/// A live claim, as the model sees it: admitted, and neither released,
/// swept nor reset. A claim past its deadline stays live (and counted)
/// until a sweep frees it.
#[derive(Clone, Copy, Debug)]
struct Claim {
    weight: usize,
    /// The clock reading (microseconds) from which a sweep frees it.
    deadline: u64,
    /// The bytes recorded on the claim: its permit's, until split off or
    /// released.
    recorded: u64,
}

/// A permit the test still holds, with what the model expects of it.
#[derive(Debug)]
struct Held {
    permit: Permit,
    id: u64,
    weight: usize,
    /// `permit.bytes()`: what it reserved, until split off.
    bytes: u64,
}

#[derive(Debug)]
struct Reserved {
    reservation: ByteReservation,
    bytes: u64,
}

struct Model {
    limit: usize,
    now: u64,
    /// The live claims by id: in the order they were made, which is the
    /// order of their deadlines, since the clock only moves on.
    claims: BTreeMap<u64, Claim>,
    /// The admission count: the weights of the live claims, past their
    /// deadline or not.
    count: usize,
    reserved: u64,
    /// The earliest time a claim is dated from: a tick after the last reset.
    floor: u64,
    next_id: u64,
    /// The weight of the permits forgotten.
    forgotten: usize,
    /// Permits made, ever (`totals.admitted`).
    admitted: u64,
    /// Slots freed by sweeps, ever (`totals.reclaimed`).
    reclaimed: u64,
    /// Slots freed by sweeps that no claim has taken since: the next
    /// claims to take them learn they were reclaimed.
    unclaimed: usize,
    /// Calls shed: for want of a slot, for their bytes, for their weight.
    shed_limit: u64,
    shed_bytes: u64,
    shed_weight: u64,
}

/// What the model expects of an acquire.
#[derive(Debug, PartialEq, Eq)]
enum Admission {
    Admitted {
        id: u64,
        reclaimed: bool,
        bytes: u64,
    },
    Shed(ShedReason),
}

impl Model {
    fn new(limit: usize) -> Self {
        Self {
            limit,
            now: 0,
            claims: BTreeMap::new(),
            count: 0,
            reserved: 0,
            floor: 0,
            next_id: 0,
            forgotten: 0,
            admitted: 0,
            reclaimed: 0,
            unclaimed: 0,
            shed_limit: 0,
            shed_bytes: 0,
            shed_weight: 0,
        }
    }

    fn count(&self) -> usize {
        self.count
    }

    /// Whether some claim is past its deadline: the earliest made is.
    fn any_expired(&self) -> bool {
        self.claims
            .first_key_value()
            .is_some_and(|(_, claim)| claim.deadline <= self.now)
    }

    /// Whether the claim `id` is still live: neither released, swept nor
    /// reset.
    fn holds(&self, id: u64) -> bool {
        self.claims.contains_key(&id)
    }

    /// Takes the claim `id` off, with its recorded bytes, if it is live;
    /// returns it.
    fn free(&mut self, id: u64) -> Option<Claim> {
        let claim = self.claims.remove(&id)?;
        self.count -= claim.weight;
        self.take_off_budget(claim.recorded);
        Some(claim)
    }

    /// Frees every claim past its deadline, with its recorded bytes;
    /// returns the slots freed.
    fn sweep(&mut self) -> usize {
        let mut slots = 0;
        while let Some((&id, _)) = self
            .claims
            .first_key_value()
            .filter(|(_, claim)| claim.deadline <= self.now)
        {
            slots += self.free(id).map_or(0, |claim| claim.weight);
        }
        self.reclaimed += slots as u64;
        self.unclaimed += slots;
        slots
    }

    fn take_off_budget(&mut self, bytes: u64) {
        self.reserved = self
            .reserved
            .checked_sub(bytes)
            .expect("model: more bytes given back than reserved");
    }

    fn shed(&mut self, reason: ShedReason) -> Admission {
        match reason {
            ShedReason::LimitReached => self.shed_limit += 1,
            ShedReason::Bytes => self.shed_bytes += 1,
            ShedReason::InvalidWeight => self.shed_weight += 1,
            _ => unreachable!("model: no other reason"),
        }
        Admission::Shed(reason)
    }

    /// A claim of `weight` slots, then `bytes` of the budget.
    fn acquire(&mut self, weight: usize, bytes: u64) -> Admission {
        if weight == 0 || weight > self.limit {
            return self.shed(ShedReason::InvalidWeight);
        }
        if self.count() + weight > self.limit {
            // Full: a sweep, if any claim expired, then once more.
            if self.any_expired() {
                self.sweep();
            }
            if self.count() + weight > self.limit {
                return self.shed(ShedReason::LimitReached);
            }
        }
        // Taken up even by a claim that goes on to be shed for its bytes.
        let taken = self.unclaimed.min(weight);
        self.unclaimed -= taken;
        let reclaimed = taken > 0;
        let id = self.next_id;
        self.next_id += 1;
        self.count += weight;
        self.claims.insert(
            id,
            Claim {
                weight,
                deadline: self.now.max(self.floor) + HOLD_US,
                recorded: 0,
            },
        );
        if bytes != 0 {
            if self.reserved + bytes > MAX_BYTES && self.any_expired() {
                // Frees expired claims, slots and bytes, full or not. The
                // new claim is not among them: its deadline is to come.
                self.sweep();
            }
            if self.reserved + bytes > MAX_BYTES {
                // The slot goes back at once.
                self.free(id);
                return self.shed(ShedReason::Bytes);
            }
            self.reserved += bytes;
            let claim = self.claims.get_mut(&id);
            claim.expect("model: the new claim was swept").recorded = bytes;
        }
        self.admitted += 1;
        Admission::Admitted {
            id,
            reclaimed,
            bytes,
        }
    }

    /// The live claim `id` takes its recorded bytes off: the bytes if it is
    /// still live, 0 if a sweep or reset gave them back already.
    fn take_bytes(&mut self, id: u64) -> u64 {
        self.claims
            .get_mut(&id)
            .map_or(0, |claim| std::mem::take(&mut claim.recorded))
    }

    fn release(&mut self, held: &Held) {
        let bytes = self.take_bytes(held.id);
        self.take_off_budget(bytes);
        self.free(held.id);
    }

    fn reset(&mut self) {
        let recorded: u64 = self.claims.values().map(|claim| claim.recorded).sum();
        self.take_off_budget(recorded);
        self.claims.clear();
        self.count = 0;
        self.unclaimed = 0;
        self.floor = self.now + 1;
    }
}

struct Harness {
    bulkhead: Bulkhead,
    clock: ManualClock,
    model: Model,
    held: Vec<Held>,
    reservations: Vec<Reserved>,
}

impl Harness {
    fn new(limit: usize) -> Self {
        let clock = ManualClock::new();
        let bulkhead = Bulkhead::new(
            Config::new(limit, Duration::from_micros(HOLD_US))
                .max_bytes(MAX_BYTES)
                .clock(clock.clone()),
        );
        Self {
            bulkhead,
            clock,
            model: Model::new(limit),
            held: Vec::new(),
            reservations: Vec::new(),
        }
    }

    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match *op {
            Op::TryAcquire => {
                let actual = self.bulkhead.try_acquire();
                let expected = self.model.acquire(1, 0);
                self.check_admission(actual, expected, 1)?;
            }
            Op::TryAcquireBytes(bytes) => {
                let actual = self.bulkhead.try_acquire_bytes(bytes);
                let expected = self.model.acquire(1, bytes);
                self.check_admission(actual, expected, 1)?;
            }
            Op::TryAcquireWeighted(weight) => {
                let actual = self.bulkhead.try_acquire_weighted(weight);
                let expected = self.model.acquire(weight, 0);
                self.check_admission(actual, expected, weight)?;
            }
            Op::Release(index) => {
                if !self.held.is_empty() {
                    self.release_at(index.index(self.held.len()))?;
                }
            }
            Op::Forget(index) => {
                if self.held.is_empty() {
                    return Ok(());
                }
                let Held { permit, weight, .. } = self.held.remove(index.index(self.held.len()));
                std::mem::forget(permit);
                self.model.forgotten += weight;
            }
            Op::SplitBytes(index) => {
                if self.held.is_empty() {
                    return Ok(());
                }
                let i = index.index(self.held.len());
                let moved = self.model.take_bytes(self.held[i].id);
                self.held[i].bytes = 0;
                let reservation = self.held[i].permit.split_bytes();
                prop_assert_eq!(reservation.bytes(), moved, "bytes moved by split_bytes");
                prop_assert_eq!(self.held[i].permit.bytes(), 0, "bytes left on the permit");
                self.reservations.push(Reserved {
                    reservation,
                    bytes: moved,
                });
            }
            Op::DropReservation(index) => {
                if !self.reservations.is_empty() {
                    self.drop_reservation_at(index.index(self.reservations.len()));
                }
            }
            Op::Advance(micros) => {
                self.clock.advance(Duration::from_micros(micros));
                self.model.now += micros;
            }
            Op::Reset => {
                self.bulkhead.reset();
                self.model.reset();
            }
            Op::Fill => loop {
                let actual = self.bulkhead.try_acquire();
                let shed = actual.is_err();
                let expected = self.model.acquire(1, 0);
                self.check_admission(actual, expected, 1)?;
                if shed {
                    break;
                }
            },
            Op::ReleaseHalf(index) => {
                let mut at = index.index(self.held.len().max(1));
                while at < self.held.len() {
                    self.release_at(at)?;
                    at += 1;
                }
            }
        }
        self.check()
    }

    fn release_at(&mut self, i: usize) -> Result<(), TestCaseError> {
        let held = self.held.remove(i);
        let superseded = !self.model.holds(held.id);
        let before = (self.bulkhead.in_flight(), self.bulkhead.bytes_reserved());
        self.model.release(&held);
        drop(held.permit);
        if superseded {
            prop_assert_eq!(
                (self.bulkhead.in_flight(), self.bulkhead.bytes_reserved()),
                before,
                "a permit whose claim was reclaimed or reset changed the counts on release"
            );
        }
        Ok(())
    }

    fn drop_reservation_at(&mut self, i: usize) {
        let reserved = self.reservations.remove(i);
        self.model.take_off_budget(reserved.bytes);
        drop(reserved.reservation);
    }

    fn check_admission(
        &mut self,
        actual: Result<Permit, ServiceSaturated>,
        expected: Admission,
        weight: usize,
    ) -> Result<(), TestCaseError> {
        match (actual, expected) {
            (
                Ok(permit),
                Admission::Admitted {
                    id,
                    reclaimed,
                    bytes,
                },
            ) => {
                prop_assert_eq!(permit.was_reclaimed(), reclaimed, "was_reclaimed()");
                prop_assert_eq!(permit.bytes(), bytes, "permit.bytes()");
                self.held.push(Held {
                    permit,
                    id,
                    weight,
                    bytes,
                });
            }
            (Err(shed), Admission::Shed(reason)) => {
                prop_assert_eq!(shed.reason(), reason, "shed reason");
            }
            (Ok(permit), expected) => {
                prop_assert!(
                    false,
                    "admitted ({permit:?}, reclaimed: {}) where the model expected {expected:?}",
                    permit.was_reclaimed()
                );
            }
            (Err(shed), expected) => {
                prop_assert!(
                    false,
                    "shed ({:?}) where the model expected {expected:?}",
                    shed.reason()
                );
            }
        }
        Ok(())
    }

    /// What must hold after every operation: the counts, the books, the
    /// totals. (Each step of a large table's settling checks the counts
    /// alone: the rest costs time in proportion to the table.)
    fn check(&self) -> Result<(), TestCaseError> {
        self.check_counts()?;
        self.check_books()?;
        self.check_totals()
    }

    /// The totals of `status()`.
    fn check_totals(&self) -> Result<(), TestCaseError> {
        let model = &self.model;
        let status = self.bulkhead.status();
        prop_assert_eq!(status.in_flight, model.count(), "status().in_flight");
        let totals = &status.totals;
        prop_assert_eq!(totals.admitted, model.admitted, "totals.admitted");
        prop_assert_eq!(totals.reclaimed, model.reclaimed, "totals.reclaimed");
        prop_assert_eq!(totals.rejected_limit, model.shed_limit, "rejected_limit");
        prop_assert_eq!(totals.rejected_bytes, model.shed_bytes, "rejected_bytes");
        prop_assert_eq!(
            totals.rejected_invalid_weight,
            model.shed_weight,
            "rejected_invalid_weight"
        );
        Ok(())
    }

    /// The counts and the bytes reserved.
    fn check_counts(&self) -> Result<(), TestCaseError> {
        let model = &self.model;
        let count = model.count();
        prop_assert!(count <= model.limit, "model: over the limit");
        prop_assert_eq!(self.bulkhead.limit(), model.limit, "limit()");
        prop_assert_eq!(self.bulkhead.in_flight(), count, "in_flight()");
        prop_assert_eq!(
            self.bulkhead.available(),
            model.limit - count,
            "available()"
        );
        // A claim past its deadline counts as free: a call would sweep it.
        prop_assert_eq!(
            self.bulkhead.is_saturated(),
            count == model.limit && !model.any_expired(),
            "is_saturated()"
        );
        prop_assert_eq!(
            self.bulkhead.bytes_reserved(),
            model.reserved,
            "bytes_reserved()"
        );
        prop_assert!(self.bulkhead.bytes_reserved() <= MAX_BYTES);
        prop_assert_eq!(self.bulkhead.waiting(), 0);
        Ok(())
    }

    /// The model's own books, and the bytes of every permit and
    /// reservation held.
    fn check_books(&self) -> Result<(), TestCaseError> {
        let model = &self.model;
        let count = model.count();
        // The model's own books: the budget is the bytes recorded on live
        // claims and those split off.
        prop_assert!(model.unclaimed <= model.limit - count, "model: unclaimed");
        let weights: usize = model.claims.values().map(|claim| claim.weight).sum();
        prop_assert_eq!(count, weights, "model: the count's books");
        let recorded: u64 = model.claims.values().map(|claim| claim.recorded).sum();
        let split: u64 = self
            .reservations
            .iter()
            .map(|reserved| reserved.bytes)
            .sum();
        prop_assert_eq!(
            model.reserved,
            recorded + split,
            "model: the budget's books"
        );
        // Every live claim is a held permit's or a forgotten one's.
        let held_live: usize = self
            .held
            .iter()
            .filter(|held| model.holds(held.id))
            .map(|held| held.weight)
            .sum();
        prop_assert!(held_live <= count && count - held_live <= model.forgotten);

        for held in &self.held {
            prop_assert_eq!(
                held.permit.bytes(),
                held.bytes,
                "bytes of {:?}",
                held.permit
            );
        }
        for reserved in &self.reservations {
            prop_assert_eq!(reserved.reservation.bytes(), reserved.bytes);
        }
        Ok(())
    }

    /// Releases everything still held, lets every forgotten claim expire,
    /// then takes every slot: the claim that finds the count full sweeps
    /// every forgotten (and unreset) claim at once, with its bytes, and
    /// afterwards nothing is held.
    fn settle(mut self) -> Result<(), TestCaseError> {
        while !self.held.is_empty() {
            self.release_at(0)?;
            self.check_counts()?;
        }
        while !self.reservations.is_empty() {
            self.drop_reservation_at(0);
            self.check_counts()?;
        }
        // A tick more than the hold: a claim made as a reset ran is dated a
        // tick after it.
        self.apply(&Op::Advance(HOLD_US + 1))?;
        let abandoned = self.model.count();
        prop_assert_eq!(
            self.bulkhead.in_flight(),
            abandoned,
            "leaked slots count until they are reclaimed"
        );
        prop_assert!(
            !self.bulkhead.is_saturated(),
            "a slot outlived reclaim_after"
        );
        prop_assert!(abandoned <= self.model.forgotten);
        let reclaimed_before = self.bulkhead.status().totals.reclaimed;
        let unclaimed = self.model.unclaimed;
        for _ in 0..self.model.limit {
            let admitted = self.held.len();
            let actual = self.bulkhead.try_acquire();
            let expected = self.model.acquire(1, 0);
            self.check_admission(actual, expected, 1)?;
            self.check_counts()?;
            prop_assert_eq!(self.held.len(), admitted + 1, "a slot was not free");
        }
        self.check_totals()?;
        // The slots reclaimed earlier and not taken since, then, once the
        // count is full, every forgotten claim's.
        let reclaimers = self.held.iter().filter(|held| held.permit.was_reclaimed());
        prop_assert_eq!(
            reclaimers.count(),
            unclaimed + abandoned,
            "permits on reclaimed slots"
        );
        prop_assert_eq!(
            self.bulkhead.status().totals.reclaimed - reclaimed_before,
            abandoned as u64,
            "slots reclaimed from forgotten permits"
        );
        prop_assert_eq!(
            self.bulkhead.bytes_reserved(),
            0,
            "bytes left once every slot was retaken"
        );
        let actual = self.bulkhead.try_acquire();
        prop_assert!(actual.is_err(), "admitted over the limit");
        let expected = self.model.acquire(1, 0);
        self.check_admission(actual, expected, 1)?;
        while !self.held.is_empty() {
            self.release_at(0)?;
        }
        self.check()?;
        prop_assert_eq!(self.bulkhead.in_flight(), 0);
        prop_assert_eq!(self.bulkhead.available(), self.model.limit);
        prop_assert_eq!(self.bulkhead.bytes_reserved(), 0);
        Ok(())
    }
}

/// Failing seeds are written to `tests/proptest-regressions/` (one file per
/// property) and replayed first on every run: commit them.
fn config(cases: u32, regressions: &'static str) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(regressions))),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config(256, concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/proptest-regressions/proptest_model.txt"
    )))]

    #[test]
    fn bulkhead_matches_the_model_after_every_operation(
        limit in 1..=4usize,
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let mut harness = Harness::new(limit);
        for op in &ops {
            harness.apply(op)?;
        }
        harness.settle()?;
    }
}

proptest! {
    #![proptest_config(config(64, concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/proptest-regressions/proptest_model_bytes_expire.txt"
    )))]

    /// Promise 5, for bytes: once every permit has been dropped or has
    /// outlived `reclaim_after`, the whole byte budget can be had again.
    #[test]
    fn whole_byte_budget_is_available_once_every_holder_is_released_or_expired(
        limit in 1..=4usize,
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let mut harness = Harness::new(limit);
        for op in &ops {
            harness.apply(op)?;
        }
        while !harness.held.is_empty() {
            harness.release_at(0)?;
        }
        while !harness.reservations.is_empty() {
            harness.drop_reservation_at(0);
        }
        // A tick more than the hold: a claim made as a reset ran is dated a
        // tick after it.
        harness.clock.advance(Duration::from_micros(HOLD_US + 1));
        prop_assert!(!harness.bulkhead.is_saturated());
        let reserved = harness.bulkhead.bytes_reserved();
        let whole = harness.bulkhead.try_acquire_bytes(MAX_BYTES);
        prop_assert!(
            whole.is_ok(),
            "every holder is gone or expired, yet {} bytes are held: {:?}",
            reserved,
            whole.map(drop)
        );
        drop(whole);
        prop_assert_eq!(harness.bulkhead.bytes_reserved(), 0);
    }
}

proptest! {
    #![proptest_config(config(24, concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/proptest-regressions/proptest_model_large.txt"
    )))]

    /// The same model at large limits (a ledger of thousands of entries),
    /// with fills and mass releases.
    #[test]
    fn a_large_bulkhead_matches_the_model_after_every_operation(
        limit in prop::sample::select(vec![65usize, 1025, 4097]),
        ops in prop::collection::vec(large_op(), 1..40),
    ) {
        let mut harness = Harness::new(limit);
        for op in &ops {
            harness.apply(op)?;
        }
        harness.settle()?;
    }
}

/// Forgotten bytes come back even while a slot is free: a claim that fits
/// under the limit never sweeps, so it is the bytes that must. A forgotten
/// permit's bytes, past `reclaim_after`, would otherwise be held until the
/// count went full, and every call that needs them would be shed with
/// `ShedReason::Bytes` while a slot stood free. (Under the old engine, a
/// single-threaded caller kept landing on the released slot in front of the
/// expired one and never reclaimed it.)
#[test]
fn forgotten_bytes_come_back_even_when_another_slot_is_free() {
    let clock = ManualClock::new();
    let reclaim = Duration::from_secs(30);
    let bulkhead = Bulkhead::new(
        Config::new(2, reclaim)
            .max_bytes(MAX_BYTES)
            .clock(clock.clone()),
    );
    let first = bulkhead.try_acquire().unwrap();
    std::mem::forget(bulkhead.try_acquire_bytes(800).unwrap());
    drop(first);
    clock.advance(reclaim * 10);
    assert!(!bulkhead.is_saturated(), "the forgotten slot has expired");
    assert_eq!(bulkhead.in_flight(), 1, "and counts until it is reclaimed");

    let mut shed = 0;
    for _ in 0..100 {
        match bulkhead.try_acquire_bytes(800) {
            Ok(permit) => drop(permit),
            Err(error) => {
                assert_eq!(error.reason(), ShedReason::Bytes);
                shed += 1;
            }
        }
    }
    assert_eq!(
        (shed, bulkhead.bytes_reserved()),
        (0, 0),
        "shed for bytes held by a permit forgotten {:?} ago, with every slot free",
        clock.elapsed()
    );
}
