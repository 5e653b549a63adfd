//! The single-threaded fast path of a bulkhead, next to `tokio::sync::Semaphore`.
//!
//! * `try_acquire_drop`: take a slot and give it back at once, on an idle
//!   bulkhead (limit 25) and an idle semaphore (25 permits). `Bulkhead`
//!   permits own an `Arc` of the bulkhead, so the semaphore is measured both
//!   borrowed (`try_acquire`) and owned (`try_acquire_owned`, which also
//!   clones an `Arc`).
//! * `shed`: `try_acquire` when every slot / permit is held (the `Err` path).
//! * `clock`: `std::time::Instant::now()` against the coarse clock the
//!   bulkhead reads on every acquire, the reason `coarsetime` is a dependency.
//!
//! Run with `CARGO_TARGET_DIR=/work/target-bench cargo bench --bench fast_path`.

mod support;

use criterion::{black_box, criterion_main, Criterion};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tower_inflight::{Bulkhead, Config, QueueOrder};

const LIMIT: usize = 25;
const RECLAIM_AFTER: Duration = Duration::from_secs(30);

fn bulkhead() -> Bulkhead {
    Bulkhead::new(Config::new(LIMIT, RECLAIM_AFTER))
}

fn try_acquire_drop(c: &mut Criterion) {
    let mut group = c.benchmark_group("try_acquire_drop");

    let ours = bulkhead();
    group.bench_function("ours", |b| {
        b.iter(|| {
            let permit = black_box(&ours).try_acquire();
            black_box(permit.is_ok());
        })
    });

    // The scheduling options only order the line of waiting callers: with
    // nobody waiting they must cost the fast path nothing.
    let scheduled = Bulkhead::new(
        Config::new(LIMIT, Duration::from_secs(30))
            .wait(Duration::from_millis(50))
            .queue_order(QueueOrder::PriorityFifo)
            .saturation_signal(0.8, 20, Duration::from_secs(10)),
    );
    group.bench_function("ours_with_priorities_and_signal", |b| {
        b.iter(|| {
            let permit = black_box(&scheduled).try_acquire();
            black_box(permit.is_ok());
        })
    });

    let semaphore = Semaphore::new(LIMIT);
    group.bench_function("tokio_semaphore", |b| {
        b.iter(|| {
            let permit = black_box(&semaphore).try_acquire();
            black_box(permit.is_ok());
        })
    });

    let owned = Arc::new(Semaphore::new(LIMIT));
    group.bench_function("tokio_semaphore_owned", |b| {
        b.iter(|| {
            let permit = black_box(&owned).clone().try_acquire_owned();
            black_box(permit.is_ok());
        })
    });

    group.finish();
}

fn shed(c: &mut Criterion) {
    let mut group = c.benchmark_group("shed");

    let ours = bulkhead();
    let _held: Vec<_> = (0..LIMIT).map(|_| ours.try_acquire().unwrap()).collect();
    assert!(ours.try_acquire().is_err());
    group.bench_function("ours", |b| {
        b.iter(|| {
            let shed = black_box(&ours).try_acquire();
            black_box(shed.is_err());
        })
    });

    let semaphore = Semaphore::new(LIMIT);
    let _all = semaphore.try_acquire_many(LIMIT as u32).unwrap();
    assert!(semaphore.try_acquire().is_err());
    group.bench_function("tokio_semaphore", |b| {
        b.iter(|| {
            let shed = black_box(&semaphore).try_acquire();
            black_box(shed.is_err());
        })
    });

    group.finish();
}

fn clock(c: &mut Criterion) {
    let mut group = c.benchmark_group("clock");
    group.bench_function("std_instant_now", |b| b.iter(std::time::Instant::now));
    group.bench_function("coarsetime_now_without_cache_update", |b| {
        b.iter(coarsetime::Instant::now_without_cache_update)
    });
    group.finish();
}

// What `criterion_group!` expands to, written out because the macro's
// `pub fn` trips the crate's `missing_docs` lint.
fn benches() {
    let mut criterion = support::criterion(Duration::from_secs(2));
    try_acquire_drop(&mut criterion);
    shed(&mut criterion);
    clock(&mut criterion);
}

criterion_main!(benches);
