//! Keys spread over several maps (shards), each behind its own lock: a new
//! key that finds no room in its own map looks in the others, and
//! `max_keys` bounds them all together. Faults found by an adversarial
//! reading, each failing on the version before its fix: a new key shed while 64 of 128 keys were idle (each map's sweep looked at its
//! share of 128 keys only), a new key shed while 32 of 128 were idle (its
//! sweep looked again at busy keys it had seen), a caller shed in its second
//! search for room (it had what its first search left); and, of the
//! short searches that follow a search that found no room, a flood of new
//! keys of one map shed for good while the keys of another were idle, a new
//! key shed while one of fewer than 128 keys was idle, searches short for
//! good on a clock at its last tick, and short searches that found none
//! keeping the searches short past the millisecond.
//!
//! `max_keys(128)` gives 2 shards on any machine (128 / 64 = 2, at most
//! four a core). The shard of a `u64` key is the top bit of
//! `key * 0x9e37_79b9_7f4a_7c15` (the shard hasher of `src/keyed/shards.rs`
//! over one `write_u64`, pinned by a unit test there), reproduced here to
//! place keys.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;
use tower_inflight::keyed::{KeyedBulkhead, KeyedConfig, KeyedPermit};
use tower_inflight::{Config, ManualClock, ShedReason};

const LONG: Duration = Duration::from_secs(3_600);
const PATIENCE: Duration = Duration::from_secs(30);
const SEED: u64 = 0x9e37_79b9_7f4a_7c15;

/// The shard of a `u64`-hashed key among `1 << bits`.
fn shard_of(id: u64, bits: u32) -> usize {
    (id.wrapping_mul(SEED) >> (64 - bits)) as usize
}

/// The first `count` ids from `from` that fall in shard `at` of 2.
fn ids_in(at: usize, from: u64, count: usize) -> Vec<u64> {
    (from..)
        .filter(|&id| shard_of(id, 1) == at)
        .take(count)
        .collect()
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

/// Keys `ids` made, each holding its slot.
fn busy(keyed: &KeyedBulkhead<u64>, ids: &[u64]) -> Vec<KeyedPermit> {
    ids.iter()
        .map(|id| keyed.try_acquire(id).expect("room while filling"))
        .collect()
}

/// Keys `ids` made, and idle.
fn idle(keyed: &KeyedBulkhead<u64>, ids: &[u64]) {
    for id in ids {
        drop(keyed.try_acquire(id).expect("room while filling"));
    }
}

// ---------------------------------------------------------------------------
// Gates: a thread that reaches a gate named for it says so and waits there
// until let go. One-shot.
// ---------------------------------------------------------------------------

type Gates = HashMap<String, (mpsc::Sender<()>, Arc<Mutex<mpsc::Receiver<()>>>)>;
static GATES: Mutex<Option<Gates>> = Mutex::new(None);

/// Registers gate `name`: (reached, let go).
fn gate(name: &str) -> (mpsc::Receiver<()>, mpsc::Sender<()>) {
    let (reached_tx, reached_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel();
    GATES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(name.to_owned(), (reached_tx, Arc::new(Mutex::new(go_rx))));
    (reached_rx, go_tx)
}

/// Waits at gate `{this thread's name}/{what}`, if one is registered.
fn pass(what: &str) {
    let Some(name) = std::thread::current()
        .name()
        .map(|name| format!("{name}/{what}"))
    else {
        return;
    };
    let gate = GATES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_mut()
        .and_then(|gates| gates.remove(&name));
    if let Some((reached, go)) = gate {
        reached.send(()).unwrap();
        let _ = go.lock().unwrap().recv_timeout(PATIENCE);
    }
}

/// The id whose `Eq` passes a gate `{thread}/eq` (one id at a time): a
/// sweep compares each key it looks at with the map's.
static EQ_GATED: AtomicU64 = AtomicU64::new(u64::MAX);
/// The id whose second `Clone` panics (once), and its clones so far.
static CLONE_PANICS: AtomicU64 = AtomicU64::new(u64::MAX);
static CLONES_OF_IT: AtomicUsize = AtomicUsize::new(0);

/// A `u64` key (in the shard of its `u64`) whose `Eq` may stop at a gate
/// and whose `Clone` may panic.
#[derive(Debug, Eq)]
struct Gated(u64);

impl PartialEq for Gated {
    fn eq(&self, other: &Self) -> bool {
        if self.0 == EQ_GATED.load(Ordering::SeqCst) {
            pass("eq");
        }
        self.0 == other.0
    }
}

impl Clone for Gated {
    fn clone(&self) -> Self {
        if self.0 == CLONE_PANICS.load(Ordering::SeqCst)
            && CLONES_OF_IT.fetch_add(1, Ordering::SeqCst) == 1
        {
            panic!("clone of key {} panics", self.0);
        }
        Gated(self.0)
    }
}

impl Hash for Gated {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.0);
    }
}

