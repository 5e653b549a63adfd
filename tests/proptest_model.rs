//! Random sequences of operations on one bulkhead, checked after every step
//! against a reference model: a table of slots, each with its holder, the
//! holder's deadline and the bytes it recorded, plus the byte budget and its
//! epoch.
//!
//! The model knows nothing of generations, words or start indices. It scans
//! its slots in a fixed order from position 0; the bulkhead scans from a
//! per-thread start index, which is fixed on the one thread that runs every
//! case, so the two take the same slot as long as position `p` of the model
//! stands for slot `start + p`.
//!
//! `reclaim_after` is timed with a `ManualClock` in whole microseconds, so the
//! model's deadlines are exact: a slot taken at `t` is free at `t + hold`, not
//! a microsecond before.

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::FileFailurePersistence;
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

/// A holder of a slot, as the model sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Holder {
    id: u64,
    /// The clock reading (microseconds) from which the slot counts as free.
    deadline: u64,
}

#[derive(Clone, Debug, Default)]
struct Slot {
    /// `None` once released or reset. An expired holder stays until a new
    /// claim reclaims the slot: its slot counts as free meanwhile.
    holder: Option<Holder>,
    /// The bytes a holder recorded on the slot: `(holder id, bytes)`.
    record: Option<(u64, u64)>,
}

/// A permit the test still holds, with what the model expects of it.
#[derive(Debug)]
struct Held {
    permit: Permit,
    id: u64,
    position: usize,
    /// The other slots of a weighted permit.
    companions: Vec<usize>,
    bytes: u64,
    epoch: Option<u64>,
}

#[derive(Debug)]
struct Reserved {
    reservation: ByteReservation,
    bytes: u64,
    epoch: Option<u64>,
}

struct Model {
    limit: usize,
    now: u64,
    slots: Vec<Slot>,
    reserved: u64,
    epoch: u64,
    next_id: u64,
    forgotten: usize,
}

