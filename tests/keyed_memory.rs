//! A flood of distinct keys through the keyed layer: memory stays bounded,
//! nothing held is evicted, and a new key is shed with the right reason
//! when every key held is busy. And keys called for a day: their memory
//! does not grow with time. Measured with a counting allocator that counts
//! each thread's own bytes: the harness runs the tests on threads of their
//! own, and a runtime another test builds meanwhile is not this test's.

// A counting global allocator is an `unsafe impl`; the library itself
// forbids `unsafe`.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Duration;
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
use tower_inflight::keyed::KeyedBulkhead;
use tower_inflight::keyed::{KeyedConcurrencyLayer, KeyedConfig};
use tower_inflight::{BoxError, Config, ManualClock, ServiceSaturated, ShedReason};

/// Counts the bytes this thread allocated and has not freed. Every test
/// here runs its bulkhead on its own thread (a current-thread runtime), so
/// what it frees it allocated.
struct Counting;

thread_local! {
    // `const`, with no destructor: reading it never allocates.
    static LIVE: Cell<isize> = const { Cell::new(0) };
}

fn count(bytes: isize) {
    LIVE.with(|live| live.set(live.get() + bytes));
}

fn live() -> usize {
    LIVE.with(Cell::get).max(0) as usize
}

// SAFETY: every call is passed on to the system allocator unchanged; the
// counter only observes sizes.
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
static ALLOCATOR: Counting = Counting;

const KEYS: u64 = 1_000_000;
const MAX_KEYS: usize = 1_000;

#[tokio::test(flavor = "current_thread")]
async fn a_million_distinct_keys_keep_memory_bounded_and_evict_nothing_held() {
    let layer = KeyedConcurrencyLayer::new(
        // Long enough that no held slot is reclaimed during the flood.
        KeyedConfig::new(Config::new(1, Duration::from_secs(3_600))).max_keys(MAX_KEYS),
        |request: &u64| *request,
    );
    let keyed = layer.bulkhead();
    let mut service =
        ServiceBuilder::new()
            .layer(layer)
            .service(service_fn(|request: u64| async move {
                Ok::<_, BoxError>(request)
            }));

    // The runtime and the layer, before any key.
    let _ = service.ready().await.unwrap();
    let before_keys = live();
    // Ten keys hold a slot throughout.
    let held: Vec<_> = (0..10u64)
        .map(|key| keyed.try_acquire(&(u64::MAX - key)).unwrap())
        .collect();
    let mut baseline = 0;
    for key in 0..KEYS {
        let answer = service.ready().await.unwrap().call(key).await.unwrap();
        assert_eq!(answer, key);
        if key == 10 * MAX_KEYS as u64 {
            // Full of keys, evicting for a while: the memory from here on.
            baseline = live();
        }
    }
    let after = live();
    let per_key = (baseline - before_keys) / MAX_KEYS;
    eprintln!(
        "live bytes after {} keys: {baseline}; after {KEYS}: {after}; {per_key} a key",
        10 * MAX_KEYS
    );
    // A key, everything included (its place in the map, its bulkhead, its
    // line), in at most 1 KiB; with feature `metrics`, its bulkhead also
    // keeps the handles of its series (which record nothing, unless the
    // key is one to report).
    let most = if cfg!(feature = "metrics") {
        1_600
    } else {
        1_024
    };
    assert!(per_key <= most, "{per_key} bytes a key, over {most}");
    assert!(
        after <= baseline + baseline / 10,
        "memory grew from {baseline} to {after} bytes"
    );
    let status = keyed.status(20);
    assert_eq!(status.keys, MAX_KEYS);
    assert_eq!(status.evicted, KEYS + 10 - MAX_KEYS as u64);
    // The held keys are still held, each at its limit of one.
    for key in 0..10u64 {
        let error = service
            .ready()
            .await
            .unwrap()
            .call(u64::MAX - key)
            .await
            .unwrap_err();
        let shed = error.downcast_ref::<ServiceSaturated>().unwrap();
        assert_eq!(shed.reason(), ShedReason::LimitReached);
    }
    assert_eq!(status.busiest.len(), 10);

    // Every key held busy: a new key is shed, for too many keys.
    let busy: Vec<_> = (0..MAX_KEYS as u64 - 10)
        .map(|key| keyed.try_acquire(&(KEYS + key)).unwrap())
        .collect();
    let error = service.oneshot(2 * KEYS).await.unwrap_err();
    let shed = error.downcast_ref::<ServiceSaturated>().unwrap();
    assert_eq!(shed.reason(), ShedReason::TooManyKeys);
    assert_eq!(keyed.keys(), MAX_KEYS);
    drop((held, busy));
}

/// A hundred keys, each called once a minute for a day (a manual clock):
/// a key reports its totals alone, so it keeps no history of minutes, and
/// its memory is what it was when it was made.
#[test]
fn keys_called_for_a_day_take_no_more_memory_than_new_ones() {
    const MANY: u32 = 100;
    let clock = ManualClock::new();
    let keyed: KeyedBulkhead<u32> = KeyedBulkhead::new(
        KeyedConfig::new(Config::new(4, Duration::from_secs(30)).clock(clock.clone()))
            .max_keys(MANY as usize),
    );
    for key in 0..MANY {
        drop(keyed.try_acquire(&key).unwrap());
    }
    let made = live();
    for _minute in 0..24 * 60 + 60 {
        clock.advance(Duration::from_secs(60));
        for key in 0..MANY {
            drop(keyed.try_acquire(&key).unwrap());
        }
    }
    let after_a_day = live();
    assert!(
        after_a_day <= made + MANY as usize * 64,
        "{MANY} keys grew from {made} to {after_a_day} bytes in a day"
    );
    assert_eq!(keyed.status(1).busiest.len(), 0);
}
