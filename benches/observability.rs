//! What observing a bulkhead costs a call through the layer: no recorder
//! installed, a recorder installed (`metrics-util`'s debugging recorder,
//! which stores every sample), and an event hook that counts events, side by
//! side with the plain layer. Built with the `metrics` feature, so the
//! "no recorder" case is the facade's no-op handles.
//!
//! Run with `cargo bench --bench observability --features metrics`.

mod support;

use criterion::{black_box, criterion_main, Criterion};
use futures_util::FutureExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::Echo;
use tower::{Layer, Service, ServiceExt};
use tower_inflight::{ConcurrencyLayer, Config};

fn config() -> Config {
    Config::new(25, Duration::from_secs(30)).name("bench")
}

fn round_trips<S>(criterion: &mut Criterion, name: &str, mut service: S)
where
    S: Service<u64, Response = u64>,
    S::Error: std::fmt::Debug,
{
    criterion.bench_function(&format!("observability/{name}"), |b| {
        b.iter(|| {
            let call = async {
                service
                    .ready()
                    .await
                    .unwrap()
                    .call(black_box(7))
                    .await
                    .unwrap()
            };
            call.now_or_never().expect("ready at once")
        })
    });
}

fn benches() {
    let mut criterion = support::criterion(Duration::from_secs(2));

    round_trips(
        &mut criterion,
        "no_recorder",
        ConcurrencyLayer::new(config()).layer(Echo),
    );

    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let recorded = metrics::with_local_recorder(&recorder, || ConcurrencyLayer::new(config()));
    round_trips(&mut criterion, "recorder", recorded.layer(Echo));

    let events = Arc::new(AtomicU64::new(0));
    let counter = events.clone();
    let hooked = ConcurrencyLayer::new(config().on_event(move |_| {
        counter.fetch_add(1, Ordering::Relaxed);
    }));
    round_trips(&mut criterion, "hook", hooked.layer(Echo));
    assert!(events.load(Ordering::Relaxed) > 0);
}

criterion_main!(benches);