/// What the model expects of an acquire.
#[derive(Debug, PartialEq, Eq)]
enum Admission {
    Admitted {
        id: u64,
        position: usize,
        companions: Vec<usize>,
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
            slots: vec![Slot::default(); limit],
            reserved: 0,
            epoch: 0,
            next_id: 0,
            forgotten: 0,
        }
    }

    fn is_live(&self, slot: &Slot) -> bool {
        slot.holder.is_some_and(|holder| holder.deadline > self.now)
    }

    fn live(&self) -> usize {
        self.slots.iter().filter(|slot| self.is_live(slot)).count()
    }

    /// Whether `id` still holds the slot at `position` (expired or not):
    /// neither reclaimed by a newer holder nor cleared by a reset.
    fn still_holds(&self, id: u64, position: usize) -> bool {
        self.slots[position].holder.is_some_and(|h| h.id == id)
    }

    /// Slots held, expired or not: a leaked slot counts until it is
    /// reclaimed.
    fn held(&self) -> usize {
        self.slots
            .iter()
            .filter(|slot| slot.holder.is_some())
            .count()
    }

    /// The slot to take: the one the bulkhead chose, if the model agrees it
    /// was free (the bulkhead may pick any free slot). For a call it shed
    /// for its bytes, whose claim was given back: an expired one if the
    /// bulkhead counted a reclaim, else a released one. Else the first free.
    fn choose(&self, chosen: Option<usize>, reclaimed: bool) -> Option<usize> {
        let free = |position: &usize| !self.is_live(&self.slots[*position]);
        chosen
            .filter(|position| *position < self.limit && free(position))
            .or_else(|| {
                (0..self.limit)
                    .filter(free)
                    .find(|&position| self.slots[position].holder.is_some() == reclaimed)
            })
            .or_else(|| (0..self.limit).find(free))
    }

    fn acquire(&mut self, bytes: u64, chosen: Option<usize>, reclaimed: bool) -> Admission {
        let Some(position) = self.choose(chosen, reclaimed) else {
            return Admission::Shed(ShedReason::LimitReached);
        };
        let id = self.next_id;
        self.next_id += 1;
        let slot = &mut self.slots[position];
        // A slot still marked with a holder is one whose deadline passed
        // without a release: it is reclaimed, and so are the bytes recorded
        // on it.
        let reclaimed = slot.holder.is_some();
        if reclaimed {
            if let Some((_, abandoned)) = slot.record.take() {
                self.reserved = self.reserved.saturating_sub(abandoned);
            }
        }
        assert_eq!(slot.record, None, "model: a free slot with a byte record");
        slot.holder = Some(Holder {
            id,
            deadline: self.now + HOLD_US,
        });
        if bytes == 0 {
            return Admission::Admitted {
                id,
                position,
                companions: Vec::new(),
                reclaimed,
                bytes: 0,
            };
        }
        if self.reserved + bytes > MAX_BYTES {
            // Before shedding, every expired holder that still records bytes
            // loses its bytes, wherever its slot is. Its slot stays as it
            // is: free, and reclaimed by the claim that next takes it.
            let now = self.now;
            for slot in &mut self.slots {
                let expired = slot.holder.is_some_and(|holder| holder.deadline <= now);
                if expired && slot.record.is_some_and(|(_, bytes)| bytes > 0) {
                    let (_, abandoned) = slot.record.take().unwrap_or_default();
                    self.reserved = self.reserved.saturating_sub(abandoned);
                }
            }
        }
        if self.reserved + bytes > MAX_BYTES {
            // The slot goes back at once.
            self.slots[position].holder = None;
            return Admission::Shed(ShedReason::Bytes);
        }
        self.reserved += bytes;
        self.slots[position].record = Some((id, bytes));
        Admission::Admitted {
            id,
            position,
            companions: Vec::new(),
            reclaimed,
            bytes,
        }
    }

    /// A weighted acquire takes `weight` free slots (the first stands for
    /// the permit) or none: those the bulkhead chose, if the model agrees
    /// they were free, else the first free ones.
    fn acquire_weighted(&mut self, weight: usize, chosen: &[usize]) -> Admission {
        if weight == 0 || weight > self.limit {
            return Admission::Shed(ShedReason::InvalidWeight);
        }
        if weight == 1 {
            return self.acquire(0, chosen.first().copied(), false);
        }
        let all_free: Vec<usize> = (0..self.limit)
            .filter(|&position| !self.is_live(&self.slots[position]))
            .collect();
        if all_free.len() < weight {
            return Admission::Shed(ShedReason::LimitReached);
        }
        let mut distinct = chosen.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        let free: Vec<usize> = if chosen.len() == weight
            && distinct.len() == weight
            && chosen.iter().all(|position| all_free.contains(position))
        {
            // The companions first, the slot that stands for the permit last.
            chosen[1..].iter().chain(&chosen[..1]).copied().collect()
        } else {
            all_free
        };
        let id = self.next_id;
        self.next_id += 1;
        let mut reclaimed = false;
        for &position in &free[..weight] {
            let slot = &mut self.slots[position];
            if slot.holder.is_some() {
                reclaimed = true;
                if let Some((_, abandoned)) = slot.record.take() {
                    self.reserved = self.reserved.saturating_sub(abandoned);
                }
            }
            slot.holder = Some(Holder {
                id,
                deadline: self.now + HOLD_US,
            });
        }
        Admission::Admitted {
            id,
            position: free[weight - 1],
            companions: free[..weight - 1].to_vec(),
            reclaimed,
            bytes: 0,
        }
    }

    /// The permit's holder takes its bytes off its slot's record: the bytes
    /// if they were still there, 0 if a reclaim or reset gave them back.
    fn take_bytes(&mut self, id: u64, position: usize, bytes: u64) -> u64 {
        let slot = &mut self.slots[position];
        if bytes != 0 && slot.record == Some((id, bytes)) {
            slot.record = None;
            bytes
        } else {
            0
        }
    }

    fn give_back(&mut self, bytes: u64, epoch: Option<u64>) {
        if bytes != 0 && epoch == Some(self.epoch) {
            self.reserved = self.reserved.saturating_sub(bytes);
        }
    }

    fn release(&mut self, held: &Held) {
        if held.bytes != 0 {
            let bytes = self.take_bytes(held.id, held.position, held.bytes);
            self.give_back(bytes, held.epoch);
        }
        for &position in held.companions.iter().chain([&held.position]) {
            if self.still_holds(held.id, position) {
                self.slots[position].holder = None;
            }
        }
    }

    fn reset(&mut self) {
        for slot in &mut self.slots {
            *slot = Slot::default();
        }
        self.reserved = 0;
        self.epoch += 1;
    }
}

