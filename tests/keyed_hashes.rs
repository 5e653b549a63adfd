//! Keys kept with their hash: a map of keys runs a key's `Hash` once, as a
//! call comes in, and its `Eq` only to tell apart keys of one hash. Keys
//! whose `Eq` panics, whose `Hash` changes once they are in, or whose
//! hashes are all one.

use std::hash::{Hash, Hasher};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower_inflight::keyed::{KeyedBulkhead, KeyedConfig};
use tower_inflight::{Config, ShedReason};

const LONG: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------
// A key's `Eq` that panics in a sweep, or as a key made goes in.
// ---------------------------------------------------------------------------

static EQ_PANICS: AtomicU32 = AtomicU32::new(u32::MAX);

#[derive(Clone, Debug, Eq)]
struct EqFragile(u32);

impl PartialEq for EqFragile {
    fn eq(&self, other: &Self) -> bool {
        if self.0 == EQ_PANICS.load(Ordering::SeqCst) {
            panic!("eq of {} panics", self.0);
        }
        self.0 == other.0
    }
}

impl Hash for EqFragile {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

/// A key whose `Eq` panics costs no other key its place: the keys beside
/// it stay evictable. (The sweep compares no keys: it walks the slots.)
#[test]
fn a_sweep_whose_eq_panics_loses_no_key_it_set_aside() {
    let keyed = KeyedBulkhead::new(KeyedConfig::new(Config::new(1, LONG)).max_keys(2));
    // Two keys, both idle and used lately.
    drop(keyed.try_acquire(&EqFragile(901)).unwrap());
    drop(keyed.try_acquire(&EqFragile(902)).unwrap());
    // 902's `Eq` panics if anything compares it while 903 goes in.
    EQ_PANICS.store(902, Ordering::SeqCst);
    let _ = catch_unwind(AssertUnwindSafe(|| {
        keyed.try_acquire(&EqFragile(903)).map(drop)
    }));
    EQ_PANICS.store(u32::MAX, Ordering::SeqCst);
    assert_eq!(keyed.keys(), 2);
    // Both old keys idle: two new busy keys evict both.
    let a = keyed.try_acquire(&EqFragile(903)).expect("903 evicts one");
    let b = keyed
        .try_acquire(&EqFragile(904))
        .expect("904 evicts the other: no key was lost to the panic");
    assert_eq!(keyed.keys(), 2);
    drop((a, b));
}

/// The id whose `Eq` panics, against any key.
static CLASH_PANICS: AtomicU32 = AtomicU32::new(u32::MAX);

/// Keys of one hash, whose `Eq` may panic.
#[derive(Clone, Debug, Eq)]
struct Clashing(u32);

impl PartialEq for Clashing {
    fn eq(&self, other: &Self) -> bool {
        let panics = CLASH_PANICS.load(Ordering::SeqCst);
        if self.0 == panics || other.0 == panics {
            panic!("eq of {} panics", panics);
        }
        self.0 == other.0
    }
}

impl Hash for Clashing {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u32(7);
    }
}

/// A key made, whose `Eq` panics as it goes in (compared with a key of its
/// hash): its place comes back, and the map's lock is not taken twice.
#[test]
fn an_eq_that_panics_as_a_made_key_goes_in_leaks_no_place() {
    let keyed = KeyedBulkhead::new(
        KeyedConfig::new(Config::new(1, LONG))
            .limit_per_key(|key: &Clashing| {
                if key.0 == 2 {
                    // Compared from now on, key 2 panics.
                    CLASH_PANICS.store(2, Ordering::SeqCst);
                }
                1
            })
            .max_keys(2),
    );
    let one = keyed.try_acquire(&Clashing(1)).unwrap();
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        keyed.try_acquire(&Clashing(2)).map(drop)
    }));
    CLASH_PANICS.store(u32::MAX, Ordering::SeqCst);
    assert!(outcome.is_err(), "2's Eq was to panic as it went in");
    assert_eq!(keyed.keys(), 1);
    // Key 1 busy: a new key fits only in the place key 2 gave back.
    let three = keyed
        .try_acquire(&Clashing(3))
        .expect("key 2's place came back");
    assert_eq!(keyed.keys(), 2);
    drop((one, three));
}

// ---------------------------------------------------------------------------
// A key whose `Hash` changes once it is in: the sweep uses the hash kept,
// so the key is still found and evicted (before, it left the ring and its
// place was lost).
// ---------------------------------------------------------------------------

