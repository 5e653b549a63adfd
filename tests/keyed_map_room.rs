//! The room a keyed bulkhead's maps of keys keep: keys moving from map to
//! map (shard to shard) must not leave, in each, the room of the most keys
//! it ever held, which would come to `max_keys` keys' room in every map;
//! a map judges its room by the most its `capacity()` was, also when a
//! key's `Eq` panics in the insert that grew it, not by its `capacity()`
//! now (`len + growth_left`: a key taken out of a run of full slots leaves
//! a tombstone that lowers it for good, so a map emptied from full reported
//! little capacity while it kept all its buckets); and many keys made at
//! once leave no room for their places behind.
//!
//! In a binary of its own: it counts bytes with a global allocator.

// A counting global allocator is an `unsafe impl`.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::hash::{Hash, Hasher};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Once, OnceLock};
use std::time::Duration;
use tower_inflight::keyed::{KeyedBulkhead, KeyedConfig};
use tower_inflight::Config;

const LONG: Duration = Duration::from_secs(3_600);
const SEED: u64 = 0x9e37_79b9_7f4a_7c15;

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

/// The shard of a key whose `Hash` writes the one `u64` `word`.
fn shard_of(word: u64, bits: u32) -> usize {
    if bits == 0 {
        return 0;
    }
    (word.wrapping_mul(SEED) >> (64 - bits)) as usize
}

/// Ids from this one up panic in the limit function: the caller's search
/// evicted an idle key of its shard, and the place is given back free.
const PANICS_FROM: u64 = 1 << 40;

/// A keyed bulkhead of `max_keys` keys of one slot, whose limit function
/// panics for ids from `PANICS_FROM` up.
fn keyed_of(max_keys: usize) -> KeyedBulkhead<u64> {
    KeyedBulkhead::new(
        KeyedConfig::new(Config::new(1, LONG))
            .limit_per_key(|id: &u64| {
                assert!(*id < PANICS_FROM, "no limit known for {id}");
                1
            })
            .max_keys(max_keys),
    )
}

/// The next id from `from` in shard `at` of `1 << bits`; `from` moves past it.
fn next_id_of(at: usize, bits: u32, from: &mut u64) -> u64 {
    let id = (*from..).find(|&id| shard_of(id, bits) == at).unwrap();
    *from = id + 1;
    id
}

/// 896 keys fill a map of 1,024 buckets exactly (7/8 of them).
const FULL: usize = 896;

fn quiet_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let text = info.to_string();
            if !text.contains("no limit known") && !text.contains("the poison key's Eq") {
                hook(info);
            }
        }));
    });
}

/// Makes `FULL` new keys of one shard, each idle, from `next_key`: the
/// bytes a key takes beside the room of the map and ring (neither grows
/// between 600 and 800 keys), the room of the full shard, and the bytes
/// live once it is full.
fn fill_one_shard<K: Hash + Eq + Clone>(
    keyed: &KeyedBulkhead<K>,
    mut next_key: impl FnMut() -> K,
) -> (isize, isize, isize) {
    let empty = live();
    let (mut at_600, mut at_800) = (0, 0);
    for made in 1..=FULL {
        drop(keyed.try_acquire(&next_key()).expect("a free place"));
        match made {
            600 => at_600 = live(),
            800 => at_800 = live(),
            _ => {}
        }
    }
    let (per_key, full) = ((at_800 - at_600) / 200, live());
    (per_key, full - empty - FULL as isize * per_key, full)
}

/// Evicts one idle key of the shard of `panicking` (whose limit function
/// panics), freeing its place.
fn evict_one_of<K: Hash + Eq + Clone>(keyed: &KeyedBulkhead<K>, panicking: &K) {
    let outcome = catch_unwind(AssertUnwindSafe(|| keyed.try_acquire(panicking).map(drop)));
    assert!(outcome.is_err(), "the limit function panics");
}

/// A tenant's user: `Eq` on both, `Hash` on the tenant alone (legal: equal
/// keys hash alike). A tenant's users share one hash, and one shard.
#[derive(Clone, Debug, PartialEq, Eq)]
struct User {
    tenant: u64,
    id: u64,
}

impl Hash for User {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.tenant.hash(state);
    }
}

