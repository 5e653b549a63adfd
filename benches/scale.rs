//! What the bulkhead's paths cost as `limit` grows, beside
//! `tokio::sync::Semaphore` of as many permits, at limits 8, 1,024, 65,536
//! and 1,048,576:
//!
//! * `shed_full`: `try_acquire_borrowed` on a full table (every slot held),
//!   against `try_acquire` on a semaphore with no permit left.
//! * `claim_drop_one_free`: every slot held but one; take it and give it
//!   back, against the same on a semaphore with one permit left.
//! * `in_flight`: `in_flight()` on a full table, against
//!   `available_permits()`.
//!
//! Before the measurements it prints the bytes each bulkhead allocates per
//! slot, counted by a counting allocator.
//!
//! Run with `CARGO_TARGET_DIR=/work/target-bench cargo bench --bench scale`.

// A counting global allocator is an `unsafe impl`; the library itself
// forbids `unsafe`.
#![allow(unsafe_code)]

use criterion::{black_box, criterion_main, BenchmarkId, Criterion};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::Semaphore;
use tower_inflight::{Bulkhead, Config, Permit};

const LIMITS: [usize; 4] = [8, 1024, 65_536, 1 << 20];
const RECLAIM_AFTER: Duration = Duration::from_secs(60);

/// Counts the bytes allocated and not yet freed.
struct Counting;

static ALLOCATED: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed on to the system allocator unchanged; the
// counter only observes sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATED.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        ALLOCATED.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn bulkhead(limit: usize) -> Bulkhead {
    Bulkhead::new(Config::new(limit, RECLAIM_AFTER))
}

/// A bulkhead with every slot held, and the permits that hold them.
fn full(limit: usize) -> (Bulkhead, Vec<Permit>) {
    let bulkhead = bulkhead(limit);
    let permits: Vec<_> = (0..limit)
        .map(|_| bulkhead.try_acquire().expect("a free slot"))
        .collect();
    assert!(bulkhead.try_acquire().is_err());
    (bulkhead, permits)
}

fn memory() {
    for limit in LIMITS {
        let before = ALLOCATED.load(Ordering::Relaxed);
        let bulkhead = bulkhead(limit);
        let ours = ALLOCATED.load(Ordering::Relaxed) - before;
        let before = ALLOCATED.load(Ordering::Relaxed);
        let semaphore = Semaphore::new(limit);
        let theirs = ALLOCATED.load(Ordering::Relaxed) - before + std::mem::size_of_val(&semaphore);
        println!(
            "memory at limit {limit}: bulkhead {:.1} bytes a slot ({ours} bytes), tokio Semaphore {theirs} bytes",
            ours as f64 / limit as f64
        );
        drop(bulkhead);
    }
}

/// Group `name`: at each limit, `ours` on a bulkhead with every slot held
/// but `free`, beside `theirs` on a semaphore with as many permits left.
fn side_by_side(
    c: &mut Criterion,
    name: &str,
    free: usize,
    ours: impl Fn(&Bulkhead),
    theirs: impl Fn(&Semaphore),
) {
    let mut group = c.benchmark_group(name);
    for limit in LIMITS {
        let (bulkhead, mut held) = full(limit);
        // Given back from the middle of the table, not the last claimed.
        held.drain(limit / 2..limit / 2 + free);
        group.bench_with_input(BenchmarkId::new("ours", limit), &bulkhead, |b, bulkhead| {
            b.iter(|| ours(bulkhead))
        });
        assert_eq!(bulkhead.available(), free, "the free slots stay free");
        let semaphore = Semaphore::new(limit);
        let _taken = semaphore.try_acquire_many((limit - free) as u32).unwrap();
        group.bench_with_input(
            BenchmarkId::new("tokio_semaphore", limit),
            &semaphore,
            |b, semaphore| b.iter(|| theirs(semaphore)),
        );
    }
    group.finish();
}

/// `try_acquire` and a drop with `free` slots free: a shed from a full
/// table with none, a claim of the last free slot with one.
fn try_acquire(c: &mut Criterion, name: &str, free: usize) {
    side_by_side(
        c,
        name,
        free,
        |ours| {
            black_box(ours.try_acquire_borrowed().is_ok());
        },
        |theirs| {
            black_box(theirs.try_acquire().is_ok());
        },
    );
}

fn in_flight(c: &mut Criterion) {
    side_by_side(
        c,
        "in_flight",
        0,
        |ours| {
            black_box(ours.in_flight());
        },
        |theirs| {
            black_box(theirs.available_permits());
        },
    );
}

fn benches() {
    memory();
    let mut criterion = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args();
    try_acquire(&mut criterion, "shed_full", 0);
    try_acquire(&mut criterion, "claim_drop_one_free", 1);
    in_flight(&mut criterion);
}

criterion_main!(benches);
