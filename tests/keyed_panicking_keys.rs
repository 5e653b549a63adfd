//! Keys whose own `Clone`, `Hash` or `Drop` panic while the keys' maps are
//! busy: such a panic is the key's user's bug, held to std's standard. No
//! other key loses its place, a key is never looked at twice by a search
//! for room, memory and one call's work stay bounded, and the counts stay
//! right afterwards; the key that panicked may be lost. A keyed bulkhead
//! being dropped drops every key once; a key's `Drop` that panics then
//! propagates, as from std's map, without aborting.
//!
//! `max_keys(128)` gives 2 shards, `max_keys(64)` one. The shard of a `u64`
//! key among `1 << bits` is the top `bits` bits of `key * SEED`.

use std::hash::{Hash, Hasher};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, Once, OnceLock};
use std::time::Duration;
use tower_inflight::keyed::{KeyedBulkhead, KeyedConfig, KeyedPermit};
use tower_inflight::{Config, ShedReason};

const LONG: Duration = Duration::from_secs(3_600);
const SEED: u64 = 0x9e37_79b9_7f4a_7c15;

fn shard_of(id: u64, bits: u32) -> usize {
    (id.wrapping_mul(SEED) >> (64 - bits)) as usize
}

/// `count` ids of shard `at` among `1 << bits`, after those `taken` so far.
fn fresh_ids_in(at: usize, bits: u32, count: usize, taken: &mut u64) -> Vec<u64> {
    let ids: Vec<u64> = (*taken..)
        .filter(|&id| shard_of(id, bits) == at)
        .take(count)
        .collect();
    *taken = ids.last().map_or(*taken, |last| last + 1);
    ids
}

/// Panics of the keys' own code, expected, say nothing: their messages
/// start with `QUIET`.
const QUIET: &str = "[expected]";

fn quiet_panics<R>(f: impl FnOnce() -> R) -> std::thread::Result<R> {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let quiet = info
                .payload()
                .downcast_ref::<String>()
                .is_some_and(|message| message.starts_with(QUIET));
            if !quiet {
                default(info);
            }
        }));
    });
    catch_unwind(AssertUnwindSafe(f))
}

// ---------------------------------------------------------------------------
// 1. A key whose `Clone` panicked as it went in, and that goes in later, is
//    one key: a search looks at it once.
// ---------------------------------------------------------------------------

/// The id whose second clone panics (once).
static TWICE_PANICS: AtomicU64 = AtomicU64::new(u64::MAX);
static TWICE_CLONES: AtomicUsize = AtomicUsize::new(0);

#[derive(Debug, PartialEq, Eq, Hash)]
struct Twice(u64);

impl Clone for Twice {
    fn clone(&self) -> Self {
        if self.0 == TWICE_PANICS.load(Ordering::SeqCst)
            && TWICE_CLONES.fetch_add(1, Ordering::SeqCst) == 1
        {
            panic!("{QUIET} clone of key {} panics", self.0);
        }
        Twice(self.0)
    }
}

/// 2 shards, `max_keys` 128. P's second `Clone` panics as P first goes in;
/// P's next call puts it in. Then 126 busy keys and one idle key I of
/// shard 0: 128 keys, 127 busy. A new key of shard 0 must find I within its
/// 128 looks, which it would not if P were looked at twice.
#[test]
fn a_key_put_in_after_its_clone_panicked_is_not_looked_at_twice() {
    let keyed: KeyedBulkhead<Twice> =
        KeyedBulkhead::new(KeyedConfig::new(Config::new(1, LONG)).max_keys(128));
    let mut taken = 30_000_000;
    let p = fresh_ids_in(0, 1, 1, &mut taken)[0];
    let busy_ids = fresh_ids_in(0, 1, 126, &mut taken);
    let idle_id = fresh_ids_in(0, 1, 1, &mut taken)[0];
    let newcomer = fresh_ids_in(0, 1, 1, &mut taken)[0];

    TWICE_CLONES.store(0, Ordering::SeqCst);
    TWICE_PANICS.store(p, Ordering::SeqCst);
    // A key is cloned once as it goes in: P may go in, or not.
    let _ = quiet_panics(|| keyed.try_acquire(&Twice(p)).map(drop));
    TWICE_PANICS.store(u64::MAX, Ordering::SeqCst);

    let mut held: Vec<KeyedPermit> = vec![keyed.try_acquire(&Twice(p)).expect("P goes in")];
    held.extend(
        busy_ids
            .iter()
            .map(|&id| keyed.try_acquire(&Twice(id)).expect("room while filling")),
    );
    drop(keyed.try_acquire(&Twice(idle_id)).expect("room for I"));
    assert_eq!(keyed.keys(), 128);

    let result = keyed.try_acquire(&Twice(newcomer)).map_err(|s| s.reason());
    if let Err(reason) = &result {
        panic!(
            "a new key was shed ({reason:?}) with 127 keys busy and 1 idle: its search looked \
             at P twice (P went in after its Clone panicked), 128 looks for 127 \
             keys (evicted {}, refused {})",
            keyed.status(0).evicted,
            keyed.status(0).refused_new_keys
        );
    }
    drop((result, held));
}

