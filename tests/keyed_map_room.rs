//! The room a keyed bulkhead's maps of keys keep: keys moving from map to
//! map (shard to shard) must not leave, in each, the room of the most keys
//! it ever held, which would come to `max_keys` keys' room in every map.
//! In a binary of its own: it counts bytes with a global allocator.

// A counting global allocator is an `unsafe impl`; the library forbids
// `unsafe` in itself.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Duration;
use tower_inflight::keyed::{KeyedBulkhead, KeyedConfig};
use tower_inflight::Config;

const LONG: Duration = Duration::from_secs(3_600);
const SEED: u64 = 0x9e37_79b9_7f4a_7c15;

// ---------------------------------------------------------------------------
// Bytes live, counted per thread (the harness's other threads do not blur
// them).
// ---------------------------------------------------------------------------

struct Counting;

thread_local! {
    static BYTES: Cell<isize> = const { Cell::new(0) };
}

fn count(bytes: isize) {
    let _ = BYTES.try_with(|live| live.set(live.get() + bytes));
}

fn live() -> isize {
    BYTES.with(Cell::get)
}

// SAFETY: every call forwards to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as isize);
        System.alloc(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-(layout.size() as isize));
        System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size as isize - layout.size() as isize);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The shard count of `src/keyed/shards.rs`, as a number of bits.
fn shard_bits(max_keys: usize) -> u32 {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    (max_keys / 64).min(cores * 4).clamp(1, 64).ilog2()
}

/// The shard of a `u64` key among `1 << bits` (pinned by a unit test of
/// `src/keyed/shards.rs`).
fn shard_of(id: u64, bits: u32) -> usize {
    if bits == 0 {
        return 0;
    }
    (id.wrapping_mul(SEED) >> (64 - bits)) as usize
}

/// Ids from this one up panic in the limit function (an unknown tenant,
/// say): the caller's search for room evicted an idle key, and the place
/// is given back as the panic unwinds, free.
const PANICS_FROM: u64 = 1 << 40;

/// Keys of one shard, then (once a panicking limit function has freed
/// the places: each panic evicts an idle key and gives its place back) as
/// many keys of the next shard, and so on. At every moment at most
/// `max_keys` keys are held; every shard's map and ring kept the room of
/// `max_keys` keys for good (a `HashMap` never shrinks by itself), so the
/// maps came to take `shards` times the memory of one map of `max_keys`.
/// (Races of callers of one new key free places too: a place found
/// elsewhere and then not needed is given back.)
#[test]
fn keys_moving_from_shard_to_shard_leave_no_map_capacity_behind() {
    const MAX_KEYS: usize = 512;
    let bits = shard_bits(MAX_KEYS);
    let shards = 1usize << bits;
    assert!(shards >= 2, "needs several shards");
    let keyed = KeyedBulkhead::new(
        KeyedConfig::new(Config::new(1, LONG))
            .limit_per_key(|id: &u64| {
                assert!(*id < PANICS_FROM, "no limit known for {id}");
                1
            })
            .max_keys(MAX_KEYS),
    );
    let ids_of = |at: usize, from: &mut u64| {
        let id = (*from..).find(|&id| shard_of(id, bits) == at).unwrap();
        *from = id + 1;
        id
    };
    let (mut next, mut panicking) = (0u64, PANICS_FROM);
    for _ in 0..MAX_KEYS {
        drop(
            keyed
                .try_acquire(&ids_of(0, &mut next))
                .expect("a free place"),
        );
    }
    let full = live();
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    for at in 1..shards {
        for _ in 0..MAX_KEYS {
            // A key of the previous shard evicts an idle key there, and
            // its place is freed as its limit function panics...
            let id = ids_of(at - 1, &mut panicking);
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                keyed.try_acquire(&id).map(drop)
            }));
            assert!(outcome.is_err(), "the limit function panics");
            // ... and a key of this shard takes the free place.
            drop(
                keyed
                    .try_acquire(&ids_of(at, &mut next))
                    .expect("a free place"),
            );
        }
    }
    std::panic::set_hook(hook);
    assert_eq!(keyed.keys(), MAX_KEYS);
    let after = live();
    let grown = after - full;
    eprintln!(
        "{shards} shards, {MAX_KEYS} keys: {full} bytes live after one shard's keys, \
         {after} after every shard's ({grown} more, {} a key of max_keys)",
        grown / MAX_KEYS as isize
    );
    assert!(
        grown < full / 50,
        "the same {MAX_KEYS} keys held take {grown} bytes more ({}%) once keys have \
         passed through each of {shards} shards",
        grown * 100 / full
    );
}