/// A keyed bulkhead of `max_keys` on `clock`, whose keys' makers pass a
/// gate `{thread}/limit`.
fn gated_keyed_on(max_keys: usize, clock: ManualClock) -> KeyedBulkhead<Gated> {
    KeyedBulkhead::new(
        KeyedConfig::new(Config::new(1, LONG).clock(clock))
            .limit_per_key(|_: &Gated| {
                pass("limit");
                1
            })
            .max_keys(max_keys),
    )
}

/// Keys `ids` made, each holding its slot.
fn busy_gated(keyed: &KeyedBulkhead<Gated>, ids: &[u64]) -> Vec<KeyedPermit> {
    ids.iter()
        .map(|&id| keyed.try_acquire(&Gated(id)).expect("room while filling"))
        .collect()
}

fn call_on(
    name: &str,
    keyed: &KeyedBulkhead<Gated>,
    id: u64,
) -> std::thread::JoinHandle<Result<KeyedPermit, ShedReason>> {
    let keyed = keyed.clone();
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || keyed.try_acquire(&Gated(id)).map_err(|shed| shed.reason()))
        .unwrap()
}

/// A new key may be shed while an idle key lies further on only with 128
/// keys or more busy at once. With each shard's sweep held to its share of
/// 128 (64 of each of 2 shards), 64 busy keys at the front of one shard, 64
/// idle behind them and the other shard empty had a new key shed, whether
/// of the other shard or of the full one.
#[test]
fn a_new_key_is_not_shed_while_64_of_128_keys_are_idle() {
    for newcomer_shard in [1, 0] {
        let keyed = KeyedBulkhead::new(KeyedConfig::new(Config::new(1, LONG)).max_keys(128));
        let ids = ids_in(0, 0, 129);
        let busy: Vec<_> = ids[..64]
            .iter()
            .map(|id| keyed.try_acquire(id).unwrap())
            .collect();
        for id in &ids[64..128] {
            drop(keyed.try_acquire(id).unwrap());
        }
        assert_eq!(keyed.keys(), 128);
        let newcomer = match newcomer_shard {
            0 => ids[128],
            _ => ids_in(1, 0, 1)[0],
        };
        if let Err(shed) = keyed.try_acquire(&newcomer) {
            panic!(
                "a new key of shard {newcomer_shard} shed ({:?}) with 64 keys busy and 64 idle",
                shed.reason()
            );
        }
        drop(busy);
    }
}