// ---------------------------------------------------------------------------
// 2. Keys whose `Clone` panicked as they went in leave nothing behind:
//    neither memory nor looks for a new key's call.
// ---------------------------------------------------------------------------

/// While set, every second clone of a `Ghostly` panics.
static GHOSTLY: AtomicBool = AtomicBool::new(false);
static GHOSTLY_CLONES: AtomicUsize = AtomicUsize::new(0);
/// `Ghostly` values alive, and hashes of one so far.
static GHOSTLY_ALIVE: AtomicUsize = AtomicUsize::new(0);
static GHOSTLY_HASHES: AtomicUsize = AtomicUsize::new(0);

#[derive(Debug, PartialEq, Eq)]
struct Ghostly(u64);

impl Ghostly {
    fn new(id: u64) -> Self {
        GHOSTLY_ALIVE.fetch_add(1, Ordering::SeqCst);
        Ghostly(id)
    }
}

impl Clone for Ghostly {
    fn clone(&self) -> Self {
        if GHOSTLY.load(Ordering::SeqCst) && GHOSTLY_CLONES.fetch_add(1, Ordering::SeqCst) % 2 == 1
        {
            panic!("{QUIET} second clone of key {} panics", self.0);
        }
        Ghostly::new(self.0)
    }
}

impl Drop for Ghostly {
    fn drop(&mut self) {
        GHOSTLY_ALIVE.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Hash for Ghostly {
    fn hash<H: Hasher>(&self, state: &mut H) {
        GHOSTLY_HASHES.fetch_add(1, Ordering::SeqCst);
        state.write_u64(self.0);
    }
}

/// 1 shard (`max_keys` 4). 20,000 new keys whose second clone panics as
/// each goes in: each call fails, each leaves a clone in the ring, and no
/// sweep runs while places are free to take them out. Then 4 busy keys
/// fill the places, and one new key's search walks every ghost (hashing
/// each): its work grows with the panics before it, not bounded by 128.
/// The ring holds 20,000 clones of keys with no key held: memory past
/// anything `max_keys` bounds.
#[test]
fn ghosts_left_by_panicking_clones_are_bounded_in_memory_and_in_one_calls_work() {
    const PANICS: u64 = 20_000;
    let keyed: KeyedBulkhead<Ghostly> =
        KeyedBulkhead::new(KeyedConfig::new(Config::new(1, LONG)).max_keys(4));
    let alive_before = GHOSTLY_ALIVE.load(Ordering::SeqCst);
    GHOSTLY_CLONES.store(0, Ordering::SeqCst);
    GHOSTLY.store(true, Ordering::SeqCst);
    let mut panicked = 0;
    for id in 0..PANICS {
        let key = Ghostly::new(id);
        if quiet_panics(|| keyed.try_acquire(&key).map(drop)).is_err() {
            panicked += 1;
        }
    }
    GHOSTLY.store(false, Ordering::SeqCst);
    // A key is cloned once as it goes in: every second call panics.
    assert!(panicked >= PANICS / 2, "{panicked} calls panicked");
    let left = GHOSTLY_ALIVE.load(Ordering::SeqCst) - alive_before;

    let held: Vec<_> = (PANICS..PANICS + 4)
        .map(|id| keyed.try_acquire(&Ghostly::new(id)).expect("room for 4"))
        .collect();
    let newcomer = Ghostly::new(PANICS + 4);
    let hashes_before = GHOSTLY_HASHES.load(Ordering::SeqCst);
    let result = keyed
        .try_acquire(&newcomer)
        .map(drop)
        .map_err(|s| s.reason());
    let hashes = GHOSTLY_HASHES.load(Ordering::SeqCst) - hashes_before;
    assert_eq!(result, Err(ShedReason::TooManyKeys));
    drop(held);

    assert!(
        left <= 2 * 4 && hashes <= 2 * 128 + 16,
        "after {PANICS} panicking clones, with no key held (max_keys 4): {left} clones of keys \
         alive (the ring keeps one for each panic: memory unbounded); then one new key's call \
         hashed {hashes} keys with a budget of 128 looks (its sweep walked every ghost: work \
         per call unbounded)"
    );
}

// ---------------------------------------------------------------------------
// 3. A `Hash` that panics while a shard's map rehashes in place: the map
//    drops the entries not rehashed yet, and the counts of keys held and
//    places taken, kept apart from the maps, never hear of it.
// ---------------------------------------------------------------------------

/// A key whose `Hash` writes its class alone (`Eq` compares the id too: a
/// valid `Hash`), and panics for the id in `FLAKY_ID` while `FLAKY_ON`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Flaky {
    id: u64,
    class: u64,
}

static FLAKY_ID: AtomicU64 = AtomicU64::new(u64::MAX);
static FLAKY_ON: AtomicBool = AtomicBool::new(false);

impl Hash for Flaky {
    fn hash<H: Hasher>(&self, state: &mut H) {
        if FLAKY_ON.load(Ordering::SeqCst) && self.id == FLAKY_ID.load(Ordering::SeqCst) {
            panic!("{QUIET} hash of key {} panics", self.id);
        }
        state.write_u64(self.class);
    }
}

/// Ids from `CHAIN_FROM` up to `CHAIN_TO` (excluded) are makers whose limit
/// function makes the next (holding its place meanwhile) and then panics:
/// each evicts an idle key, and all their places are given back.
const CHAIN_FROM: u64 = 1 << 40;
static CHAIN_TO: AtomicU64 = AtomicU64::new(0);
static FLAKY_KEYED: OnceLock<KeyedBulkhead<Flaky>> = OnceLock::new();

fn flaky_keyed() -> &'static KeyedBulkhead<Flaky> {
    FLAKY_KEYED.get_or_init(|| {
        KeyedBulkhead::new(
            KeyedConfig::new(Config::new(1, LONG))
                .limit_per_key(|key: &Flaky| {
                    if key.id >= CHAIN_FROM && key.id < CHAIN_TO.load(Ordering::SeqCst) {
                        if key.id + 1 < CHAIN_TO.load(Ordering::SeqCst) {
                            let next = Flaky {
                                id: key.id + 1,
                                class: key.id + 1,
                            };
                            let _ = flaky_keyed().try_acquire(&next);
                        }
                        panic!("{QUIET} limit of key {} panics", key.id);
                    }
                    1
                })
                .max_keys(112),
        )
    })
}