/// Keys moving from shard to shard, with the keys of each shard sharing a
/// hash. Every key taken out of a map is a tombstone: its `capacity()` fell
/// to 0 with its 1,024 buckets kept, and it was never shrunk.
#[test]
fn a_shard_emptied_of_keys_of_one_hash_gives_back_its_room() {
    quiet_panics();
    const MAX_KEYS: usize = FULL;
    let bits = shard_bits(MAX_KEYS);
    let shards = 1usize << bits;
    assert!(shards >= 2, "needs several shards");
    let tenant_of = |at: usize| (0..).find(|&t| shard_of(t, bits) == at).unwrap();
    let keyed = KeyedBulkhead::new(
        KeyedConfig::new(Config::new(1, LONG))
            .limit_per_key(|user: &User| {
                assert!(user.id < PANICS_FROM, "no limit known for {user:?}");
                1
            })
            .max_keys(MAX_KEYS),
    );
    let (mut next, mut panicking) = (0u64, PANICS_FROM);
    let tenant = tenant_of(0);
    let (per_key, room_full, full) = fill_one_shard(&keyed, || {
        next += 1;
        User { tenant, id: next }
    });
    for at in 1..shards {
        let (from, to) = (tenant_of(at - 1), tenant_of(at));
        for _ in 0..MAX_KEYS {
            panicking += 1;
            evict_one_of(
                &keyed,
                &User {
                    tenant: from,
                    id: panicking,
                },
            );
            next += 1;
            drop(
                keyed
                    .try_acquire(&User {
                        tenant: to,
                        id: next,
                    })
                    .expect("a free place"),
            );
        }
    }
    assert_eq!(keyed.keys(), MAX_KEYS);
    let grown = live() - full;
    eprintln!(
        "{shards} shards, {MAX_KEYS} keys: {per_key} bytes a key, {room_full} bytes of room \
         in a full shard; {grown} bytes more once keys passed through every shard"
    );
    // Given back, each emptied shard keeps the room of 16 keys or so: far
    // less than one full shard's room in all.
    assert!(
        grown < room_full,
        "the same {MAX_KEYS} keys held take {grown} bytes more, {:.1} full shards' room, \
         once keys have passed through each of {shards} shards",
        grown as f64 / room_full as f64
    );
}

/// Ordinary `u64` keys: a shard filled to 896 (a full map of 1,024
/// buckets) and emptied to 128 keys holds an eighth of its room, and keeps
/// all of its map's (the ring's is given back). Tombstones hide about 3/4
/// of the keys taken out from `capacity()`, so the map is shrunk only
/// below about 110 keys (43..=107 over 2,000 random-hash simulations of
/// `std`'s map), not at a quarter as documented.
#[test]
fn a_shard_left_with_an_eighth_of_its_keys_gives_back_its_map_s_room() {
    quiet_panics();
    const MAX_KEYS: usize = FULL;
    const LEFT: usize = 128;
    let bits = shard_bits(MAX_KEYS);
    assert!(bits >= 1, "needs several shards");
    let keyed = keyed_of(MAX_KEYS);
    let ids_of = |at: usize, from: &mut u64| next_id_of(at, bits, from);
    let (mut next, mut panicking) = (0u64, PANICS_FROM);
    let (per_key, room_full, full) = fill_one_shard(&keyed, || ids_of(0, &mut next));
    // Shard 0 emptied down to LEFT keys, the others parked in shard 1
    // (whose room comes to that of a full shard).
    for _ in 0..FULL - LEFT {
        evict_one_of(&keyed, &ids_of(0, &mut panicking));
        drop(
            keyed
                .try_acquire(&ids_of(1, &mut next))
                .expect("a free place"),
        );
    }
    assert_eq!(keyed.keys(), FULL);
    let grown = live() - full;
    eprintln!(
        "{per_key} bytes a key, {room_full} bytes of room in a full shard; \
         {grown} bytes more with {LEFT} keys left in it and the rest in another"
    );
    // Given back at a quarter, shard 0 would keep at most half its room
    // (512 buckets, a ring of ~510): `grown` <= room_full / 2.
    assert!(
        grown * 10 <= room_full * 6,
        "a shard left with {LEFT} of {FULL} keys kept {grown} bytes of a full shard's \
         {room_full} ({}%) beyond what it gives back at a quarter",
        grown * 100 / room_full
    );
}

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
    let keyed = keyed_of(MAX_KEYS);
    let ids_of = |at: usize, from: &mut u64| next_id_of(at, bits, from);
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
    // Room for `max_keys` kept in every shard would be a map entry and a
    // ring entry a key in each of them: hundreds of bytes a key of
    // `max_keys`. What the shards keep for good is their least maps:
    // tens of bytes a key. (Judged by bytes a key, not a share of the
    // whole: the keys' own bulkheads are small, so a share moves with them.)
    assert!(
        grown < MAX_KEYS as isize * 128,
        "the same {MAX_KEYS} keys held take {grown} bytes more ({} a key of max_keys) once \
         keys have passed through each of {shards} shards",
        grown / MAX_KEYS as isize
    );
}

