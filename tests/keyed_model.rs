//! Random sequences of calls over several keys of one keyed bulkhead (a
//! limit per key, a ceiling for all, fewer keys held than keys used, and
//! permits released, leaked and outlived), checked after every step
//! against a model that knows each permit's key and the time it was taken.
//!
//! The model does not say which key the bulkhead evicts; it checks the
//! promises: no key and no ceiling over its limit, never shed beside a free
//! slot, a new key refused only when every key it could evict is held, and
//! never more keys held than `max_keys`.
//!
//! Time is a `ManualClock` in whole microseconds, so a slot taken at `t` is
//! free at `t + hold`, not a microsecond before, in the model as in the
//! bulkhead.

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{FileFailurePersistence, TestCaseError};
use std::time::Duration;
use tower_inflight::keyed::{KeyedBulkhead, KeyedConfig, KeyedPermit};
use tower_inflight::{Config, ManualClock, ShedReason};

/// `reclaim_after`, in microseconds.
const HOLD_US: u64 = 100_000;
const KEYS: u8 = 6;
const CEILING: usize = 4;
const MAX_KEYS: usize = 3;

fn limit(key: u8) -> usize {
    usize::from(key % 3) + 1
}

#[derive(Clone, Debug)]
enum Op {
    TryAcquire(u8),
    /// Drops a held permit.
    Release(Index),
    /// `mem::forget`s a held permit.
    Forget(Index),
    /// Moves the manual clock on, in microseconds.
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..KEYS).prop_map(Op::TryAcquire),
        4 => any::<Index>().prop_map(Op::Release),
        1 => any::<Index>().prop_map(Op::Forget),
        2 => (0..=40_000u64).prop_map(Op::Advance),
        1 => Just(Op::Advance(HOLD_US - 1)),
        1 => Just(Op::Advance(1)),
    ]
}

/// A permit the model knows of: held, or leaked.
struct Taken {
    key: u8,
    at: u64,
    permit: Option<KeyedPermit>,
}

struct Harness {
    clock: ManualClock,
    keyed: KeyedBulkhead<u8>,
    now: u64,
    taken: Vec<Taken>,
}

impl Harness {
    fn new() -> Self {
        let clock = ManualClock::new();
        let hold = Duration::from_micros(HOLD_US);
        let keyed = KeyedBulkhead::new(
            KeyedConfig::new(Config::new(1, hold).clock(clock.clone()))
                .ceiling(Config::new(CEILING, hold).clock(clock.clone()))
                .limit_per_key(|key: &u8| limit(*key))
                .max_keys(MAX_KEYS),
        );
        Self {
            clock,
            keyed,
            now: 0,
            taken: Vec::new(),
        }
    }

    /// Whether a permit taken at `at` still holds its slots: its deadline
    /// has not come.
    fn live(&self, at: u64) -> bool {
        self.now < at + HOLD_US
    }

    fn live_of(&self, key: u8) -> usize {
        self.taken
            .iter()
            .filter(|taken| taken.key == key && self.live(taken.at))
            .count()
    }

    fn live_in_all(&self) -> usize {
        self.taken
            .iter()
            .filter(|taken| self.live(taken.at))
            .count()
    }

    /// Whether the bulkhead may count `key` as held, and not evict it: a
    /// slot of it is held, its deadline not come. A permit still out past
    /// its deadline (held past its hold, or leaked) pins its key no more.
    fn may_be_held(&self, key: u8) -> bool {
        self.live_of(key) > 0
    }

    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match *op {
            Op::TryAcquire(key) => self.try_acquire(key)?,
            Op::Release(index) => {
                if !self.taken.is_empty() {
                    let at = index.index(self.taken.len());
                    if self.taken[at].permit.is_some() {
                        self.taken.swap_remove(at);
                    }
                }
            }
            Op::Forget(index) => {
                if !self.taken.is_empty() {
                    let at = index.index(self.taken.len());
                    if let Some(permit) = self.taken[at].permit.take() {
                        std::mem::forget(permit);
                    }
                }
            }
            Op::Advance(us) => {
                self.clock.advance(Duration::from_micros(us));
                self.now += us;
            }
        }
        self.check()
    }

    fn try_acquire(&mut self, key: u8) -> Result<(), TestCaseError> {
        let key_has_room = self.live_of(key) < limit(key);
        let ceiling_has_room = self.live_in_all() < CEILING;
        match self.keyed.try_acquire(&key) {
            Ok(permit) => {
                prop_assert!(key_has_room, "key {key} admitted past its limit");
                prop_assert!(ceiling_has_room, "key {key} admitted past the ceiling");
                self.taken.push(Taken {
                    key,
                    at: self.now,
                    permit: Some(permit),
                });
            }
            Err(shed) => match shed.reason() {
                ShedReason::LimitReached => {
                    prop_assert!(
                        !key_has_room || !ceiling_has_room,
                        "key {key} shed beside free slots"
                    );
                }
                ShedReason::TooManyKeys => {
                    let held = (0..KEYS)
                        .filter(|&other| other != key && self.may_be_held(other))
                        .count();
                    prop_assert!(
                        held >= MAX_KEYS,
                        "new key {key} refused with only {held} keys held"
                    );
                }
                other => prop_assert!(false, "key {key} shed for {other:?}"),
            },
        }
        Ok(())
    }

    fn check(&self) -> Result<(), TestCaseError> {
        let status = self.keyed.status(usize::from(KEYS));
        prop_assert!(status.keys <= MAX_KEYS, "{} keys held", status.keys);
        for key in &status.busiest {
            prop_assert!(
                key.limit == limit(key.key),
                "key {} has limit {}",
                key.key,
                key.limit
            );
        }
        let ceiling = self.keyed.ceiling().unwrap();
        prop_assert!(ceiling.in_flight() <= CEILING);
        Ok(())
    }
}

/// Failing seeds are written to `tests/proptest-regressions/` and replayed
/// first on every run: commit them.
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/proptest-regressions/keyed_model.txt"
        )))),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn keyed_bulkhead_keeps_its_promises_after_every_operation(
        ops in prop::collection::vec(op(), 1..120),
    ) {
        let mut harness = Harness::new();
        for op in &ops {
            harness.apply(op)?;
        }
    }
}