static SALT: AtomicU64 = AtomicU64::new(0);

#[derive(Clone, Debug, PartialEq, Eq)]
struct Drifting(u32);

impl Hash for Drifting {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash(state);
        if self.0 == 0 {
            SALT.load(Ordering::SeqCst).hash(state);
        }
    }
}

#[test]
fn a_key_whose_hash_changed_once_in_is_still_evicted() {
    let keyed = KeyedBulkhead::new(KeyedConfig::new(Config::new(1, LONG)).max_keys(1));
    drop(keyed.try_acquire(&Drifting(0)).unwrap());
    SALT.store(1, Ordering::SeqCst);
    for id in 1..10 {
        let held = keyed
            .try_acquire(&Drifting(id))
            .unwrap_or_else(|shed| panic!("key {id} shed: {:?}", shed.reason()));
        drop(held);
    }
    assert_eq!(keyed.keys(), 1);
    assert_eq!(keyed.status(0).evicted, 9);
}

// ---------------------------------------------------------------------------
// Distinct keys of one user hash (so one kept hash): each its own entry,
// found by its own key, over several shards.
// ---------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq, Eq)]
struct OneHash(u64);

impl Hash for OneHash {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(7);
    }
}

#[test]
fn distinct_keys_of_one_hash_are_told_apart() {
    let keyed = KeyedBulkhead::new(KeyedConfig::new(Config::new(1, LONG)).max_keys(256));
    let held: Vec<_> = (0..200u64)
        .map(|id| {
            keyed
                .try_acquire(&OneHash(id))
                .unwrap_or_else(|shed| panic!("key {id} shed: {:?}", shed.reason()))
        })
        .collect();
    assert_eq!(keyed.keys(), 200);
    for id in 0..200u64 {
        assert_eq!(
            keyed
                .try_acquire(&OneHash(id))
                .map(drop)
                .map_err(|s| s.reason()),
            Err(ShedReason::LimitReached),
            "key {id}, busy, was not found"
        );
    }
    drop(held);
    // All idle: 256 new keys of the same hash evict them and go in.
    let fresh: Vec<_> = (1_000..1_256u64)
        .map(|id| {
            keyed
                .try_acquire(&OneHash(id))
                .unwrap_or_else(|shed| panic!("new key {id} shed: {:?}", shed.reason()))
        })
        .collect();
    assert_eq!(keyed.keys(), 256);
    drop(fresh);
}

// ---------------------------------------------------------------------------
// A key whose `Eq` changes its answer.
// ---------------------------------------------------------------------------

/// A key whose `Eq` answers yes once it is armed, then no: the sweep finds
/// it (yes), then fails to take it out (no). Its place was handed on all
/// the same, and the keys held grew past `max_keys` without bound. Now a
/// key not found again keeps its place: new keys are refused (an `Eq` that
/// is not an equivalence costs places, as it would in a `HashMap`), and no
/// more than `max_keys` keys are ever held.
#[derive(Clone, Debug)]
struct Fickle {
    id: u64,
    armed: Arc<AtomicBool>,
    answers: Arc<AtomicUsize>,
}

impl Fickle {
    fn new(id: u64) -> Self {
        Self {
            id,
            armed: Arc::default(),
            answers: Arc::default(),
        }
    }
}

impl PartialEq for Fickle {
    fn eq(&self, other: &Self) -> bool {
        if self.id != other.id {
            return false;
        }
        !self.armed.load(Ordering::SeqCst) || self.answers.fetch_add(1, Ordering::SeqCst) == 0
    }
}

impl Eq for Fickle {}

impl Hash for Fickle {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.id.hash(state);
    }
}

#[test]
fn keys_held_stay_within_max_keys_when_an_eq_changes_its_answer() {
    let keyed = KeyedBulkhead::new(KeyedConfig::new(Config::new(1, LONG)).max_keys(1));
    for round in 0..50u64 {
        let fickle = Fickle::new(round);
        if let Ok(permit) = keyed.try_acquire(&fickle) {
            drop(permit);
        }
        fickle.armed.store(true, Ordering::SeqCst);
        if let Err(shed) = keyed.try_acquire(&Fickle::new(1_000_000 + round)) {
            assert_eq!(shed.reason(), ShedReason::TooManyKeys);
        }
    }
    assert!(
        keyed.keys() <= 1,
        "{} keys held under max_keys(1)",
        keyed.keys()
    );
}