/// A map's room is the most its `capacity()` was, not the most keys it held:
/// the 449th key grows a map from 512 buckets to 1,024, room for 896 keys.
/// Judged by keys (449), shard 0 kept that room down to 112 keys, an eighth
/// of it; judged by its room, it gives it back below 224.
#[test]
fn a_shard_holding_an_eighth_of_its_map_s_room_gives_it_back() {
    const MAX_KEYS: usize = 449;
    const LEFT: usize = 113;
    quiet_panics();
    let bits = shard_bits(MAX_KEYS);
    assert!(bits >= 1, "needs several shards");
    let ids_of = |at: usize, from: &mut u64| next_id_of(at, bits, from);
    // Churned: shard 0 filled to 449 keys (its map grows to 1,024 buckets
    // at the 449th), then emptied to 113, the others moved to shard 1.
    let start = live();
    let churned = keyed_of(MAX_KEYS);
    let (mut next, mut panicking) = (0u64, PANICS_FROM);
    let mut at_448 = 0;
    for made in 1..=MAX_KEYS {
        drop(churned.try_acquire(&ids_of(0, &mut next)).expect("a place"));
        if made == MAX_KEYS - 1 {
            at_448 = live();
        }
    }
    let at_449 = live();
    let (mut before_per_key, mut after_per_key) = (0, 0);
    for moved in 0..MAX_KEYS - LEFT {
        let id = ids_of(0, &mut panicking);
        assert!(catch_unwind(AssertUnwindSafe(|| churned.try_acquire(&id).map(drop))).is_err());
        if moved == 100 {
            before_per_key = live();
        }
        drop(churned.try_acquire(&ids_of(1, &mut next)).expect("a place"));
        if moved == 100 {
            after_per_key = live();
        }
    }
    assert_eq!(churned.keys(), MAX_KEYS);
    let churned_bytes = live() - start;
    // Fresh: the same split, made directly.
    let start = live();
    let fresh = keyed_of(MAX_KEYS);
    let (mut a, mut b) = (0u64, 0u64);
    for _ in 0..LEFT {
        drop(fresh.try_acquire(&ids_of(0, &mut a)).expect("a place"));
    }
    for _ in 0..MAX_KEYS - LEFT {
        drop(fresh.try_acquire(&ids_of(1, &mut b)).expect("a place"));
    }
    assert_eq!(fresh.keys(), MAX_KEYS);
    let fresh_bytes = live() - start;
    let per_key = after_per_key - before_per_key;
    // The 449th key doubled the map from 512 buckets to 1,024.
    let buckets_512 = at_449 - at_448 - per_key;
    let extra = churned_bytes - fresh_bytes;
    eprintln!(
        "per key {per_key}, 512 buckets {buckets_512}; churned {churned_bytes}, \
         fresh {fresh_bytes}: {extra} bytes more ({:.2} x 512 buckets)",
        extra as f64 / buckets_512 as f64
    );
    // Given back at a quarter of its room (896 keys), shard 0 would have
    // shrunk below 224 keys to 512 buckets: 256 more than a fresh map of
    // 113 keys (256 buckets). Kept, it has 768 more.
    assert!(
        extra < buckets_512,
        "shard 0 holds {LEFT} keys in room for 896 and kept {extra} bytes more than a \
         fresh map ({:.2} x 512 buckets)",
        extra as f64 / buckets_512 as f64
    );
}

/// The id whose `Clone` arms `EQ_ARMED`: a key is cloned after its map is
/// asked whether it holds it and before it goes in.
const POISON: u64 = 1 << 39;
static EQ_ARMED: AtomicBool = AtomicBool::new(false);

/// A tenant's user, as `User`, whose `Eq` panics once `POISON`'s `Clone`
/// has armed it.
#[derive(Debug)]
struct Poisonable {
    tenant: u64,
    id: u64,
}

impl Clone for Poisonable {
    fn clone(&self) -> Self {
        if self.id == POISON {
            EQ_ARMED.store(true, Ordering::SeqCst);
        }
        Poisonable {
            tenant: self.tenant,
            id: self.id,
        }
    }
}

