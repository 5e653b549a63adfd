//! A dependency slows from 20 ms to 1 s a call, under a steady 200 calls/s.
//!
//! Without a limit, callers pile up inside the process: every one of them is
//! parked in the slow call, holding whatever it carried. Behind a bulkhead of
//! 8 slots, at most 8 are ever inside; the rest are shed in microseconds with
//! `ServiceSaturated` and can be answered with a 503 at once.
//!
//! ```text
//! cargo run --release --example slow_dependency
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower::{service_fn, BoxError, Service, ServiceBuilder, ServiceExt};
use tower_inflight::{ConcurrencyLayer, Config, ServiceSaturated};

const RATE_PER_SEC: u64 = 200;
const RUN: Duration = Duration::from_secs(3);
const SLOW_FROM: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Counters {
    inside: AtomicUsize,
    peak_inside: AtomicUsize,
    ok: AtomicUsize,
    shed: AtomicUsize,
}

#[tokio::main]
async fn main() {
    println!("a dependency slows from 20 ms to 1 s at t = 1 s; {RATE_PER_SEC} calls/s offered\n");
    let unlimited = run(None).await;
    let limited = run(Some(8)).await;
    println!(
        "\npeak calls inside the dependency: {} without a limit, {} behind the bulkhead",
        unlimited, limited
    );
}

/// Runs the load against the dependency, behind a bulkhead of `limit` slots
/// if one is given, printing a timeline; returns the peak concurrency seen.
async fn run(limit: Option<usize>) -> usize {
    let counters = Arc::new(Counters::default());
    let started = tokio::time::Instant::now();
    let dependency = {
        let counters = counters.clone();
        service_fn(move |_: ()| {
            let counters = counters.clone();
            async move {
                let inside = counters.inside.fetch_add(1, Ordering::SeqCst) + 1;
                counters.peak_inside.fetch_max(inside, Ordering::SeqCst);
                let slow = started.elapsed() >= SLOW_FROM;
                let took = if slow { 1000 } else { 20 };
                tokio::time::sleep(Duration::from_millis(took)).await;
                counters.inside.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, BoxError>(())
            }
        })
    };
    let service = ServiceBuilder::new()
        .option_layer(limit.map(|limit| {
            ConcurrencyLayer::new(Config::new(limit, Duration::from_secs(10)).name("dependency"))
        }))
        .service(dependency)
        .map_err(Into::<BoxError>::into)
        .boxed_clone();

    match limit {
        Some(limit) => println!("behind a bulkhead of {limit} slots:"),
        None => println!("no limit:"),
    }
    println!(
        "{:>6}  {:>7}  {:>7}  {:>7}",
        "t (s)", "inside", "ok", "shed"
    );
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / RATE_PER_SEC));
    let mut report = tokio::time::interval(Duration::from_millis(500));
    let mut calls = tokio::task::JoinSet::new();
    while started.elapsed() < RUN {
        tokio::select! {
            _ = tick.tick() => {
                let mut service = service.clone();
                let counters = counters.clone();
                calls.spawn(async move {
                    let outcome = match service.ready().await {
                        Ok(ready) => ready.call(()).await,
                        Err(error) => Err(error),
                    };
                    match outcome {
                        Ok(()) => counters.ok.fetch_add(1, Ordering::SeqCst),
                        Err(error) if error.is::<ServiceSaturated>() => {
                            counters.shed.fetch_add(1, Ordering::SeqCst)
                        }
                        Err(error) => panic!("the dependency failed: {error}"),
                    };
                });
            }
            _ = report.tick() => println!(
                "{:>6.1}  {:>7}  {:>7}  {:>7}",
                started.elapsed().as_secs_f64(),
                counters.inside.load(Ordering::SeqCst),
                counters.ok.load(Ordering::SeqCst),
                counters.shed.load(Ordering::SeqCst),
            ),
        }
    }
    calls.shutdown().await;
    counters.peak_inside.load(Ordering::SeqCst)
}
