//! One `ready().await` + `call().await` round trip through a concurrency
//! limiting layer, on an inner service that is always ready and answers at
//! once, so what is measured is the layer's own overhead.
//!
//! * `layer_round_trip`: no layer (`raw`), `tower_inflight::ConcurrencyLayer`
//!   (limit 25), tower's `ConcurrencyLimitLayer::new(25)` and
//!   `GlobalConcurrencyLimitLayer::new(25)`, and `tower-resilience-bulkhead`
//!   (25 concurrent calls, `reject_when_full`). That last one times its
//!   permit acquisition with `tokio::time::timeout(Duration::ZERO, ..)`,
//!   which panics outside a Tokio runtime (`Sleep::new_timeout` calls
//!   `Handle::current()`), so **every** variant of this group runs inside one
//!   current-thread runtime (time driver enabled), one `block_on` per
//!   criterion batch of round trips, so that all are compared alike.
//! * `layer_round_trip_no_runtime`: the same minus `tower-resilience-bulkhead`,
//!   each round trip polled once with a no-op waker
//!   (`FutureExt::now_or_never`): no runtime at all, a cross-check that the
//!   runtime context changes nothing for these four; and
//!   `ConcurrencyLayer::classify` with a classifier that gives every request
//!   the default ticket (`ours_classified`), what a classifier costs beside
//!   `ours`.
//!
//! Run with `CARGO_TARGET_DIR=/work/target-bench cargo bench --bench layer`.

mod support;

use criterion::measurement::WallTime;
use criterion::{black_box, criterion_main, BenchmarkGroup, Criterion};
use futures_util::FutureExt;
use std::fmt::Debug;
use std::time::{Duration, Instant};
use support::Echo;
use tower::limit::{ConcurrencyLimitLayer, GlobalConcurrencyLimitLayer};
use tower::{Layer, Service, ServiceExt};
use tower_inflight::{ConcurrencyLayer, Config, Ticket};
use tower_resilience_bulkhead::BulkheadLayer;

const LIMIT: usize = 25;

fn ours() -> ConcurrencyLayer {
    ConcurrencyLayer::new(Config::new(LIMIT, Duration::from_secs(30)))
}

fn resilience() -> BulkheadLayer {
    BulkheadLayer::builder()
        .max_concurrent_calls(LIMIT)
        .reject_when_full()
        .build()
        .expect("a valid tower-resilience-bulkhead config")
}

async fn round_trip<S>(service: &mut S, request: u64) -> u64
where
    S: Service<u64, Response = u64>,
    S::Error: Debug,
{
    service
        .ready()
        .await
        .expect("the inner service is always ready")
        .call(request)
        .await
        .expect("the limit is never reached")
}

/// Benchmarks `service` in `group` inside a current-thread runtime: each
/// criterion batch of round trips is one `block_on`, so the runtime's entry
/// cost (~150-200 ns here, and noisy) is paid once a batch, not once a call.
///
/// The batch runs `unconstrained`. Otherwise Tokio's cooperative budget
/// (128 budgeted polls a task poll) runs out every 128 round trips, and then
/// `tower-resilience-bulkhead`'s `acquire_owned()` (budgeted, unlike the
/// `try_acquire` fast paths of the others) returns `Pending` although a
/// permit is free, forcing a park and wake of the runtime: measured at about
/// +200 ns a call amortised (~565 ns instead of ~350 ns) here. A task serving
/// one request a poll never runs out of budget, so that cost is an artefact
/// of the tight loop.
fn on_runtime<S>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    runtime: &tokio::runtime::Runtime,
    name: &str,
    mut service: S,
) where
    S: Service<u64, Response = u64>,
    S::Error: Debug,
{
    group.bench_function(name, |b| {
        b.iter_custom(|iters| {
            runtime.block_on(tokio::task::unconstrained(async {
                let start = Instant::now();
                for _ in 0..iters {
                    black_box(round_trip(&mut service, black_box(7)).await);
                }
                start.elapsed()
            }))
        })
    });
}

/// Benchmarks `service` in `group`, each round trip polled once with a no-op
/// waker: everything here is ready at once, so no runtime is needed.
fn without_runtime<S>(group: &mut BenchmarkGroup<'_, WallTime>, name: &str, mut service: S)
where
    S: Service<u64, Response = u64>,
    S::Error: Debug,
{
    group.bench_function(name, |b| {
        b.iter(|| {
            round_trip(&mut service, black_box(7))
                .now_or_never()
                .expect("an always-ready round trip completes in one poll")
        })
    });
}

fn layer_round_trip(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a current-thread runtime");
    let mut group = c.benchmark_group("layer_round_trip");
    on_runtime(&mut group, &runtime, "raw", Echo);
    on_runtime(&mut group, &runtime, "ours", ours().layer(Echo));
    on_runtime(
        &mut group,
        &runtime,
        "tower_concurrency_limit",
        ConcurrencyLimitLayer::new(LIMIT).layer(Echo),
    );
    on_runtime(
        &mut group,
        &runtime,
        "tower_global_concurrency_limit",
        GlobalConcurrencyLimitLayer::new(LIMIT).layer(Echo),
    );
    on_runtime(
        &mut group,
        &runtime,
        "tower_resilience_bulkhead",
        resilience().layer(Echo),
    );
    group.finish();
}

fn layer_round_trip_no_runtime(c: &mut Criterion) {
    let mut group = c.benchmark_group("layer_round_trip_no_runtime");
    without_runtime(&mut group, "raw", Echo);
    without_runtime(&mut group, "ours", ours().layer(Echo));
    without_runtime(
        &mut group,
        "ours_classified",
        ours().classify(|_: &u64| Ticket::new()).layer(Echo),
    );
    without_runtime(
        &mut group,
        "tower_concurrency_limit",
        ConcurrencyLimitLayer::new(LIMIT).layer(Echo),
    );
    without_runtime(
        &mut group,
        "tower_global_concurrency_limit",
        GlobalConcurrencyLimitLayer::new(LIMIT).layer(Echo),
    );
    group.finish();
}

// What `criterion_group!` expands to, written out because the macro's
// `pub fn` trips the crate's `missing_docs` lint.
fn benches() {
    let mut criterion = support::criterion(Duration::from_secs(2));
    layer_round_trip(&mut criterion);
    layer_round_trip_no_runtime(&mut criterion);
}

criterion_main!(benches);