impl PartialEq for Poisonable {
    fn eq(&self, other: &Self) -> bool {
        if EQ_ARMED.load(Ordering::SeqCst) && (self.id == POISON || other.id == POISON) {
            panic!("the poison key's Eq panics");
        }
        self.tenant == other.tenant && self.id == other.id
    }
}

impl Eq for Poisonable {}

impl Hash for Poisonable {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.tenant.hash(state);
    }
}

/// Shard 0 filled to 448 keys (its 512 buckets full), then emptied to 113,
/// the others moved to shard 1. With `poisoned`, the 449th key of shard 0
/// shares a tenant's hash and its `Eq` panics as it goes in (its place
/// comes back, and a key of shard 1 takes it); without, it goes in and is
/// moved like the others. Both end with the same keys in the same shards.
/// Returns the bytes live, and the bytes the 449th key's step took.
fn fill_and_empty_shard_0(poisoned: bool) -> (isize, isize) {
    const MAX_KEYS: usize = 449;
    const LEFT: usize = 113;
    let bits = shard_bits(MAX_KEYS);
    assert!(bits >= 1, "needs several shards");
    let ids_of = |at: usize, from: &mut u64| next_id_of(at, bits, from);
    let user = |tenant: u64| Poisonable { tenant, id: tenant };
    let start = live();
    let keyed = KeyedBulkhead::new(
        KeyedConfig::new(Config::new(1, LONG))
            .limit_per_key(|user: &Poisonable| {
                assert!(user.id < PANICS_FROM, "no limit known for {user:?}");
                1
            })
            .max_keys(MAX_KEYS),
    );
    let (mut next0, mut next1, mut panicking) = (0u64, 0u64, PANICS_FROM);
    let first = ids_of(0, &mut next0);
    drop(keyed.try_acquire(&user(first)).expect("a place"));
    for _ in 1..MAX_KEYS - 1 {
        drop(
            keyed
                .try_acquire(&user(ids_of(0, &mut next0)))
                .expect("a place"),
        );
    }
    let before = live();
    if poisoned {
        let poison = Poisonable {
            tenant: first,
            id: POISON,
        };
        let outcome = catch_unwind(AssertUnwindSafe(|| keyed.try_acquire(&poison).map(drop)));
        EQ_ARMED.store(false, Ordering::SeqCst);
        assert!(outcome.is_err(), "the poison key's Eq panics as it goes in");
        assert_eq!(keyed.keys(), MAX_KEYS - 1, "the poison key went in");
    } else {
        drop(
            keyed
                .try_acquire(&user(ids_of(0, &mut next0)))
                .expect("a place"),
        );
    }
    let step = live() - before;
    if poisoned {
        drop(
            keyed
                .try_acquire(&user(ids_of(1, &mut next1)))
                .expect("a place"),
        );
    }
    let in_shard_0 = if poisoned { MAX_KEYS - 1 } else { MAX_KEYS };
    for _ in 0..in_shard_0 - LEFT {
        let tenant = ids_of(0, &mut panicking);
        evict_one_of(
            &keyed,
            &Poisonable {
                tenant,
                id: PANICS_FROM + tenant,
            },
        );
        drop(
            keyed
                .try_acquire(&user(ids_of(1, &mut next1)))
                .expect("a free place"),
        );
    }
    assert_eq!(keyed.keys(), MAX_KEYS);
    (live() - start, step)
}

/// `HashMap::insert` grows its table before it compares keys: a key whose
/// `Eq` panics there left a map doubled, with its room counted as before,
/// so it kept 1,024 buckets down to an eighth of its keys.
#[test]
fn a_map_grown_by_a_key_whose_eq_panics_as_it_goes_in_gives_back_its_room() {
    quiet_panics();
    let (plain, _) = fill_and_empty_shard_0(false);
    let (poisoned, doubled) = fill_and_empty_shard_0(true);
    let extra = poisoned - plain;
    eprintln!("{plain} bytes, {poisoned} with the panic: {extra} more; the doubling {doubled}");
    // The key is compared before anything grows: a panic there may grow
    // nothing at all.
    assert!(
        extra * 2 <= doubled.max(0),
        "the shard whose map a panicking key doubled kept {extra} bytes more ({:.2} x \
         the doubling) than the same shard doubled by a key that went in",
        extra as f64 / doubled as f64
    );
}