/// A search for room looks at no key twice. 2 shards, `max_keys` 128. Shard
/// 0 (the newcomer's): 32 busy keys. Shard 1: 64 busy keys, then 32 idle
/// ones. The newcomer looks at shard 0's 32, then on into shard 1, and
/// finds an idle key at its 97th look. Looking at shard 0's 32 again, as a
/// sweep of the fronts of the shards first and then deeper did, it was shed
/// with 96 keys busy and 32 idle.
#[test]
fn a_new_key_is_not_shed_while_32_of_128_keys_are_idle_behind_96_busy() {
    let keyed = KeyedBulkhead::new(KeyedConfig::new(Config::new(1, LONG)).max_keys(128));
    let mut taken = 0;
    let mut held = busy(&keyed, &fresh_ids_in(0, 1, 32, &mut taken));
    held.extend(busy(&keyed, &fresh_ids_in(1, 1, 64, &mut taken)));
    idle(&keyed, &fresh_ids_in(1, 1, 32, &mut taken));
    assert_eq!(keyed.keys(), 128);
    assert_eq!(keyed.status(0).evicted, 0);

    let newcomer = fresh_ids_in(0, 1, 1, &mut taken)[0];
    if let Err(shed) = keyed.try_acquire(&newcomer) {
        panic!(
            "a new key shed ({:?}) with 96 keys busy and 32 idle; refused so far: {}",
            shed.reason(),
            keyed.status(0).refused_new_keys
        );
    }
    assert_eq!(keyed.status(0).evicted, 1);
    drop(held);
}

/// The same over 4 shards, `max_keys` 256. Shards 0 (the newcomer's), 1
/// and 2: 16 busy keys each. Shard 3: 32 busy keys, then 176 idle ones. The
/// newcomer finds an idle key at its 81st look. Looking at shards 0, 1 and
/// 2 again, as the sweep of the fronts first did, it was shed with 80 keys
/// busy and 176 idle.
#[test]
fn a_new_key_is_not_shed_while_176_of_256_keys_are_idle_over_four_shards() {
    let keyed = KeyedBulkhead::new(KeyedConfig::new(Config::new(1, LONG)).max_keys(256));
    let mut taken = 0;
    let mut held = Vec::new();
    for at in 0..3 {
        held.extend(busy(&keyed, &fresh_ids_in(at, 2, 16, &mut taken)));
    }
    held.extend(busy(&keyed, &fresh_ids_in(3, 2, 32, &mut taken)));
    idle(&keyed, &fresh_ids_in(3, 2, 176, &mut taken));
    assert_eq!(keyed.keys(), 256);
    assert_eq!(keyed.status(0).evicted, 0);

    let newcomer = fresh_ids_in(0, 2, 1, &mut taken)[0];
    if let Err(shed) = keyed.try_acquire(&newcomer) {
        panic!(
            "a new key shed ({:?}) with 80 keys busy and 176 idle",
            shed.reason()
        );
    }
    assert_eq!(keyed.status(0).evicted, 1);
    drop(held);
}

