//! What a key costs a call: `try_acquire` + drop on a keyed bulkhead (an
//! existing key of 1,000, a `u64`; and of 16, all in cache), beside the
//! same on a plain bulkhead,
//! beside a plain bulkhead plus a lookup in a `HashMap` of 1,000 keys (what
//! "a hash lookup over the plain bulkhead" costs, for a set of keys fixed
//! in advance), and beside a plain bulkhead plus a lookup in a `HashMap`
//! behind a `RwLock` (the least a set of keys that changes while calls run
//! needs), taking turns (`support::interleaved`).
//!
//! A third group makes the same calls on two threads at once, each its own
//! keys: what the keys' locks cost when cores meet on them.
//!
//! The flood groups send a flood of new keys while every key of 1,000 or
//! 10,000 is busy: each call is shed `TooManyKeys`, beside a plain bulkhead's
//! refusal of a call when all its slots are held. The last group makes calls
//! of existing keys on one thread, alone and while a second thread floods
//! the keyed bulkhead with new keys.
//!
//! Run with `cargo bench --bench keyed`.

mod support;

use criterion::measurement::WallTime;
use criterion::{black_box, criterion_main, BenchmarkGroup, Criterion};
use std::collections::HashMap;
use std::sync::{mpsc, Barrier, RwLock};
use std::time::Duration;
use support::{each, interleaved, Turn};
use tower_inflight::keyed::{KeyedBulkhead, KeyedConfig};
use tower_inflight::{Bulkhead, Config};

const LIMIT: usize = 25;
const RECLAIM_AFTER: Duration = Duration::from_secs(30);

/// The variants, in the order of their turns.
const VARIANTS: [&str; 4] = [
    "plain",
    "plain_and_a_hash_lookup",
    "plain_and_a_locked_hash_lookup",
    "keyed",
];

/// What the variants call, each of `keys` keys made.
struct Variants {
    plain: Bulkhead,
    map: HashMap<u64, Bulkhead>,
    locked: RwLock<HashMap<u64, Bulkhead>>,
    keyed: KeyedBulkhead<u64>,
}

impl Variants {
    fn new(keys: u64) -> Self {
        let config = || Config::new(LIMIT, RECLAIM_AFTER);
        let keyed = KeyedBulkhead::new(KeyedConfig::new(config()).max_keys(keys as usize));
        for key in 0..keys {
            drop(keyed.try_acquire(&key).unwrap());
        }
        let map: HashMap<u64, Bulkhead> = (0..keys)
            .map(|key| (key, Bulkhead::new(config())))
            .collect();
        Self {
            plain: Bulkhead::new(config()),
            locked: RwLock::new(map.clone()),
            map,
            keyed,
        }
    }
}

/// Benches each variant of `group`, taking `turns`.
fn bench_each(group: &mut BenchmarkGroup<'_, WallTime>, turns: &[Turn<'_>]) {
    for (mine, name) in VARIANTS.into_iter().enumerate() {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| interleaved(iters, turns, mine))
        });
    }
}

/// Each call takes the next of `KEYS` keys in turn.
fn try_acquire_drop<const KEYS: u64>(c: &mut Criterion, group: &str) {
    let mut group = c.benchmark_group(group);
    let variants = Variants::new(KEYS);
    let key = std::cell::Cell::new(0u64);
    let next = || {
        let k = key.get();
        key.set((k + 1) % KEYS);
        k
    };
    let plain_calls = each(|| {
        black_box(black_box(&variants.plain).try_acquire().is_ok());
    });
    let map_calls = each(|| {
        let bulkhead = &black_box(&variants.map)[&next()];
        black_box(bulkhead.try_acquire().is_ok());
    });
    let locked_calls = each(|| {
        let map = black_box(&variants.locked).read().unwrap();
        black_box(map[&next()].try_acquire().is_ok());
    });
    let keyed_calls = each(|| {
        black_box(black_box(&variants.keyed).try_acquire(&next()).is_ok());
    });
    bench_each(
        &mut group,
        &[&plain_calls, &map_calls, &locked_calls, &keyed_calls],
    );
    group.finish();
}

