//! Places for new keys and counts of keyed bulkheads, under races and
//! keys whose `Clone` panics: faults found by an adversarial reading, each
//! a promise an earlier version broke (a place leaked by a panicking
//! `Clone`, more than `max_keys` keys held after racing first calls, an
//! admission counted by a key for a call its ceiling refused, and an event
//! hook that deadlocked on the map's lock). Keys whose `Hash` or `Eq`
//! misbehave are in `keyed_hashes.rs`.

use std::collections::HashSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::Duration;
use tower_inflight::keyed::{KeyedBulkhead, KeyedConfig};
use tower_inflight::{Config, ShedReason};

const LONG: Duration = Duration::from_secs(30);
const PATIENCE: Duration = Duration::from_secs(20);

/// Ids whose `Clone` panics.
static CLONE_PANICS: Mutex<Option<HashSet<u32>>> = Mutex::new(None);

fn set(of: &Mutex<Option<HashSet<u32>>>, id: u32) {
    of.lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashSet::new)
        .insert(id);
}

fn has(of: &Mutex<Option<HashSet<u32>>>, id: u32) -> bool {
    of.lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .is_some_and(|ids| ids.contains(&id))
}

/// A key whose `Clone` panics once its id is named.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Fragile(u32);

impl Clone for Fragile {
    fn clone(&self) -> Self {
        if has(&CLONE_PANICS, self.0) {
            panic!("clone of {} panics", self.0);
        }
        Fragile(self.0)
    }
}

/// A key whose `Clone` panicked while its place was reserved leaves the
/// place taken forever: `reserved += 1` comes before `key.clone()`, and
/// the `Reservation` that would give it back is built after.
#[test]
fn a_panicking_clone_leaks_no_place_for_new_keys() {
    let keyed = KeyedBulkhead::new(KeyedConfig::new(Config::new(1, LONG)).max_keys(1));
    set(&CLONE_PANICS, 101);
    let outcome = catch_unwind(AssertUnwindSafe(|| keyed.try_acquire(&Fragile(101))));
    assert!(outcome.is_err(), "the clone was expected to panic");
    assert_eq!(keyed.keys(), 0);
    // No key is held: a new key must fit.
    match keyed.try_acquire(&Fragile(102)) {
        Ok(_) => {}
        Err(shed) => panic!(
            "a new key with no key held was shed ({:?}): the panicking clone's place leaked",
            shed.reason()
        ),
    }
}

/// Two first calls of one key race: the second inserts the key while the
/// first still holds its reservation, so `entries + reserved` passes
/// `max_keys`; a new key then evicts one key and reserves a place, and the
/// first maker, back, inserts its key on its old place: more than
/// `max_keys` keys are held.
#[test]
fn racing_first_calls_never_hold_more_than_max_keys() {
    static BLOCKED_ONCE: AtomicBool = AtomicBool::new(false);
    let (entered_tx, entered) = mpsc::channel::<()>();
    let (release, released) = mpsc::channel::<()>();
    let entered_tx = Mutex::new(entered_tx);
    let released = Mutex::new(released);
    let keyed = KeyedBulkhead::new(
        KeyedConfig::new(Config::new(1, LONG))
            .limit_per_key(move |key: &&'static str| {
                if *key == "x" && !BLOCKED_ONCE.swap(true, Ordering::SeqCst) {
                    // The first maker of "x" is held here, outside the locks.
                    entered_tx.lock().unwrap().send(()).unwrap();
                    let _ = released.lock().unwrap().recv_timeout(PATIENCE);
                }
                1
            })
            .max_keys(1),
    );
    let first = keyed.clone();
    let maker = std::thread::spawn(move || first.try_acquire(&"x").is_ok());
    entered
        .recv_timeout(PATIENCE)
        .expect("the first maker of x reached its limit function");
    // A second first call of "x": made and inserted meanwhile, then idle.
    drop(keyed.try_acquire(&"x").expect("x admitted"));
    // A new key: evicts idle "x".
    drop(keyed.try_acquire(&"y").expect("y admitted"));
    release.send(()).unwrap();
    assert!(maker.join().unwrap());
    assert!(
        keyed.keys() <= 1,
        "max_keys is 1 but {} keys are held",
        keyed.keys()
    );
}

/// A closed ceiling is not a full one: `try_acquire` takes the key's slot
/// (an admission on the key) and only then is refused by the ceiling.
#[test]
fn a_call_the_ceiling_refuses_counts_no_admission_on_its_key() {
    let keyed =
        KeyedBulkhead::new(KeyedConfig::new(Config::new(2, LONG)).ceiling(Config::new(4, LONG)));
    let held = keyed.try_acquire(&"a").unwrap();
    keyed.ceiling().unwrap().close();
    let shed = keyed.try_acquire(&"a").unwrap_err();
    assert_eq!(shed.reason(), ShedReason::Closed);
    let status = keyed.status(8);
    let a = status.busiest.iter().find(|key| key.key == "a").unwrap();
    assert_eq!(
        a.totals.admitted, 1,
        "key a counts an admission for the call the ceiling refused"
    );
    drop(held);
}

