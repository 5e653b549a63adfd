//! The single-threaded fast path of a bulkhead, next to `tokio::sync::Semaphore`.
//!
//! * `try_acquire_drop`: take a slot and give it back at once, on an idle
//!   bulkhead (limit 25) and an idle semaphore (25 permits). `Bulkhead`
//!   permits own an `Arc` of the bulkhead, so the semaphore is measured both
//!   borrowed (`try_acquire`) and owned (`try_acquire_owned`, which also
//!   clones an `Arc`).
//!   `ours_borrowed_without_clock_read` is the borrowed path on a manual
//!   clock (one relaxed load): the fast path without its coarse clock read.
//!   The five are measured in turns of 1,000 calls, each timing only its
//!   own turns (`support::interleaved`), so that drift on a shared machine
//!   falls on all alike rather than on whichever criterion happens to run
//!   later.
//! * `shed`: `try_acquire` when every slot / permit is held (the `Err` path).
//! * `scheduling_unused`: the plain bulkhead's `try_acquire` + drop beside
//!   the same on a bulkhead configured with a priority order, a wait budget
//!   and the saturation signal, and beside `try_acquire_weighted(1)`: what
//!   scheduling costs calls that do not use it, measured in turns too.
//! * `adaptive`: `try_acquire`, the outcome recorded and the permit dropped,
//!   on a bulkhead with the default adaptive limit beside a static one, in
//!   turns: what an adaptive limit costs a call.
//! * `clock`: `std::time::Instant::now()` against the coarse clock the
//!   bulkhead reads on every acquire, the reason `coarsetime` is a dependency.
//!
//! Run with `CARGO_TARGET_DIR=/work/target-bench cargo bench --bench fast_path`.

mod support;

use criterion::{black_box, criterion_main, Criterion};
use std::sync::Arc;
use std::time::Duration;
use support::{each, interleaved, Turn};
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
    // What the coarse clock read costs the fast path: a manual clock is one
    // relaxed load, so this is the fast path as it would be without the
    // read (the most that dating slots lazily could save).
    let unclocked =
        Bulkhead::new(Config::new(LIMIT, RECLAIM_AFTER).clock(tower_inflight::ManualClock::new()));
    let semaphore = Semaphore::new(LIMIT);
    let owned = Arc::new(Semaphore::new(LIMIT));

    let ours_owned = each(|| {
        black_box(black_box(&ours).try_acquire().is_ok());
    });
    let ours_borrowed = each(|| {
        black_box(black_box(&ours).try_acquire_borrowed().is_ok());
    });
    let ours_unclocked = each(|| {
        black_box(black_box(&unclocked).try_acquire_borrowed().is_ok());
    });
    let tokio_borrowed = each(|| {
        black_box(black_box(&semaphore).try_acquire().is_ok());
    });
    let tokio_owned = each(|| {
        black_box(black_box(&owned).clone().try_acquire_owned().is_ok());
    });
    let turns: [Turn<'_>; 5] = [
        &ours_owned,
        &ours_borrowed,
        &ours_unclocked,
        &tokio_borrowed,
        &tokio_owned,
    ];
    let names = [
        "ours",
        "ours_borrowed",
        "ours_borrowed_without_clock_read",
        "tokio_semaphore",
        "tokio_semaphore_owned",
    ];
    for (mine, name) in names.into_iter().enumerate() {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| interleaved(iters, &turns, mine))
        });
    }
    group.finish();
}

fn scheduling_unused(c: &mut Criterion) {
    let mut group = c.benchmark_group("scheduling_unused");
    let plain = bulkhead();
    let scheduled = Bulkhead::new(
        Config::new(LIMIT, RECLAIM_AFTER)
            .wait(Duration::from_millis(50))
            .queue_order(QueueOrder::PriorityFifo)
            .saturation_signal(0.8, 20, Duration::from_secs(10)),
    );
    // Each takes a slot and drops it at once, as `try_acquire_drop` does.
    let plain_calls = each(|| {
        black_box(black_box(&plain).try_acquire().is_ok());
    });
    let scheduled_calls = each(|| {
        black_box(black_box(&scheduled).try_acquire().is_ok());
    });
    let weight_one_calls = each(|| {
        black_box(black_box(&plain).try_acquire_weighted(1).is_ok());
    });
    let turns: [Turn<'_>; 3] = [&plain_calls, &scheduled_calls, &weight_one_calls];
    for (mine, name) in ["plain", "priorities_and_signal_configured", "weighted_1"]
        .into_iter()
        .enumerate()
    {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| interleaved(iters, &turns, mine))
        });
    }
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

fn adaptive(c: &mut Criterion) {
    use tower_inflight::adaptive::{Adaptive, Outcome};
    let mut group = c.benchmark_group("adaptive");
    let fixed = bulkhead();
    let moving = Bulkhead::new(Config::new(LIMIT, RECLAIM_AFTER).adaptive(Adaptive::default()));
    let call = |bulkhead: &Bulkhead| {
        if let Ok(mut permit) = black_box(bulkhead).try_acquire() {
            permit.record(Outcome::Success);
        }
    };
    let fixed_calls = each(|| call(&fixed));
    let moving_calls = each(|| call(&moving));
    let turns: [Turn<'_>; 2] = [&fixed_calls, &moving_calls];
    for (mine, name) in ["static", "adaptive_default"].into_iter().enumerate() {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| interleaved(iters, &turns, mine))
        });
    }
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
    scheduling_unused(&mut criterion);
    shed(&mut criterion);
    adaptive(&mut criterion);
    clock(&mut criterion);
}

criterion_main!(benches);
