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
//!   current-thread runtime (time driver enabled), one `block_on` per turn
//!   of round trips, so that all are compared alike.
//! * `layer_round_trip_no_runtime`: the same minus `tower-resilience-bulkhead`,
//!   each round trip polled once with a no-op waker
//!   (`FutureExt::now_or_never`): no runtime at all, a cross-check that the
//!   runtime context changes nothing for these four; and
//!   `ConcurrencyLayer::classify` with a classifier that gives every request
//!   the default ticket (`ours_classified`), what a classifier costs beside
//!   `ours`.
//! * Within each group the variants are measured in turns of 1,000 round
//!   trips, each timing only its own turns (`support::interleaved`), so
//!   that drift on a shared machine falls on all alike.
//!
//! Run with `CARGO_TARGET_DIR=/work/target-bench cargo bench --bench layer`.

mod support;

use criterion::{black_box, criterion_main, Criterion};
use futures_util::FutureExt;
use std::cell::RefCell;
use std::fmt::Debug;
use std::time::Duration;
use support::{interleaved, round_trip, Echo, Turn};
use tower::limit::{ConcurrencyLimitLayer, GlobalConcurrencyLimitLayer};
use tower::{Layer, Service};
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

/// `calls` round trips through `service`, in one `block_on` of `runtime`:
/// the runtime's entry cost (~150-200 ns here, and noisy) is paid once a
/// turn of 1,000 round trips, alike for every variant.
///
/// The turn runs `unconstrained`. Otherwise Tokio's cooperative budget
/// (128 budgeted polls a task poll) runs out every 128 round trips, and then
/// `tower-resilience-bulkhead`'s `acquire_owned()` (budgeted, unlike the
/// `try_acquire` fast paths of the others) returns `Pending` although a
/// permit is free, forcing a park and wake of the runtime: measured at about
/// +200 ns a call amortised (~565 ns instead of ~350 ns) here. A task serving
/// one request a poll never runs out of budget, so that cost is an artefact
/// of the tight loop.
fn on_runtime<'a, S>(runtime: &'a tokio::runtime::Runtime, service: S) -> impl Fn(u64) + 'a
where
    S: Service<u64, Response = u64> + 'a,
    S::Error: Debug,
{
    let service = RefCell::new(service);
    move |calls| {
        let mut service = service.borrow_mut();
        runtime.block_on(tokio::task::unconstrained(async {
            for _ in 0..calls {
                black_box(round_trip(&mut *service, black_box(7)).await);
            }
        }))
    }
}

/// `calls` round trips through `service`, each polled once with a no-op
/// waker: everything here is ready at once, so no runtime is needed.
fn without_runtime<S>(service: S) -> impl Fn(u64)
where
    S: Service<u64, Response = u64>,
    S::Error: Debug,
{
    let service = RefCell::new(service);
    move |calls| {
        let mut service = service.borrow_mut();
        for _ in 0..calls {
            black_box(
                round_trip(&mut *service, black_box(7))
                    .now_or_never()
                    .expect("an always-ready round trip completes in one poll"),
            );
        }
    }
}

/// Measures each of `variants` in turns with all the others.
fn in_turns(c: &mut Criterion, group: &str, variants: &[(&str, Turn<'_>)]) {
    let mut group = c.benchmark_group(group);
    let turns: Vec<Turn<'_>> = variants.iter().map(|(_, turn)| *turn).collect();
    for (mine, (name, _)) in variants.iter().enumerate() {
        group.bench_function(*name, |b| {
            b.iter_custom(|iters| interleaved(iters, &turns, mine))
        });
    }
    group.finish();
}

fn layer_round_trip(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a current-thread runtime");
    let raw = on_runtime(&runtime, Echo);
    let ours = on_runtime(&runtime, ours().layer(Echo));
    let tower = on_runtime(&runtime, ConcurrencyLimitLayer::new(LIMIT).layer(Echo));
    let tower_global = on_runtime(
        &runtime,
        GlobalConcurrencyLimitLayer::new(LIMIT).layer(Echo),
    );
    let resilience = on_runtime(&runtime, resilience().layer(Echo));
    in_turns(
        c,
        "layer_round_trip",
        &[
            ("raw", &raw),
            ("ours", &ours),
            ("tower_concurrency_limit", &tower),
            ("tower_global_concurrency_limit", &tower_global),
            ("tower_resilience_bulkhead", &resilience),
        ],
    );
}

fn layer_round_trip_no_runtime(c: &mut Criterion) {
    let raw = without_runtime(Echo);
    let ours_plain = without_runtime(ours().layer(Echo));
    let ours_classified = without_runtime(ours().classify(|_: &u64| Ticket::new()).layer(Echo));
    let tower = without_runtime(ConcurrencyLimitLayer::new(LIMIT).layer(Echo));
    let tower_global = without_runtime(GlobalConcurrencyLimitLayer::new(LIMIT).layer(Echo));
    in_turns(
        c,
        "layer_round_trip_no_runtime",
        &[
            ("raw", &raw),
            ("ours", &ours_plain),
            ("ours_classified", &ours_classified),
            ("tower_concurrency_limit", &tower),
            ("tower_global_concurrency_limit", &tower_global),
        ],
    );
}

// What `criterion_group!` expands to, written out because the macro's
// `pub fn` trips the crate's `missing_docs` lint.
fn benches() {
    let mut criterion = support::criterion(Duration::from_secs(2));
    layer_round_trip(&mut criterion);
    layer_round_trip_no_runtime(&mut criterion);
}

criterion_main!(benches);