/// 1 shard, `max_keys` 112 (the 128 buckets of a map of 112). K, busy,
/// then 111 idle keys of one class (one hash: they fill their probe
/// sequence, so that a key taken out leaves a tombstone). 80 makers, one
/// inside another's limit function, each evict one of them and give their
/// places back: 32 keys left, no room left in the map without a rehash. A
/// new key, with K's `Hash` panicking, goes in: the map rehashed in place,
/// K's hash panicked, and the map dropped every entry not rehashed yet, K's
/// among them. K, busy, was made again beside its permit (two in flight
/// for a limit of 1); the keys dropped were still counted held, their
/// places taken, and 112 new keys, all busy, no longer fit. A map of keys
/// now never hashes a key again once it is in.
#[test]
fn a_hash_panicking_as_a_map_rehashes_loses_no_key_in_use_nor_a_place() {
    let keyed = flaky_keyed();
    let k = Flaky { id: 7, class: 7 };
    let k_permit = keyed.try_acquire(&k).expect("room for K");
    for id in 1_000..1_111 {
        drop(
            keyed
                .try_acquire(&Flaky { id, class: 1 })
                .expect("room while filling"),
        );
    }
    assert_eq!(keyed.keys(), 112);

    CHAIN_TO.store(CHAIN_FROM + 80, Ordering::SeqCst);
    let first = Flaky {
        id: CHAIN_FROM,
        class: CHAIN_FROM,
    };
    assert!(quiet_panics(|| keyed.try_acquire(&first).map(drop)).is_err());
    CHAIN_TO.store(0, Ordering::SeqCst);
    assert_eq!(keyed.status(0).evicted, 80, "each maker evicted a key");
    assert_eq!(keyed.keys(), 32);

    FLAKY_ID.store(k.id, Ordering::SeqCst);
    FLAKY_ON.store(true, Ordering::SeqCst);
    let newcomer = Flaky {
        id: 5_000,
        class: 5_000,
    };
    let went_in = quiet_panics(|| keyed.try_acquire(&newcomer).map(drop));
    FLAKY_ON.store(false, Ordering::SeqCst);
    let keys_after = keyed.keys();

    // K holds its one slot: a second call of K is refused.
    let second_k = keyed.try_acquire(&k).map_err(|shed| shed.reason());
    assert_eq!(
        second_k.as_ref().map(|_| ()).map_err(|reason| *reason),
        Err(ShedReason::LimitReached),
        "K, busy with a limit of 1, was made again: its entry was lost"
    );
    drop((second_k, k_permit));
    // Every key idle: 112 new keys, all busy, must all go in.
    let mut fresh = Vec::new();
    let mut shed_at = None;
    for (i, id) in (10_000u64..10_112).enumerate() {
        match keyed.try_acquire(&Flaky { id, class: id }) {
            Ok(permit) => fresh.push(permit),
            Err(_) => {
                shed_at = Some(i);
                break;
            }
        }
    }
    assert!(
        shed_at.is_none(),
        "the newcomer's insert {}; then keys() said {keys_after}; of 112 new keys with every \
         key idle, #{} was shed, keys() saying {}: places lost, and counted as keys held",
        if went_in.is_err() {
            "panicked (K's hash, in a rehash)"
        } else {
            "went in"
        },
        shed_at.unwrap_or_default(),
        keyed.keys()
    );
    assert_eq!(keyed.keys(), 112);
    drop(fresh);
}

