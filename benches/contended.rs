//! `try_acquire` + drop from two OS threads at once on one shared bulkhead
//! (limit 25), next to the same on one shared `tokio::sync::Semaphore` (25
//! permits), owned and borrowed on both sides (`try_acquire_owned` clones
//! an `Arc`, as a bulkhead `Permit` does; `try_acquire_borrowed` does not,
//! as tokio's `try_acquire` does not).
//!
//! Each measurement of `iters` iterations splits them between two threads
//! that start together at a barrier; the time is from the first thread's
//! start to the last thread's end. The reported time per iteration is thus
//! that wall time divided by the acquire + release cycles done by both
//! threads together: the inverse of the aggregate throughput (lower is
//! better; with perfect scaling it would be half the single-threaded
//! `fast_path` figure, with no scaling at all the same as it).
//!
//! `contended_shed` does the same with both threads shedding;
//! `contended_layer` makes round trips through each thread's clone of one
//! service behind this crate's layer, and behind tower's
//! `ConcurrencyLimit`.
//!
//! Run with `cargo bench --bench contended`.

mod support;

use criterion::{black_box, criterion_main, Criterion};
use futures_util::FutureExt;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};
use support::{round_trip, Echo};
use tokio::sync::Semaphore;
use tower::limit::ConcurrencyLimitLayer;
use tower::{Layer, Service};
use tower_inflight::{Bulkhead, ConcurrencyLayer, Config};

const LIMIT: usize = 25;
const THREADS: u64 = 2;

/// Runs `op` `iters` times in all, split over `THREADS` threads started
/// together, and returns the wall time from the first start to the last end.
fn run_threads<F>(iters: u64, op: F) -> Duration
where
    F: Fn() + Sync,
{
    run_threads_with(iters, || (), |()| op())
}

/// [`run_threads`] with a state of each thread's own, made by `each` as
/// the thread starts: a clone of a service, whose `call` takes `&mut self`.
fn run_threads_with<T, F>(iters: u64, each: impl Fn() -> T + Sync, op: F) -> Duration
where
    F: Fn(&mut T) + Sync,
{
    let barrier = Barrier::new(THREADS as usize);
    let spans: Vec<(Instant, Instant)> = thread::scope(|scope| {
        let workers: Vec<_> = (0..THREADS)
            .map(|thread| {
                let share = iters / THREADS + u64::from(thread < iters % THREADS);
                let (barrier, each, op) = (&barrier, &each, &op);
                scope.spawn(move || {
                    let mut state = each();
                    barrier.wait();
                    let start = Instant::now();
                    for _ in 0..share {
                        op(&mut state);
                    }
                    (start, Instant::now())
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|worker| worker.join().expect("a worker panicked"))
            .collect()
    });
    let start = spans.iter().map(|span| span.0).min().expect("two spans");
    let end = spans.iter().map(|span| span.1).max().expect("two spans");
    end - start
}

fn contended(c: &mut Criterion) {
    let mut group = c.benchmark_group("contended");

    let ours = Bulkhead::new(Config::new(LIMIT, Duration::from_secs(30)));
    group.bench_function("ours", |b| {
        b.iter_custom(|iters| {
            run_threads(iters, || {
                let permit = black_box(&ours).try_acquire();
                black_box(permit.is_ok());
            })
        })
    });

    group.bench_function("ours_borrowed", |b| {
        b.iter_custom(|iters| {
            run_threads(iters, || {
                let permit = black_box(&ours).try_acquire_borrowed();
                black_box(permit.is_ok());
            })
        })
    });

    let semaphore = Semaphore::new(LIMIT);
    group.bench_function("tokio_semaphore", |b| {
        b.iter_custom(|iters| {
            run_threads(iters, || {
                let permit = black_box(&semaphore).try_acquire();
                black_box(permit.is_ok());
            })
        })
    });

    let owned = Arc::new(Semaphore::new(LIMIT));
    group.bench_function("tokio_semaphore_owned", |b| {
        b.iter_custom(|iters| {
            run_threads(iters, || {
                let permit = black_box(&owned).clone().try_acquire_owned();
                black_box(permit.is_ok());
            })
        })
    });

    group.finish();
}

/// Overload: both threads shed, from a full bulkhead (named, as a service's
/// would be) and from a semaphore with no permit left.
fn contended_shed(c: &mut Criterion) {
    let mut group = c.benchmark_group("contended_shed");

    let ours = Bulkhead::new(Config::new(LIMIT, Duration::from_secs(30)).name("payments"));
    let _held: Vec<_> = (0..LIMIT).map(|_| ours.try_acquire().unwrap()).collect();
    group.bench_function("ours", |b| {
        b.iter_custom(|iters| {
            run_threads(iters, || {
                black_box(black_box(&ours).try_acquire_borrowed().is_err());
            })
        })
    });

    let semaphore = Semaphore::new(LIMIT);
    let _all = semaphore.try_acquire_many(LIMIT as u32).unwrap();
    group.bench_function("tokio_semaphore", |b| {
        b.iter_custom(|iters| {
            run_threads(iters, || {
                black_box(black_box(&semaphore).try_acquire().is_err());
            })
        })
    });

    group.finish();
}

/// A `ready` + `call` round trip through each thread's clone of one
/// layered service, polled once with a no-op waker (no runtime): this
/// crate's layer beside tower's `ConcurrencyLimit`, whose clones share one
/// semaphore.
fn contended_layer(c: &mut Criterion) {
    let mut group = c.benchmark_group("contended_layer");
    fn once<S: Service<u64, Response = u64>>(service: &mut S)
    where
        S::Error: std::fmt::Debug,
    {
        let response = round_trip(service, 1).now_or_never();
        black_box(response.expect("an always-ready round trip completes in one poll"));
    }
    let ours = ConcurrencyLayer::new(Config::new(LIMIT, Duration::from_secs(30))).layer(Echo);
    group.bench_function("ours", |b| {
        b.iter_custom(|iters| run_threads_with(iters, || ours.clone(), once))
    });
    let tower = ConcurrencyLimitLayer::new(LIMIT).layer(Echo);
    group.bench_function("tower_concurrency_limit", |b| {
        b.iter_custom(|iters| run_threads_with(iters, || tower.clone(), once))
    });
    group.finish();
}

// What `criterion_group!` expands to, written out because the macro's
// `pub fn` trips the crate's `missing_docs` lint.
fn benches() {
    let mut criterion = support::criterion(Duration::from_secs(3));
    contended(&mut criterion);
    contended_shed(&mut criterion);
    contended_layer(&mut criterion);
}

criterion_main!(benches);