/// The same calls on two threads, of 1,000 keys: each iteration is
/// `BATCH` calls on each thread, the two starting together, so that the
/// threads' meeting at the start and end of each turn weighs little.
fn try_acquire_drop_on_two_threads(c: &mut Criterion, group: &str) {
    const KEYS: u64 = 1_000;
    const BATCH: u64 = 8;
    let mut group = c.benchmark_group(group);
    let variants = Variants::new(KEYS);
    // Variant `variant`'s `iterations` on thread `thread`, whose keys
    // start half the keys after the other's.
    let calls = |variant: usize, thread: u64, iterations: u64| {
        let mut key = thread * KEYS / 2;
        for _ in 0..iterations * BATCH {
            key = (key + 1) % KEYS;
            match variant {
                0 => black_box(black_box(&variants.plain).try_acquire().is_ok()),
                1 => black_box(black_box(&variants.map)[&key].try_acquire().is_ok()),
                2 => {
                    let map = black_box(&variants.locked).read().unwrap();
                    black_box(map[&key].try_acquire().is_ok())
                }
                _ => black_box(black_box(&variants.keyed).try_acquire(&key).is_ok()),
            };
        }
    };
    let (start, done) = (Barrier::new(2), Barrier::new(2));
    std::thread::scope(|scope| {
        // The worker ends when the turns, and their senders, are dropped.
        let (order, orders) = mpsc::channel::<(usize, u64)>();
        scope.spawn(|| {
            for (variant, iterations) in orders {
                start.wait();
                calls(variant, 1, iterations);
                done.wait();
            }
        });
        let turn = |variant: usize| {
            let order = order.clone();
            let (start, done, calls) = (&start, &done, &calls);
            move |iterations: u64| {
                order.send((variant, iterations)).unwrap();
                start.wait();
                calls(variant, 0, iterations);
                done.wait();
            }
        };
        let turns = [turn(0), turn(1), turn(2), turn(3)];
        bench_each(&mut group, &[&turns[0], &turns[1], &turns[2], &turns[3]]);
    });
    group.finish();
}

/// A new key each call, every one of `max_keys` keys holding its slot.
fn new_key_shed(c: &mut Criterion, group: &str, max_keys: u64) {
    let mut group = c.benchmark_group(group);
    let config = || Config::new(1, RECLAIM_AFTER);
    let keyed = KeyedBulkhead::new(KeyedConfig::new(config()).max_keys(max_keys as usize));
    let _held: Vec<_> = (0..max_keys)
        .map(|key| keyed.try_acquire(&key).unwrap())
        .collect();
    let full = Bulkhead::new(config());
    let _full = full.try_acquire().unwrap();
    let new_key = std::cell::Cell::new(max_keys);
    let plain_shed = each(|| {
        black_box(black_box(&full).try_acquire().is_err());
    });
    let keyed_shed = each(|| {
        let key = new_key.get();
        new_key.set(key + 1);
        black_box(black_box(&keyed).try_acquire(&key).is_err());
    });
    let turns: [Turn<'_>; 2] = [&plain_shed, &keyed_shed];
    for (mine, name) in ["plain_shed", "new_key_shed"].into_iter().enumerate() {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| interleaved(iters, &turns, mine))
        });
    }
    group.finish();
}

/// Calls of 16 existing keys of 1,000, every key holding a slot of its 25:
/// alone, and while a second thread sends a new key each call, each shed.
fn calls_during_a_flood(c: &mut Criterion, group: &str) {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    const KEYS: u64 = 1_000;
    let mut group = c.benchmark_group(group);
    let keyed = KeyedBulkhead::new(
        KeyedConfig::new(Config::new(LIMIT, RECLAIM_AFTER)).max_keys(KEYS as usize),
    );
    let _held: Vec<_> = (0..KEYS)
        .map(|key| keyed.try_acquire(&key).unwrap())
        .collect();
    let calls = |iterations: u64| {
        let start = std::time::Instant::now();
        for call in 0..iterations {
            black_box(black_box(&keyed).try_acquire(&(call % 16)).is_ok());
        }
        start.elapsed()
    };
    group.bench_function("alone", |b| b.iter_custom(calls));
    let next_new_key = AtomicU64::new(KEYS);
    group.bench_function("while_flooded", |b| {
        b.iter_custom(|iterations| {
            let flooding = AtomicBool::new(true);
            let shed = AtomicU64::new(0);
            std::thread::scope(|scope| {
                scope.spawn(|| {
                    while flooding.load(Ordering::Relaxed) {
                        let key = next_new_key.fetch_add(1, Ordering::Relaxed);
                        black_box(keyed.try_acquire(&key).is_err());
                        shed.fetch_add(1, Ordering::Relaxed);
                    }
                });
                // Timed once the flood is under way.
                while shed.load(Ordering::Relaxed) < 100 {
                    std::hint::spin_loop();
                }
                let elapsed = calls(iterations);
                flooding.store(false, Ordering::Relaxed);
                elapsed
            })
        })
    });
    group.finish();
}

// What `criterion_group!` expands to, written out because the macro's
// `pub fn` trips the crate's `missing_docs` lint.
fn benches() {
    let mut criterion = support::criterion(Duration::from_secs(2));
    try_acquire_drop::<1_000>(&mut criterion, "keyed_try_acquire_drop");
    try_acquire_drop::<16>(&mut criterion, "keyed_try_acquire_drop_16_keys");
    try_acquire_drop_on_two_threads(&mut criterion, "keyed_try_acquire_drop_two_threads_8_calls");
    new_key_shed(&mut criterion, "keyed_flood_of_new_keys_1000_busy", 1_000);
    new_key_shed(&mut criterion, "keyed_flood_of_new_keys_10000_busy", 10_000);
    calls_during_a_flood(&mut criterion, "keyed_calls_during_a_flood_of_new_keys");
}

criterion_main!(benches);
