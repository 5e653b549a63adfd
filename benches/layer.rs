//! One `ready().await` + `call().await` round trip through a concurrency
//! limiting layer, on an inner service that is always ready and answers at
//! once, so what is measured is the layer's own overhead.
//!
//! * `layer_round_trip`: no layer (`raw`), `tower_inflight::ConcurrencyLayer`
//!   (limit 25), tower's `ConcurrencyLimitLayer::new(25)` and
//!   `GlobalConcurrencyLimitLayer::new(25)`, and `tower-resilience-bulkhead`
//!   (25 concurrent calls, `reject_when_full`). That last one times its
//!   permit acquisition with `tokio::time::timeout(Duration::ZERO, ..)`,
//!   which panics outside a Tokio runtime, so **every** variant of this group
//!   is driven by one current-thread runtime's `block_on` (time driver
//!   enabled), so that all of them pay the same runtime entry cost.
//! * `layer_round_trip_no_runtime`: the same minus `tower-resilience-bulkhead`,
//!   each round trip polled once with a no-op waker
//!   (`FutureExt::now_or_never`), which shows the layers' differences
//!   without the runtime's overhead on top.
//!
//! Run with `CARGO_TARGET_DIR=/work/target-bench cargo bench --bench layer`.

use criterion::{black_box, criterion_group, criterion_main, BenchmarkGroup, Criterion};
use futures_util::FutureExt;
use std::convert::Infallible;
use std::fmt::Debug;
use std::future::{ready, Ready};
use std::task::{Context, Poll};
use std::time::Duration;
use tower::limit::{ConcurrencyLimitLayer, GlobalConcurrencyLimitLayer};
use tower::{Layer, Service, ServiceExt};
use tower_inflight::{ConcurrencyLayer, Config};
use tower_resilience_bulkhead::BulkheadLayer;

const LIMIT: usize = 25;

/// The inner service: always ready, answers with its request at once.
#[derive(Clone, Copy, Debug)]
struct Echo;

impl Service<u64> for Echo {
    type Response = u64;
    type Error = Infallible;
    type Future = Ready<Result<u64, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: u64) -> Self::Future {
        ready(Ok(request))
    }
}

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

/// Benchmarks `service` in `group`, each round trip driven by `block_on` on a
/// current-thread runtime.
fn on_runtime<S>(
    group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>,
    runtime: &tokio::runtime::Runtime,
    name: &str,
    mut service: S,
) where
    S: Service<u64, Response = u64>,
    S::Error: Debug,
{
    group.bench_function(name, |b| {
        b.iter(|| runtime.block_on(round_trip(&mut service, black_box(7))))
    });
}

/// Benchmarks `service` in `group`, each round trip polled once with a no-op
/// waker: everything here is ready at once, so no runtime is needed.
fn without_runtime<S>(
    group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    mut service: S,
) where
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

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30)
}

criterion_group! {
    name = benches;
    config = config();
    targets = layer_round_trip, layer_round_trip_no_runtime
}
criterion_main!(benches);