/// A per-key event hook that looks at the keyed bulkhead, heard as the
/// layer admits a new key's first call: it must not run under the map's
/// lock.
#[test]
fn an_event_hook_that_reads_the_keyed_bulkhead_does_not_deadlock() {
    use std::sync::OnceLock;
    use tower::{service_fn, ServiceBuilder, ServiceExt};
    use tower_inflight::keyed::KeyedConcurrencyLayer;
    use tower_inflight::{BoxError, Event};

    static KEYED: OnceLock<KeyedBulkhead<u32>> = OnceLock::new();
    let per_key = Config::new(2, LONG)
        .wait(Duration::from_millis(100))
        .on_event(|event| {
            if matches!(event, Event::Admitted | Event::Rejected { .. }) {
                if let Some(keyed) = KEYED.get() {
                    let _ = keyed.keys();
                }
            }
        });
    let keyed = KeyedBulkhead::new(KeyedConfig::new(per_key));
    let _ = KEYED.set(keyed.clone());
    let layer = KeyedConcurrencyLayer::from_bulkhead(keyed, |request: &u32| *request);
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let outcome = runtime.block_on(async move {
            ServiceBuilder::new()
                .layer(layer)
                .service(service_fn(|_: u32| async { Ok::<_, BoxError>(()) }))
                .oneshot(7)
                .await
                .is_ok()
        });
        let _ = done.send(outcome);
    });
    assert_eq!(
        finished.recv_timeout(PATIENCE),
        Ok(true),
        "a request whose per-key hook reads the keyed bulkhead never returned"
    );
}

// ---------------------------------------------------------------------------
// Keys of one hash share the place of a key being made (places are kept by
// hash); a place taken for a key made meanwhile is pushed back. Neither
// lets more than `max_keys` keys in, nor leaks a place.
// ---------------------------------------------------------------------------

mod collisions {
    use super::*;
    use std::collections::HashMap;
    use std::hash::{Hash, Hasher};
    use std::sync::mpsc;
    use std::sync::Arc;
    use std::sync::Mutex;
    use tower_inflight::keyed::KeyedPermit;

    /// Every key of one hash.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    struct Colliding(u32);

    impl Hash for Colliding {
        fn hash<H: Hasher>(&self, state: &mut H) {
            state.write_u64(7);
        }
    }

    /// A limit function whose first call for each key in `gated` says it
    /// was entered and waits to be let go.
    struct Gates {
        entered: Mutex<mpsc::Sender<u32>>,
        go: HashMap<u32, Mutex<mpsc::Receiver<()>>>,
        first: Mutex<std::collections::HashSet<u32>>,
    }

    fn gates(
        gated: &[u32],
    ) -> (
        Arc<Gates>,
        mpsc::Receiver<u32>,
        HashMap<u32, mpsc::Sender<()>>,
    ) {
        let (entered_tx, entered_rx) = mpsc::channel();
        let mut go = HashMap::new();
        let mut open = HashMap::new();
        for &key in gated {
            let (tx, rx) = mpsc::channel();
            go.insert(key, Mutex::new(rx));
            open.insert(key, tx);
        }
        let gates = Gates {
            entered: Mutex::new(entered_tx),
            go,
            first: Mutex::new(gated.iter().copied().collect()),
        };
        (Arc::new(gates), entered_rx, open)
    }

    const PATIENCE: Duration = Duration::from_secs(30);

    fn keyed_over(gates: &Arc<Gates>, max_keys: usize) -> KeyedBulkhead<Colliding> {
        let gates = gates.clone();
        KeyedBulkhead::new(
            KeyedConfig::new(Config::new(1, LONG))
                .limit_per_key(move |key: &Colliding| {
                    if gates.first.lock().unwrap().remove(&key.0) {
                        gates.entered.lock().unwrap().send(key.0).unwrap();
                        let _ = gates.go[&key.0].lock().unwrap().recv_timeout(PATIENCE);
                    }
                    1
                })
                .max_keys(max_keys),
        )
    }

    fn call(
        keyed: &KeyedBulkhead<Colliding>,
        key: u32,
    ) -> std::thread::JoinHandle<Result<KeyedPermit, ShedReason>> {
        let keyed = keyed.clone();
        std::thread::spawn(move || keyed.try_acquire(&Colliding(key)).map_err(|s| s.reason()))
    }

    /// Key 2 comes while key 1, of its hash, is being made under a cap of
    /// one: it takes no place, then takes key 1's; key 1 back finds no room.
    #[test]
    fn a_key_of_a_hash_being_made_cannot_take_a_key_past_max_keys() {
        let (gates, entered, open) = gates(&[1]);
        let keyed = keyed_over(&gates, 1);
        let one = call(&keyed, 1);
        assert_eq!(entered.recv_timeout(PATIENCE), Ok(1));
        let two = keyed
            .try_acquire(&Colliding(2))
            .expect("key 2 takes key 1's place");
        open[&1].send(()).unwrap();
        let one = one.join().unwrap();
        assert_eq!(one.map(drop), Err(ShedReason::TooManyKeys));
        assert_eq!(keyed.keys(), 1);
        drop(two);
        // No place left held: a new key fits.
        let three = keyed.try_acquire(&Colliding(3));
        assert!(three.is_ok(), "{:?}", three.map(drop));
        assert_eq!(keyed.keys(), 1);
    }