/// A caller whose place was taken while it made its key searches for room
/// again, with a budget of its own: with what was left of the first
/// search's, it looked at the same busy keys again and was shed.
///
/// 2 shards. Shard 0: a1..a64 busy. Shard 1: I, idle and not used since the
/// last sweep, at the front, then 63 busy. A (key X of shard 0) looks at the
/// 64 busy of shard 0 (64 left), evicts I at shard 1's front (63 left), and
/// makes X (held at a gate). Meanwhile a second caller of X takes A's place
/// and inserts X, X goes idle and a new key Y of shard 1 evicts it; then
/// every key of shard 1 goes idle. A, back with no place, looks at 63 of the
/// same 64 busy keys of shard 0 again (budget spent) and is shed: 64 of 128
/// keys idle, 65 distinct keys looked at.
#[test]
fn a_re_search_is_not_shed_while_64_of_128_keys_are_idle() {
    let clock = ManualClock::new();
    let keyed = gated_keyed_on(128, clock.clone());
    let mut taken = 10_000_000;
    let i = fresh_ids_in(1, 1, 1, &mut taken)[0];
    let shard1_busy_ids = fresh_ids_in(1, 1, 63, &mut taken);
    let shard0_busy_ids = fresh_ids_in(0, 1, 64, &mut taken);
    let z = fresh_ids_in(0, 1, 1, &mut taken)[0];
    let x = fresh_ids_in(0, 1, 1, &mut taken)[0];
    let y = fresh_ids_in(1, 1, 1, &mut taken)[0];

    let i_permit = keyed.try_acquire(&Gated(i)).unwrap();
    let shard1_busy = busy_gated(&keyed, &shard1_busy_ids);
    let shard0_busy = busy_gated(&keyed, &shard0_busy_ids);
    assert_eq!(keyed.keys(), 128);
    // Z, every key busy: its sweep passes over all 128 (each no longer used
    // since) and it is shed.
    assert_eq!(
        keyed
            .try_acquire(&Gated(z))
            .map(drop)
            .map_err(|s| s.reason()),
        Err(ShedReason::TooManyKeys)
    );
    // Searches are short for a millisecond after one that found no room:
    // past it, A's is a full one.
    clock.advance(Duration::from_millis(1));
    drop(i_permit); // I idle, unused, at the front of shard 1

    // A: evicts I, then makes X and stops there.
    let (a_in, a_go) = gate("research-A/limit");
    let a = call_on("research-A", &keyed, x);
    a_in.recv_timeout(PATIENCE).expect("A makes X");
    assert_eq!(keyed.status(0).evicted, 1, "A evicted I");
    // A second caller of X takes A's place and inserts X; X goes idle.
    drop(
        keyed
            .try_acquire(&Gated(x))
            .expect("X made by its second caller"),
    );
    // Y, new in shard 1, evicts the idle X.
    drop(keyed.try_acquire(&Gated(y)).expect("Y evicts the idle X"));
    assert_eq!(keyed.status(0).evicted, 2, "Y evicted X");
    assert_eq!(keyed.keys(), 128);
    // Every key of shard 1 idle: 64 of 128.
    drop(shard1_busy);

    a_go.send(()).unwrap();
    let result = a.join().unwrap();
    if let Err(reason) = &result {
        panic!(
            "A, back with no place, was shed ({reason:?}) with 64 of 128 keys idle (all of \
             shard 1) and 64 busy: its re-search looked again at the busy keys its first \
             search saw; evicted {}, refused {}",
            keyed.status(0).evicted,
            keyed.status(0).refused_new_keys
        );
    }
    drop((result, shard0_busy));
}

// ---------------------------------------------------------------------------
// Short searches: within a millisecond of a search that looked at 128 keys
// and found none, a new key looks at 8, each search beginning in the map
// after the last one's.
// ---------------------------------------------------------------------------

fn keyed_on(clock: &ManualClock, max_keys: usize) -> KeyedBulkhead<u64> {
    KeyedBulkhead::new(
        KeyedConfig::new(Config::new(1, LONG).clock(clock.clone())).max_keys(max_keys),
    )
}

/// `keyed`, of `max_keys(200)` (2 maps), filled: 136 keys busy in map 0
/// (their slots, each of which may be let go) and 64 in map 1; and `new`
/// new keys of map 0.
fn every_key_busy_over_two_maps(
    keyed: &KeyedBulkhead<u64>,
    new: usize,
) -> (Vec<Option<KeyedPermit>>, Vec<KeyedPermit>, Vec<u64>) {
    let mut taken = 1_000;
    let ids = fresh_ids_in(0, 1, 136, &mut taken);
    let map0 = busy(keyed, &ids).into_iter().map(Some).collect();
    let map1 = busy(keyed, &fresh_ids_in(1, 1, 64, &mut taken));
    (map0, map1, fresh_ids_in(0, 1, new, &mut taken))
}

/// Every key busy, 64 in each map: a new key of map 0 is shed. Then every
/// key of map 1 goes idle, and new keys of map 0 come one every half a
/// millisecond, so that every search is a short one: one of them finds the
/// idle keys of map 1. (Each short search spent its 8 looks in its own map,
/// never reaching the other, and all were shed.)
#[test]
fn a_flood_of_new_keys_of_one_map_finds_the_idle_keys_of_the_other() {
    let clock = ManualClock::new();
    let keyed = keyed_on(&clock, 128);
    let mut taken = 1_000;
    let map0 = busy(&keyed, &fresh_ids_in(0, 1, 64, &mut taken));
    let map1 = busy(&keyed, &fresh_ids_in(1, 1, 64, &mut taken));
    let first = fresh_ids_in(0, 1, 1, &mut taken)[0];
    assert_eq!(
        keyed.try_acquire(&first).map(drop).map_err(|s| s.reason()),
        Err(ShedReason::TooManyKeys),
        "every key busy"
    );
    drop(map1);
    let flood = fresh_ids_in(0, 1, 1_000, &mut taken);
    let admitted = flood.iter().position(|id| {
        clock.advance(Duration::from_micros(500));
        keyed.try_acquire(id).is_ok()
    });
    let status = keyed.status(0);
    assert!(
        admitted.is_some_and(|n| n < 2),
        "new keys of map 0 shed while the 64 keys of map 1 were idle: first admitted \
         {admitted:?}, refused {}",
        status.refused_new_keys
    );
    drop(map0);
}