// ---------------------------------------------------------------------------
// 4. A key whose `Drop` panics as a sweep evicts it: the key is out of the
//    map, and its place is given back (it was neither handed to the new key
//    nor given back, and the key stayed counted among those held).
// ---------------------------------------------------------------------------

/// The id of the key whose drops panic, and which of its drops from now
/// on does (the map's copy goes first, then the ring's).
static DROPPING_ID: AtomicU64 = AtomicU64::new(u64::MAX);
static DROPPING_NTH: AtomicUsize = AtomicUsize::new(0);

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Dropping(u64);

impl Drop for Dropping {
    fn drop(&mut self) {
        if self.0 == DROPPING_ID.load(Ordering::SeqCst)
            && !std::thread::panicking()
            && DROPPING_NTH.fetch_sub(1, Ordering::SeqCst) == 1
        {
            panic!("{QUIET} drop of key {}", self.0);
        }
    }
}

#[test]
fn a_key_whose_drop_panics_as_it_is_evicted_gives_its_place_back() {
    // The key's one copy panics as it is dropped.
    #[allow(clippy::single_element_loop)]
    for (id, nth) in [(1, 1)] {
        let keyed: KeyedBulkhead<Dropping> =
            KeyedBulkhead::new(KeyedConfig::new(Config::new(1, LONG)).max_keys(1));
        drop(keyed.try_acquire(&Dropping(id)).expect("room for one key"));
        DROPPING_ID.store(id, Ordering::SeqCst);
        DROPPING_NTH.store(nth, Ordering::SeqCst);
        // The new key evicts the idle one, whose drop panics: the call with
        // it.
        let evicting = quiet_panics(|| keyed.try_acquire(&Dropping(id + 1)).map(drop));
        DROPPING_ID.store(u64::MAX, Ordering::SeqCst);
        assert!(evicting.is_err(), "drop {nth} of the evicted key panicked");
        assert_eq!(
            keyed.keys(),
            0,
            "drop {nth}: the evicted key is counted out"
        );
        assert_eq!(keyed.status(4).evicted, 1, "drop {nth}");
        // Its place is free: another new key is admitted.
        let next = keyed
            .try_acquire(&Dropping(id + 2))
            .map_err(|shed| shed.reason());
        assert!(next.is_ok(), "drop {nth}: a new key was shed: {next:?}");
        drop(next);
        assert_eq!(keyed.keys(), 1, "drop {nth}");
    }
}