/// Nested first calls still to make, in shard `NESTED_SHARD`, from id
/// `NESTED_NEXT`: a limit function may call its keyed bulkhead, so one
/// thread holds many keys being made in one shard at once (as callers
/// sitting in a slow limit function do).
static NESTED_LEFT: AtomicUsize = AtomicUsize::new(0);
static NESTED_SHARD: AtomicUsize = AtomicUsize::new(0);
static NESTED_NEXT: AtomicU64 = AtomicU64::new(0);

/// A keyed bulkhead as `keyed_of`'s, whose limit function makes the next
/// nested key while `NESTED_LEFT` counts any.
fn keyed_nesting(max_keys: usize, bits: u32) -> KeyedBulkhead<u64> {
    let this: Arc<OnceLock<KeyedBulkhead<u64>>> = Arc::new(OnceLock::new());
    let inner = this.clone();
    let keyed = KeyedBulkhead::new(
        KeyedConfig::new(Config::new(1, LONG))
            .limit_per_key(move |id: &u64| {
                assert!(*id < PANICS_FROM, "no limit known for {id}");
                let left = NESTED_LEFT.load(Ordering::SeqCst);
                if left > 0 {
                    NESTED_LEFT.store(left - 1, Ordering::SeqCst);
                    let mut from = NESTED_NEXT.load(Ordering::SeqCst);
                    let next = next_id_of(NESTED_SHARD.load(Ordering::SeqCst), bits, &mut from);
                    NESTED_NEXT.store(from, Ordering::SeqCst);
                    let keyed = inner.get().expect("set");
                    drop(
                        keyed
                            .try_acquire(&next)
                            .expect("a place for the nested key"),
                    );
                }
                1
            })
            .max_keys(max_keys),
    );
    let _ = this.set(keyed.clone());
    keyed
}

/// `max_keys` keys of shard 0, then of shard 1 (evicting shard 0's), and so
/// on; `nested` makes each shard's keys at once, as one chain of nested
/// first calls. Returns the bytes live (the keyed bulkhead refers to itself,
/// and is never dropped).
fn move_through_shards(max_keys: usize, bits: u32, nested: bool) -> isize {
    let start = live();
    let keyed = keyed_nesting(max_keys, bits);
    let (mut next, mut panicking) = (0u64, PANICS_FROM);
    for at in 0..1usize << bits {
        if nested {
            // Shard `at - 1`'s keys are evicted as this shard's are made.
            NESTED_SHARD.store(at, Ordering::SeqCst);
            let first = next_id_of(at, bits, &mut next);
            NESTED_NEXT.store(next, Ordering::SeqCst);
            NESTED_LEFT.store(max_keys - 1, Ordering::SeqCst);
            drop(keyed.try_acquire(&first).expect("a place"));
            assert_eq!(NESTED_LEFT.load(Ordering::SeqCst), 0);
            next = NESTED_NEXT.load(Ordering::SeqCst);
        } else {
            for _ in 0..max_keys {
                if at > 0 {
                    evict_one_of(&keyed, &next_id_of(at - 1, bits, &mut panicking));
                }
                drop(
                    keyed
                        .try_acquire(&next_id_of(at, bits, &mut next))
                        .expect("a place"),
                );
            }
        }
        assert_eq!(keyed.keys(), max_keys);
    }
    live() - start
}

/// Keys being made hold their place in their shard's `making`: a shard
/// where `max_keys` keys were once made at once kept room for as many
/// places for good, and keys moving from shard to shard left that room
/// behind in every shard (`shards x max_keys x 8` bytes).
#[test]
fn keys_made_at_once_in_every_shard_leave_no_room_behind() {
    quiet_panics();
    const MAX_KEYS: usize = 512;
    let bits = shard_bits(MAX_KEYS);
    assert!(bits >= 1, "needs several shards");
    // Nested first calls run deep: a thread of its own, with its own count.
    let (one_by_one, at_once) = std::thread::Builder::new()
        .stack_size(512 << 20)
        .spawn(move || {
            (
                move_through_shards(MAX_KEYS, bits, false),
                move_through_shards(MAX_KEYS, bits, true),
            )
        })
        .unwrap()
        .join()
        .unwrap();
    let extra = at_once - one_by_one;
    let places = (1isize << bits) * MAX_KEYS as isize * 8;
    eprintln!(
        "made one by one {one_by_one} bytes, at once {at_once}: {extra} more \
         (shards x max_keys x 8 = {places})"
    );
    assert!(
        extra * 4 < places,
        "keys made at once left {extra} bytes of room for places in the shards ({}% of \
         shards x max_keys places)",
        extra * 100 / places
    );
}