/// Fewer keys than a search looks at: every key busy, a new key is shed,
/// then one key goes idle, and the next new key takes its place. (The
/// refusal made the next search a short one, of 8 keys.)
#[test]
fn with_fewer_than_128_keys_a_new_key_is_not_shed_while_one_is_idle() {
    let clock = ManualClock::new();
    let keyed = keyed_on(&clock, 16);
    let mut held: Vec<Option<KeyedPermit>> = (0..16u64)
        .map(|id| Some(keyed.try_acquire(&id).expect("room while filling")))
        .collect();
    assert_eq!(
        keyed.try_acquire(&100).map(drop).map_err(|s| s.reason()),
        Err(ShedReason::TooManyKeys),
        "every key busy"
    );
    held[12] = None;
    let next = keyed.try_acquire(&101).map_err(|s| s.reason());
    assert!(next.is_ok(), "shed with one of 16 keys idle: {next:?}");
    drop((next, held));
}

/// On a clock at its last tick (it reads the same from then on), a search
/// that found none makes no later search short. (The window never ended:
/// every search after was short for good.)
#[test]
fn on_a_clock_at_its_last_tick_searches_stay_full() {
    let clock = ManualClock::new();
    clock.advance(Duration::MAX);
    let keyed = keyed_on(&clock, 200);
    let (mut held, others, new_of_map0) = every_key_busy_over_two_maps(&keyed, 2);
    // A full search looks at the first 128 of map 0 and finds none.
    assert_eq!(
        keyed
            .try_acquire(&new_of_map0[0])
            .map(drop)
            .map_err(|s| s.reason()),
        Err(ShedReason::TooManyKeys),
        "every key busy"
    );
    // The 21st of map 0's ring goes idle: a full search finds it, a short
    // one (8 keys) would not.
    held[12] = None;
    clock.advance(Duration::from_secs(3_600));
    let next = keyed.try_acquire(&new_of_map0[1]).map_err(|s| s.reason());
    assert!(next.is_ok(), "shed an hour on, with a key idle: {next:?}");
    drop((next, held, others));
}

/// A full search that found none makes the searches short for a
/// millisecond, and a short one that finds none does not make it longer.
/// (Each short search that found none began the millisecond again, so a
/// flood kept every search short for good.)
#[test]
fn a_short_search_that_found_none_does_not_make_the_short_searches_last_longer() {
    let clock = ManualClock::new();
    let keyed = keyed_on(&clock, 200);
    let (mut held, others, new_keys) = every_key_busy_over_two_maps(&keyed, 3);
    let shed = |id: &u64| keyed.try_acquire(id).map(drop).map_err(|s| s.reason());
    // A full search looks at the first 128 of map 0 and finds none.
    assert_eq!(shed(&new_keys[0]), Err(ShedReason::TooManyKeys));
    // The 21st of map 0's ring goes idle; a short search finds none.
    held[12] = None;
    clock.advance(Duration::from_micros(900));
    assert_eq!(
        shed(&new_keys[1]),
        Err(ShedReason::TooManyKeys),
        "short, within the millisecond"
    );
    // Past the millisecond of the full search: a full search finds the
    // idle key.
    clock.advance(Duration::from_micros(100));
    let next = keyed.try_acquire(&new_keys[2]).map_err(|s| s.reason());
    assert!(next.is_ok(), "shed past the millisecond: {next:?}");
    drop((next, held, others));
}
