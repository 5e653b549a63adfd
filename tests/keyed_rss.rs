//! Keys that come and go cost the process about what they hold: resident
//! memory grows by at most one and a half times the live heap while a
//! keyed bulkhead's keys churn. An allocation aligned to a cache line costs
//! glibc's allocator about twice its size in resident memory once such
//! allocations are freed and made again, so nothing a key allocates is
//! aligned over 16 bytes: asserted as such, whatever the allocator, and
//! measured in resident memory on glibc.
//!
//! One test in its own binary: resident memory is the whole process's, and
//! no other test may allocate meanwhile.

#![cfg(all(target_os = "linux", target_env = "gnu"))]
// A counting global allocator is an `unsafe impl`; the library itself
// forbids `unsafe`.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};
use std::time::Duration;
use tower_inflight::keyed::{KeyedBulkhead, KeyedConfig};
use tower_inflight::Config;

/// Counts the bytes allocated and not freed, process-wide.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

/// The largest alignment asked for since it was last set to 0.
static MOST_ALIGNED: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed on to the system allocator unchanged; the
// counter only observes sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        MOST_ALIGNED.fetch_max(layout.align(), Ordering::Relaxed);
        System.alloc(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Anonymous resident memory of the process (the heap's, not the code's),
/// in bytes.
fn resident() -> isize {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kib: isize = status
        .lines()
        .find_map(|line| line.strip_prefix("RssAnon:"))
        .and_then(|field| field.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("RssAnon in /proc/self/status");
    kib * 1024
}

const MAX_KEYS: usize = 10_000;

#[test]
fn churning_keys_keep_resident_memory_within_one_and_a_half_times_the_heap() {
    let (resident_before, live_before) = (resident(), LIVE.load(Ordering::Relaxed));
    let keyed: KeyedBulkhead<u64> = KeyedBulkhead::new(
        KeyedConfig::new(Config::new(4, Duration::from_secs(3_600))).max_keys(MAX_KEYS),
    );
    // From here on, what the keys allocate (the keyed bulkhead's shards,
    // made once, are aligned to cache lines of their own).
    MOST_ALIGNED.store(0, Ordering::Relaxed);
    // Ten rounds of keys never seen before: half of each round's keys
    // hold a slot until the round ends, so every round evicts idle keys
    // for new ones while others stay.
    for round in 0..10_u64 {
        let mut held = Vec::with_capacity(MAX_KEYS / 2);
        for key in 0..MAX_KEYS as u64 {
            let permit = keyed.try_acquire(&(round << 32 | key));
            if key % 2 == 0 {
                held.push(permit.expect("a key of its own, with room"));
            }
        }
    }
    assert_eq!(keyed.keys(), MAX_KEYS);
    let most_aligned = MOST_ALIGNED.load(Ordering::Relaxed);
    assert!(
        most_aligned <= 16,
        "a key allocated memory aligned to {most_aligned}"
    );
    let heap = LIVE.load(Ordering::Relaxed) - live_before;
    let grown = resident() - resident_before;
    assert!(
        grown * 2 <= heap * 3,
        "resident memory grew by {grown} bytes for a live heap of {heap}"
    );
}