    /// A maker back after its key was made (by a second caller that took its
    /// place) takes the place of another key of its hash being made, and
    /// pushes it back: the cap holds meanwhile, and the other key goes in.
    #[test]
    fn a_place_pushed_back_keeps_the_cap_and_is_not_leaked() {
        let (gates, entered, open) = gates(&[1, 2]);
        let keyed = keyed_over(&gates, 2);
        let maker = call(&keyed, 1);
        assert_eq!(entered.recv_timeout(PATIENCE), Ok(1));
        // A second caller of key 1 makes it, taking the maker's place.
        let held_one = call(&keyed, 1)
            .join()
            .unwrap()
            .expect("key 1's second caller");
        assert_eq!(keyed.keys(), 1);
        // Key 2, of the same hash, takes a place while it is made.
        let other = call(&keyed, 2);
        assert_eq!(entered.recv_timeout(PATIENCE), Ok(2));
        open[&1].send(()).unwrap();
        // Key 1 is made and full: its maker is refused for its limit.
        assert_eq!(
            maker.join().unwrap().map(drop),
            Err(ShedReason::LimitReached)
        );
        // One key held, one being made: a third key of the same hash shares
        // the place of the one being made (by design), and goes in.
        let three = keyed.try_acquire(&Colliding(3)).map_err(|s| s.reason());
        assert!(keyed.keys() <= 2, "{} keys held", keyed.keys());
        drop(three);
        open[&2].send(()).unwrap();
        // Key 2, back with no place, finds room by evicting the idle key 3.
        let held_two = other.join().unwrap().expect("key 2 goes in");
        assert_eq!(keyed.keys(), 2);
        drop((held_one, held_two));
        // No place left held: with both keys idle, a new key fits.
        let four = keyed.try_acquire(&Colliding(4));
        assert!(four.is_ok(), "{:?}", four.map(drop));
        assert!(keyed.keys() <= 2);
    }
}

/// Threads make new keys at once over many shards, each holding some of
/// its keys' permits a while: never more than `max_keys` keys held, and no
/// place lost. Once they are done, `max_keys` new keys are all admitted,
/// and `max_keys` keys are held: a place lost (taken in one shard for a key
/// and never given back) would hold the keys to fewer.
#[test]
fn new_keys_racing_over_many_shards_never_pass_max_keys_nor_lose_a_place() {
    const MAX_KEYS: usize = 256;
    let keyed = KeyedBulkhead::new(KeyedConfig::new(Config::new(1, LONG)).max_keys(MAX_KEYS));
    std::thread::scope(|scope| {
        for thread in 0..4u64 {
            let keyed = &keyed;
            scope.spawn(move || {
                let mut held = std::collections::VecDeque::new();
                for key in thread * 100_000..thread * 100_000 + 3_000 {
                    if let Ok(permit) = keyed.try_acquire(&key) {
                        held.push_back(permit);
                    }
                    // Up to 40 held a thread: 160 of 256, so new keys keep
                    // evicting idle ones, in their own shard or another.
                    if held.len() > (key % 40) as usize {
                        held.pop_front();
                    }
                    assert!(keyed.keys() <= MAX_KEYS, "{} keys held", keyed.keys());
                }
            });
        }
    });
    assert!(keyed.keys() <= MAX_KEYS);
    for key in 0..MAX_KEYS as u64 {
        if let Err(shed) = keyed.try_acquire(&(1_000_000 + key)) {
            panic!("new key {key} after the race: {shed:?}");
        }
    }
    assert_eq!(keyed.keys(), MAX_KEYS, "a place was lost");
}

/// New keys from two threads, with at most two of 64 keys busy at once:
/// racing searches for room may pick the same idle key, and the one that
/// loses it looks again, so no new key is ever shed.
#[test]
fn racing_new_keys_are_not_shed_while_most_keys_are_idle() {
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;
    let keyed = KeyedBulkhead::new(
        KeyedConfig::new(Config::new(1, Duration::from_secs(3_600))).max_keys(64),
    );
    for key in 0..64_u64 {
        drop(keyed.try_acquire(&key).expect("room for the first keys"));
    }
    let next = Arc::new(AtomicU64::new(1_000));
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let (keyed, next, stop) = (keyed.clone(), next.clone(), stop.clone());
            std::thread::spawn(move || {
                for _ in 0..100_000 {
                    if stop.load(Ordering::Relaxed) {
                        return Err(());
                    }
                    match keyed.try_acquire(&next.fetch_add(1, Ordering::Relaxed)) {
                        Ok(permit) => drop(permit),
                        Err(_) => {
                            stop.store(true, Ordering::Relaxed);
                            return Err(());
                        }
                    }
                }
                Ok(())
            })
        })
        .collect();
    for thread in threads {
        assert!(
            thread.join().unwrap().is_ok(),
            "a new key was shed with at most 2 of 64 keys busy"
        );
    }
}