/// The slots an admitted permit holds, its own first.
fn chosen(actual: &Result<Permit, ServiceSaturated>) -> Vec<usize> {
    actual
        .as_ref()
        .map(Permit::slot_indices)
        .unwrap_or_default()
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
                let expected = self
                    .model
                    .acquire(0, chosen(&actual).first().copied(), false);
                self.check_admission(actual, expected)?;
            }
            Op::TryAcquireBytes(bytes) => {
                let reclaimed_before = self.bulkhead.status().totals.reclaimed;
                let actual = self.bulkhead.try_acquire_bytes(bytes);
                let reclaimed = self.bulkhead.status().totals.reclaimed > reclaimed_before;
                let chosen = chosen(&actual).first().copied().or_else(|| {
                    // Shed for its bytes after reclaiming a slot, given back.
                    reclaimed.then(|| self.slot_lost_by_a_refusal()).flatten()
                });
                let expected = self.model.acquire(bytes, chosen, reclaimed);
                self.check_admission(actual, expected)?;
            }
            Op::TryAcquireWeighted(weight) => {
                let actual = self.bulkhead.try_acquire_weighted(weight);
                let expected = self.model.acquire_weighted(weight, &chosen(&actual));
                self.check_admission(actual, expected)?;
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
                let Held {
                    permit, companions, ..
                } = self.held.remove(index.index(self.held.len()));
                std::mem::forget(permit);
                self.model.forgotten += 1 + companions.len();
            }
            Op::SplitBytes(index) => {
                if self.held.is_empty() {
                    return Ok(());
                }
                let i = index.index(self.held.len());
                let (id, position, bytes, epoch) = {
                    let held = &self.held[i];
                    (held.id, held.position, held.bytes, held.epoch)
                };
                let moved = self.model.take_bytes(id, position, bytes);
                self.held[i].bytes = 0;
                let reservation = self.held[i].permit.split_bytes();
                prop_assert_eq!(reservation.bytes(), moved, "bytes moved by split_bytes");
                prop_assert_eq!(self.held[i].permit.bytes(), 0, "bytes left on the permit");
                self.reservations.push(Reserved {
                    reservation,
                    bytes: moved,
                    epoch,
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
                let expected = self
                    .model
                    .acquire(0, chosen(&actual).first().copied(), false);
                self.check_admission(actual, expected)?;
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
        let superseded = held
            .companions
            .iter()
            .chain([&held.position])
            .all(|&position| !self.model.still_holds(held.id, position));
        let before = (self.bulkhead.in_flight(), self.bulkhead.bytes_reserved());
        self.model.release(&held);
        drop(held.permit);
        if superseded {
            prop_assert_eq!(
                (self.bulkhead.in_flight(), self.bulkhead.bytes_reserved()),
                before,
                "a permit whose slot was reclaimed or reset changed the counts on release"
            );
        }
        Ok(())
    }

    /// The expired slot a call refused for its bytes reclaimed and gave
    /// back: the one the model has as held, expired, that the bulkhead has
    /// as released.
    fn slot_lost_by_a_refusal(&self) -> Option<usize> {
        let model = &self.model;
        (0..model.limit).find(|&position| {
            let slot = &model.slots[position];
            slot.holder.is_some()
                && !model.is_live(slot)
                && self.bulkhead.slot_is_released(position)
        })
    }

    fn drop_reservation_at(&mut self, i: usize) {
        let reserved = self.reservations.remove(i);
        self.model.give_back(reserved.bytes, reserved.epoch);
        drop(reserved.reservation);
    }

    fn check_admission(
        &mut self,
        actual: Result<Permit, ServiceSaturated>,
        expected: Admission,
    ) -> Result<(), TestCaseError> {
        match (actual, expected) {
            (
                Ok(permit),
                Admission::Admitted {
                    id,
                    position,
                    companions,
                    reclaimed,
                    bytes,
                },
            ) => {
                prop_assert_eq!(permit.was_reclaimed(), reclaimed, "was_reclaimed()");
                prop_assert_eq!(permit.bytes(), bytes, "permit.bytes()");
                let epoch = (bytes > 0).then_some(self.model.epoch);
                self.held.push(Held {
                    permit,
                    id,
                    position,
                    companions,
                    bytes,
                    epoch,
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

    /// What must hold after every step.
    fn check(&self) -> Result<(), TestCaseError> {
        let model = &self.model;
        let live = model.live();
        let held = model.held();
        prop_assert_eq!(self.bulkhead.in_flight(), held, "in_flight()");
        prop_assert!(held <= model.limit);
        prop_assert_eq!(self.bulkhead.available(), model.limit - held, "available()");
        prop_assert_eq!(
            self.bulkhead.is_saturated(),
            live == model.limit,
            "is_saturated()"
        );
        prop_assert_eq!(
            self.bulkhead.bytes_reserved(),
            model.reserved,
            "bytes_reserved()"
        );
        prop_assert!(self.bulkhead.bytes_reserved() <= MAX_BYTES);
        prop_assert_eq!(self.bulkhead.waiting(), 0);

        // More permits alive than `limit` only because some were superseded:
        // their slots were reclaimed from under them (a slow holder) or reset.
        let slots_of = |held: &Held| -> Vec<usize> {
            held.companions
                .iter()
                .copied()
                .chain([held.position])
                .collect()
        };
        let current = self
            .held
            .iter()
            .flat_map(|held| {
                slots_of(held)
                    .into_iter()
                    .map(move |position| (held.id, position))
            })
            .filter(|&(id, position)| model.still_holds(id, position))
            .count();
        prop_assert!(current <= model.limit);
        let live_and_held = self
            .held
            .iter()
            .flat_map(|held| {
                slots_of(held)
                    .into_iter()
                    .map(move |position| (held.id, position))
            })
            .filter(|&(id, position)| {
                model.still_holds(id, position) && model.is_live(&model.slots[position])
            })
            .count();
        prop_assert!(
            live_and_held <= live,
            "held permits the model counts live ({live_and_held}) outnumber the live slots ({live})"
        );
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

    /// Releases everything still held, lets every forgotten slot expire,
    /// then takes every slot: exactly the forgotten (and unreset) ones come
    /// back reclaimed, with their bytes, and afterwards nothing is held.
    fn settle(mut self) -> Result<(), TestCaseError> {
        while !self.held.is_empty() {
            self.release_at(0)?;
            self.check()?;
        }
        while !self.reservations.is_empty() {
            self.drop_reservation_at(0);
            self.check()?;
        }
        self.apply(&Op::Advance(HOLD_US))?;
        let abandoned = self.model.held();
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
        let permits: Vec<Permit> = (0..self.model.limit)
            .map(|_| self.bulkhead.try_acquire())
            .collect::<Result<_, _>>()
            .map_err(|shed| TestCaseError::fail(format!("a slot was not free: {shed}")))?;
        let reclaimed = permits.iter().filter(|p| p.was_reclaimed()).count();
        prop_assert_eq!(
            reclaimed,
            abandoned,
            "slots reclaimed from forgotten permits"
        );
        prop_assert_eq!(
            self.bulkhead.bytes_reserved(),
            0,
            "bytes left once every slot was retaken"
        );
        prop_assert!(self.bulkhead.try_acquire().is_err());
        drop(permits);
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
        harness.clock.advance(Duration::from_micros(HOLD_US));
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

    /// The same model at limits that give the free map two and three
    /// levels, with fills and mass releases.
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

/// The smallest case of the bug above. A thread's scans start at the same
/// slot every time, so a single-threaded caller (a `current_thread` runtime)
/// keeps landing on the released slot in front of the expired one and never
/// reclaims it: the forgotten permit's bytes are held forever, and every call
/// that needs them is shed with `ShedReason::Bytes` while `in_flight()` is 0.
#[test]
fn forgotten_bytes_come_back_even_when_another_slot_is_free() {
    let clock = ManualClock::new();
    let reclaim = Duration::from_secs(30);
    let bulkhead = Bulkhead::new(
        Config::new(2, reclaim)
            .max_bytes(MAX_BYTES)
            .clock(clock.clone()),
    );
    let first = bulkhead.try_acquire().unwrap(); // the slot this thread scans first
    std::mem::forget(bulkhead.try_acquire_bytes(800).unwrap()); // the next one
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