// ---------------------------------------------------------------------------
// 5. A key whose `Drop` panics as it is evicted leaves no copy in its ring:
//    made again, it is looked at once. (The ring's copy went back into the
//    ring as the panic unwound; made again, the key was in its ring twice.)
// ---------------------------------------------------------------------------

/// The id whose next drop panics, once.
static PANICS_ONCE_ON_DROP: AtomicU64 = AtomicU64::new(u64::MAX);

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct PanicsOnceOnDrop(u64);

impl Drop for PanicsOnceOnDrop {
    fn drop(&mut self) {
        if !std::thread::panicking()
            && PANICS_ONCE_ON_DROP
                .compare_exchange(self.0, u64::MAX, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            panic!("{QUIET} drop of key {}", self.0);
        }
    }
}

#[test]
fn a_key_whose_drop_panicked_as_it_was_evicted_is_looked_at_once_when_made_again() {
    // One map of 127 keys: 1 and 2 idle at the front of the ring, then 125
    // busy.
    let keyed: KeyedBulkhead<PanicsOnceOnDrop> =
        KeyedBulkhead::new(KeyedConfig::new(Config::new(1, LONG)).max_keys(127));
    drop(keyed.try_acquire(&PanicsOnceOnDrop(1)).unwrap());
    drop(keyed.try_acquire(&PanicsOnceOnDrop(2)).unwrap());
    let mut busy: Vec<Option<KeyedPermit>> = (100..225)
        .map(|id| {
            Some(
                keyed
                    .try_acquire(&PanicsOnceOnDrop(id))
                    .expect("room while filling"),
            )
        })
        .collect();
    // A new key evicts 1, then another 2, and the drop of each one's copy
    // in the map panics; each is made again, and held.
    let mut again = Vec::new();
    for (evicted, new) in [(1, 1_000), (2, 1_001)] {
        PANICS_ONCE_ON_DROP.store(evicted, Ordering::SeqCst);
        let evicting = quiet_panics(|| keyed.try_acquire(&PanicsOnceOnDrop(new)).map(drop));
        assert!(evicting.is_err(), "key {evicted}'s drop panicked");
        again.push(
            keyed
                .try_acquire(&PanicsOnceOnDrop(evicted))
                .expect("a free place"),
        );
    }
    assert_eq!(keyed.keys(), 127);
    // The first busy key goes idle, a new one takes its place at the back
    // of the ring and goes idle too: 126 of 127 keys busy.
    busy[0] = None;
    drop(
        keyed
            .try_acquire(&PanicsOnceOnDrop(3))
            .expect("the idle key's place"),
    );
    // A search of 128 looks at every key once, and finds the idle one.
    let next = keyed
        .try_acquire(&PanicsOnceOnDrop(1_002))
        .map_err(|shed| shed.reason());
    assert!(
        next.is_ok(),
        "shed with 126 of 127 keys busy: a key was looked at twice: {next:?}"
    );
    drop((next, busy, again));
}

// ---------------------------------------------------------------------------
// 6. An eviction made as a panic unwinds (a `Drop` that calls the keyed
//    bulkhead) leaves no copy of an ordinary key behind. (The ring's copy of
//    the evicted key was leaked whenever a panic was unwinding.)
// ---------------------------------------------------------------------------

/// Copies of `Counted` alive.
static COUNTED_ALIVE: AtomicUsize = AtomicUsize::new(0);

#[derive(Debug, PartialEq, Eq, Hash)]
struct Counted(u64);

impl Counted {
    fn new(id: u64) -> Self {
        COUNTED_ALIVE.fetch_add(1, Ordering::SeqCst);
        Counted(id)
    }
}

impl Clone for Counted {
    fn clone(&self) -> Self {
        Counted::new(self.0)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        COUNTED_ALIVE.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Calls the keyed bulkhead with a new key as it is dropped (here, as a
/// panic unwinds).
struct CallsOnDrop<'a> {
    keyed: &'a KeyedBulkhead<Counted>,
    id: u64,
}

impl Drop for CallsOnDrop<'_> {
    fn drop(&mut self) {
        let _ = self.keyed.try_acquire(&Counted::new(self.id));
    }
}

#[test]
fn an_eviction_made_while_a_panic_unwinds_leaks_no_copy_of_an_ordinary_key() {
    const ROUNDS: u64 = 1_000;
    let keyed: KeyedBulkhead<Counted> =
        KeyedBulkhead::new(KeyedConfig::new(Config::new(1, LONG)).max_keys(1));
    let alive_before = COUNTED_ALIVE.load(Ordering::SeqCst);
    for id in 0..ROUNDS {
        // Each round's new key evicts the last round's, idle.
        let unwound = quiet_panics(|| {
            let _calls = CallsOnDrop { keyed: &keyed, id };
            panic!("{QUIET} a panic, unrelated to the keys");
        });
        assert!(unwound.is_err());
    }
    assert_eq!(keyed.keys(), 1);
    assert_eq!(keyed.status(0).evicted, ROUNDS - 1);
    let alive = COUNTED_ALIVE.load(Ordering::SeqCst) - alive_before;
    assert!(
        alive <= 2,
        "one key held (a copy in its map, one in its ring), {} evicted while a panic \
         unwound: {alive} copies of keys alive",
        ROUNDS - 1
    );
    drop(keyed);
}

// ---------------------------------------------------------------------------
// 7. A key whose `Drop` panics once as it is evicted leaves no copy of
//    itself behind. (The ring's copy was leaked: memory grew with each.)
// ---------------------------------------------------------------------------

static ONCE_ALIVE: AtomicUsize = AtomicUsize::new(0);
/// The id whose next drop panics (once).
static ONCE_PANICS: AtomicU64 = AtomicU64::new(u64::MAX);

#[derive(Debug, PartialEq, Eq, Hash)]
struct PanicsOnce(u64);

impl PanicsOnce {
    fn new(id: u64) -> Self {
        ONCE_ALIVE.fetch_add(1, Ordering::SeqCst);
        PanicsOnce(id)
    }
}

impl Clone for PanicsOnce {
    fn clone(&self) -> Self {
        PanicsOnce::new(self.0)
    }
}

impl Drop for PanicsOnce {
    fn drop(&mut self) {
        ONCE_ALIVE.fetch_sub(1, Ordering::SeqCst);
        if !std::thread::panicking()
            && ONCE_PANICS
                .compare_exchange(self.0, u64::MAX, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            panic!("{QUIET} drop of key {}", self.0);
        }
    }
}

#[test]
fn keys_whose_drop_panicked_once_as_they_were_evicted_leave_no_copies_behind() {
    const ROUNDS: u64 = 1_000;
    let keyed: KeyedBulkhead<PanicsOnce> =
        KeyedBulkhead::new(KeyedConfig::new(Config::new(1, LONG)).max_keys(1));
    let alive_before = ONCE_ALIVE.load(Ordering::SeqCst);
    drop(
        keyed
            .try_acquire(&PanicsOnce::new(0))
            .expect("room for one key"),
    );
    for id in 1..=ROUNDS {
        // Key `id - 1`, idle, is evicted by key `id`: the first drop of a
        // copy of it (the map's) panics, once.
        let new = PanicsOnce::new(id);
        ONCE_PANICS.store(id - 1, Ordering::SeqCst);
        let evicting = quiet_panics(|| keyed.try_acquire(&new).map(drop));
        assert!(
            evicting.is_err(),
            "round {id}: the evicted key's drop panicked"
        );
        ONCE_PANICS.store(u64::MAX, Ordering::SeqCst);
        drop(keyed.try_acquire(&new).expect("the evicted key's place"));
        drop(new);
    }
    assert_eq!(keyed.keys(), 1);
    let alive = ONCE_ALIVE.load(Ordering::SeqCst) - alive_before;
    assert!(
        alive <= 2,
        "one key held, {ROUNDS} evicted, each key's Drop panicking once: {alive} copies \
         of keys alive"
    );
    drop(keyed);
}

// ---------------------------------------------------------------------------
// 8. A keyed bulkhead dropped while it holds a key whose `Drop` panics each
//    time panics, and does not abort the process. (The ring's copy was
//    dropped as the map's copy's panic unwound: a second panic, an abort.)
//    Run in a child process, which an abort would end.
// ---------------------------------------------------------------------------

static ALWAYS_ARMED: AtomicBool = AtomicBool::new(false);

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct PanicsEveryTime(u64);

impl Drop for PanicsEveryTime {
    fn drop(&mut self) {
        if ALWAYS_ARMED.load(Ordering::SeqCst) && self.0 == 7 {
            panic!("{QUIET} drop of key {}", self.0);
        }
    }
}

const CHILD: &str = "KEYED_PANICKING_KEYS_CHILD";

/// Runs the test `name` alone in a child process (with `CHILD` set to its
/// name) and asserts that it ended well: an abort ends it with a signal.
fn in_child(name: &str, what: &str) {
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--test-threads=1", "--nocapture"])
        .env(CHILD, name)
        .output()
        .expect("the child runs");
    assert!(
        output.status.success(),
        "{what}: the child process ended {:?}; stderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Whether this process is the child that runs the test `name`.
fn is_child(name: &str) -> bool {
    std::env::var_os(CHILD).is_some_and(|child| child == name)
}

#[test]
fn dropping_a_keyed_bulkhead_with_a_key_whose_drop_panics_does_not_abort() {
    let name = "dropping_a_keyed_bulkhead_with_a_key_whose_drop_panics_does_not_abort";
    if !is_child(name) {
        return in_child(
            name,
            "dropping a keyed bulkhead that holds a key whose Drop panics each time",
        );
    }
    let keyed: KeyedBulkhead<PanicsEveryTime> =
        KeyedBulkhead::new(KeyedConfig::new(Config::new(1, LONG)).max_keys(1));
    drop(
        keyed
            .try_acquire(&PanicsEveryTime(7))
            .expect("room for one key"),
    );
    ALWAYS_ARMED.store(true, Ordering::SeqCst);
    // The key's `Drop` panics as the keyed bulkhead is dropped, and the
    // panic goes on, as a `HashMap`'s would; the process lives on.
    let dropped = quiet_panics(move || drop(keyed));
    ALWAYS_ARMED.store(false, Ordering::SeqCst);
    assert!(dropped.is_err(), "the key's Drop panicked");
}

/// Ids whose next drop panics (each once).
static ARMED_IDS: Mutex<Vec<u64>> = Mutex::new(Vec::new());

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct PanicsOncePerId(u64);

impl Drop for PanicsOncePerId {
    fn drop(&mut self) {
        let armed = {
            let mut ids = ARMED_IDS.lock().unwrap_or_else(|e| e.into_inner());
            match ids.iter().position(|&id| id == self.0) {
                Some(at) => {
                    ids.swap_remove(at);
                    true
                }
                None => false,
            }
        };
        if armed {
            panic!("{QUIET} drop of key {}", self.0);
        }
    }
}

// ---------------------------------------------------------------------------
// 10. A keyed bulkhead dropped as one key's `Drop` panics (once) leaves no
//     copy of the other keys behind. (A map whose key's `Drop` panicked
//     stopped dropping the rest, and leaked them with its table.)
// ---------------------------------------------------------------------------

/// Copies of `CountedPanicsOnce` alive.
static ONCE_COUNTED_ALIVE: AtomicUsize = AtomicUsize::new(0);
/// The next drop of any `Counted` panics, once.
static NEXT_DROP_PANICS: AtomicBool = AtomicBool::new(false);

#[derive(Debug, PartialEq, Eq, Hash)]
struct CountedPanicsOnce(u64);

impl CountedPanicsOnce {
    fn new(id: u64) -> Self {
        ONCE_COUNTED_ALIVE.fetch_add(1, Ordering::SeqCst);
        CountedPanicsOnce(id)
    }
}

impl Clone for CountedPanicsOnce {
    fn clone(&self) -> Self {
        CountedPanicsOnce::new(self.0)
    }
}

impl Drop for CountedPanicsOnce {
    fn drop(&mut self) {
        ONCE_COUNTED_ALIVE.fetch_sub(1, Ordering::SeqCst);
        if NEXT_DROP_PANICS.swap(false, Ordering::SeqCst) {
            panic!("{QUIET} drop of key {}", self.0);
        }
    }
}

#[test]
fn a_keyed_bulkhead_dropped_as_one_key_s_drop_panics_leaves_no_copy_of_the_others() {
    const KEYS: u64 = 16;
    // One shard: every key in one map and one ring.
    let keyed: KeyedBulkhead<CountedPanicsOnce> =
        KeyedBulkhead::new(KeyedConfig::new(Config::new(1, LONG)).max_keys(64));
    let alive_before = ONCE_COUNTED_ALIVE.load(Ordering::SeqCst);
    for id in 0..KEYS {
        let key = CountedPanicsOnce::new(id);
        drop(keyed.try_acquire(&key).expect("room for the keys"));
        drop(key);
    }
    assert_eq!(keyed.keys(), KEYS as usize);
    assert_eq!(
        ONCE_COUNTED_ALIVE.load(Ordering::SeqCst) - alive_before,
        KEYS as usize,
        "one copy of each key held"
    );
    // The first copy dropped (one key's, in the map) panics; none after.
    NEXT_DROP_PANICS.store(true, Ordering::SeqCst);
    let dropped = quiet_panics(move || drop(keyed));
    NEXT_DROP_PANICS.store(false, Ordering::SeqCst);
    assert!(dropped.is_err(), "a key's Drop panicked");
    let alive = ONCE_COUNTED_ALIVE.load(Ordering::SeqCst) - alive_before;
    assert_eq!(
        alive, 0,
        "the keyed bulkhead is dropped, one key's Drop having panicked once: {alive} copies \
         of keys are still alive (leaked)"
    );
}

// ---------------------------------------------------------------------------
// 11. A call made as a panic unwinds (from a `Drop`), under its own
//     `catch_unwind`, that evicts a key whose `Drop` panics sees that panic,
//     as any call does. (It was lost: the call returned `Ok`.)
// ---------------------------------------------------------------------------

struct CatchesOnDrop<'a> {
    keyed: &'a KeyedBulkhead<PanicsOncePerId>,
    id: u64,
    /// Whether the caught call panicked.
    seen: &'a Mutex<Option<bool>>,
}

impl Drop for CatchesOnDrop<'_> {
    fn drop(&mut self) {
        let result = catch_unwind(AssertUnwindSafe(|| {
            self.keyed.try_acquire(&PanicsOncePerId(self.id)).map(drop)
        }));
        *self.seen.lock().unwrap() = Some(result.is_err());
    }
}

#[test]
fn a_drop_that_catches_the_panics_of_its_call_sees_an_evicted_key_s_drop_panic() {
    let keyed: KeyedBulkhead<PanicsOncePerId> =
        KeyedBulkhead::new(KeyedConfig::new(Config::new(1, LONG)).max_keys(1));
    // Outside any unwinding, the call evicting a key whose Drop panics
    // panics (the suite asserts it): the caller's to catch.
    drop(
        keyed
            .try_acquire(&PanicsOncePerId(10))
            .expect("room for one key"),
    );
    ARMED_IDS.lock().unwrap().push(10);
    let plain = quiet_panics(|| keyed.try_acquire(&PanicsOncePerId(20)).map(drop));
    assert!(plain.is_err(), "the evicted key's Drop panicked");

    // Now key 20 (made again) is idle; key 30's call, made from a Drop run
    // as an unrelated panic unwinds, under that Drop's own catch_unwind,
    // evicts it, and its Drop panics.
    drop(
        keyed
            .try_acquire(&PanicsOncePerId(20))
            .expect("a free place"),
    );
    ARMED_IDS.lock().unwrap().push(20);
    let seen = Mutex::new(None);
    let unwound = quiet_panics(|| {
        let _catches = CatchesOnDrop {
            keyed: &keyed,
            id: 30,
            seen: &seen,
        };
        panic!("{QUIET} a panic, unrelated to the keys");
    });
    ARMED_IDS.lock().unwrap().clear();
    assert!(unwound.is_err());
    let seen = seen.lock().unwrap().expect("the Drop ran");
    assert!(
        seen,
        "a call that evicted a key whose Drop panicked, made inside catch_unwind from a \
         Drop run as a panic unwound, returned Ok: the key's panic was lost (keys {}, \
         evicted {})",
        keyed.keys(),
        keyed.status(0).evicted
    );
}
