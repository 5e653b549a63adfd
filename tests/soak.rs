//! A soak through `ConcurrencyLayer` on a two-worker runtime: many calls, each
//! ending in a randomly chosen way (completion, inner error, cancellation
//! after one poll, a tiny timeout, a panic inside the inner future, an aborted
//! task), plus a few permits and response futures forgotten on purpose.
//!
//! The reclaim clock is a `ManualClock` that stands still during the run, so
//! nothing is reclaimed: the inner service must never see more than `limit`
//! calls at once, and afterwards exactly the forgotten slots are held. Then the
//! clock steps past `reclaim_after` and exactly those come back, reclaimed.
//!
//! Calls in total: `TOWER_INFLIGHT_SOAK_CALLS` (default 50,000, a few seconds
//! in a debug build). The long run:
//!
//! ```text
//! TOWER_INFLIGHT_SOAK_CALLS=1000000 cargo test --release --all-features --test soak
//! ```

mod support;

use support::{Meter, Rng};

use futures_util::FutureExt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Once};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::task::JoinSet;
use tower::{Layer, Service, ServiceExt};
use tower_inflight::{BoxError, Bulkhead, ConcurrencyLayer, Config, ManualClock, ServiceSaturated};

const RECLAIM: Duration = Duration::from_secs(60);
const LIMIT: usize = 16;
const DRIVERS: usize = 32;
/// Drivers that each `mem::forget` one permit halfway through.
const FORGET_PERMITS: usize = 2;
/// Drivers that each leak one admitted, once-polled response future.
const LEAK_FUTURES: usize = 2;
const DEFAULT_CALLS: usize = 50_000;
const DELIBERATE: &str = "soak: a deliberate panic inside the inner future";

fn total_calls() -> usize {
    match std::env::var("TOWER_INFLIGHT_SOAK_CALLS") {
        Ok(calls) => calls
            .trim()
            .replace('_', "")
            .parse()
            .unwrap_or_else(|_| panic!("TOWER_INFLIGHT_SOAK_CALLS={calls:?} is not a count")),
        Err(_) => DEFAULT_CALLS,
    }
}

/// Keeps the deliberate panics off stderr (thousands of them) and lets any
/// other panic through to the usual hook.
fn silence_deliberate_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<&str>() != Some(&DELIBERATE) {
                previous(info);
            }
        }));
    });
}

/// What the inner service is asked to do.
#[derive(Clone, Copy, Debug)]
enum Work {
    /// Yield this many times, then answer.
    Yields(u8),
    /// Yield this many times, then fail.
    Fail(u8),
    /// Sleep (real time) this many microseconds, then answer.
    Sleep(u64),
    /// Panic inside the future.
    Panic,
    /// Never answer.
    Hang,
}

#[derive(Clone)]
struct Metered(Meter);

impl Service<Work> for Metered {
    type Response = ();
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, work: Work) -> Self::Future {
        let meter = self.0.clone();
        Box::pin(async move {
            let _inside = meter.enter();
            match work {
                Work::Yields(n) | Work::Fail(n) => {
                    for _ in 0..n {
                        tokio::task::yield_now().await;
                    }
                }
                Work::Sleep(micros) => tokio::time::sleep(Duration::from_micros(micros)).await,
                Work::Panic => {
                    tokio::task::yield_now().await;
                    std::panic::panic_any(DELIBERATE);
                }
                Work::Hang => std::future::pending::<()>().await,
            }
            match work {
                Work::Fail(_) => Err("inner failure".into()),
                _ => Ok(()),
            }
        })
    }
}

/// How each call ended.
#[derive(Default)]
struct Tally {
    ok: AtomicUsize,
    failed: AtomicUsize,
    shed: AtomicUsize,
    cancelled: AtomicUsize,
    timed_out: AtomicUsize,
    panicked: AtomicUsize,
    aborted: AtomicUsize,
    forgotten: AtomicUsize,
    leaked_futures: AtomicUsize,
}

impl Tally {
    fn bump(counter: &AtomicUsize) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn outcome(&self, outcome: Result<(), BoxError>) {
        Self::bump(match outcome {
            Ok(()) => &self.ok,
            Err(error) if error.is::<ServiceSaturated>() => &self.shed,
            Err(_) => &self.failed,
        });
    }

    fn get(counter: &AtomicUsize) -> usize {
        counter.load(Ordering::Relaxed)
    }

    fn calls(&self) -> usize {
        [
            &self.ok,
            &self.failed,
            &self.shed,
            &self.cancelled,
            &self.timed_out,
            &self.panicked,
            &self.aborted,
        ]
        .into_iter()
        .map(Self::get)
        .sum()
    }

    fn abandoned(&self) -> usize {
        Self::get(&self.forgotten) + Self::get(&self.leaked_futures)
    }

    fn summary(&self) -> String {
        format!(
            "ok {}, failed {}, shed {}, cancelled {}, timed out {}, panicked {}, aborted {}, \
             forgotten permits {}, leaked futures {}",
            Self::get(&self.ok),
            Self::get(&self.failed),
            Self::get(&self.shed),
            Self::get(&self.cancelled),
            Self::get(&self.timed_out),
            Self::get(&self.panicked),
            Self::get(&self.aborted),
            Self::get(&self.forgotten),
            Self::get(&self.leaked_futures),
        )
    }
}

type Svc = tower_inflight::Concurrency<Metered>;

/// `mem::forget`s one permit, retrying until there is a free slot.
async fn forget_a_permit(bulkhead: &Bulkhead, tally: &Tally) {
    loop {
        if let Ok(permit) = bulkhead.try_acquire() {
            std::mem::forget(permit);
            Tally::bump(&tally.forgotten);
            return;
        }
        tokio::task::yield_now().await;
    }
}

/// Leaks one response future that was admitted and polled once (its inner
/// call is in flight), retrying until one is admitted.
async fn leak_a_future(service: &mut Svc, tally: &Tally) {
    loop {
        let Ok(ready) = service.ready().await else {
            panic!("poll_ready failed")
        };
        let mut call = Box::pin(ready.call(Work::Hang));
        let first = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
        match first {
            Poll::Pending => {
                std::mem::forget(call);
                Tally::bump(&tally.leaked_futures);
                return;
            }
            Poll::Ready(Err(error)) if error.is::<ServiceSaturated>() => {
                tokio::task::yield_now().await;
            }
            Poll::Ready(other) => panic!("a hanging call ended: {other:?}"),
        }
    }
}

async fn driver(index: usize, mut service: Svc, calls: usize, tally: Arc<Tally>) {
    let mut rng = Rng::new(index as u64 + 1);
    let bulkhead = service.bulkhead().clone();
    for call in 0..calls {
        if call == calls / 2 {
            if index < FORGET_PERMITS {
                forget_a_permit(&bulkhead, &tally).await;
            } else if index < FORGET_PERMITS + LEAK_FUTURES {
                leak_a_future(&mut service, &tally).await;
            }
        }
        let yields = rng.below(4) as u8;
        match rng.below(20) {
            // Runs to completion, or fails inside.
            0..=8 => {
                let work = if rng.below(8) == 0 {
                    Work::Fail(yields)
                } else {
                    Work::Yields(yields)
                };
                let outcome = async { service.ready().await?.call(work).await }.await;
                tally.outcome(outcome);
            }
            // Polled once, then dropped (whether or not it finished).
            9 | 10 => {
                let call = async { service.ready().await?.call(Work::Yields(yields + 1)).await };
                match call.now_or_never() {
                    Some(outcome) => tally.outcome(outcome),
                    None => Tally::bump(&tally.cancelled),
                }
            }
            // The call future made and dropped without a poll.
            11 => {
                match service.ready().now_or_never() {
                    Some(Ok(ready)) => drop(ready.call(Work::Yields(yields))),
                    Some(Err(error)) => panic!("poll_ready failed: {error}"),
                    None => {}
                }
                Tally::bump(&tally.cancelled);
            }
            // A tiny timeout around readiness and call; now and then the call
            // sleeps past it.
            12..=14 => {
                let work = if rng.below(10) == 0 {
                    Work::Sleep(1_000 + rng.below(1_000))
                } else {
                    Work::Yields(yields)
                };
                let budget = Duration::from_micros(rng.below(300));
                let call = async { service.ready().await?.call(work).await };
                match tokio::time::timeout(budget, call).await {
                    Ok(outcome) => tally.outcome(outcome),
                    Err(_) => Tally::bump(&tally.timed_out),
                }
            }
            // A clone in a task of its own, whose inner future panics.
            15 | 16 => {
                let mut clone = service.clone();
                let task =
                    tokio::spawn(async move { clone.ready().await?.call(Work::Panic).await });
                match task.await {
                    Err(joined) if joined.is_panic() => {
                        let payload = joined.into_panic();
                        assert_eq!(payload.downcast_ref::<&str>(), Some(&DELIBERATE));
                        Tally::bump(&tally.panicked);
                    }
                    Err(joined) => panic!("the panicking task was cancelled: {joined}"),
                    Ok(outcome) => tally.outcome(outcome),
                }
            }
            // A clone in a task of its own, aborted after a few yields.
            _ => {
                let mut clone = service.clone();
                let work = Work::Yields(yields + 2);
                let task = tokio::spawn(async move { clone.ready().await?.call(work).await });
                for _ in 0..rng.below(3) {
                    tokio::task::yield_now().await;
                }
                task.abort();
                match task.await {
                    Err(joined) if joined.is_cancelled() => Tally::bump(&tally.aborted),
                    Err(joined) => panic!("the aborted task panicked: {joined}"),
                    Ok(outcome) => tally.outcome(outcome),
                }
            }
        }
    }
}

async fn soak(config: Config) {
    silence_deliberate_panics();
    let clock = ManualClock::new();
    let layer = ConcurrencyLayer::new(config.clock(clock.clone()));
    let bulkhead = layer.bulkhead();
    let meter = Meter::default();
    let service = layer.layer(Metered(meter.clone()));
    let tally = Arc::new(Tally::default());
    let calls = total_calls();
    let per_driver = calls.div_ceil(DRIVERS);

    let started = Instant::now();
    let mut drivers = JoinSet::new();
    for index in 0..DRIVERS {
        drivers.spawn(driver(index, service.clone(), per_driver, tally.clone()));
    }
    while let Some(joined) = drivers.join_next().await {
        joined.expect("a driver panicked");
    }
    let elapsed = started.elapsed();
    println!(
        "{} calls in {elapsed:.2?}: {}; peak {} of {LIMIT}",
        tally.calls(),
        tally.summary(),
        meter.peak.load(Ordering::SeqCst)
    );

    assert_eq!(tally.calls(), per_driver * DRIVERS);
    let peak = meter.peak.load(Ordering::SeqCst);
    assert!(
        peak <= LIMIT,
        "the inner service saw {peak} calls at once, over the limit of {LIMIT}"
    );
    assert!(peak >= 1, "nothing ever ran");
    for (what, counter) in [
        ("completed", &tally.ok),
        ("cancelled", &tally.cancelled),
        ("panicked", &tally.panicked),
    ] {
        assert!(
            Tally::get(counter) > 0,
            "no call {what}: {}",
            tally.summary()
        );
    }

    // Nothing was reclaimed during the run: exactly the forgotten slots are
    // held, and only the leaked futures' inner calls are still "running".
    let abandoned = tally.abandoned();
    assert_eq!(abandoned, FORGET_PERMITS + LEAK_FUTURES);
    assert_eq!(
        meter.current.load(Ordering::SeqCst),
        Tally::get(&tally.leaked_futures)
    );
    assert_eq!(bulkhead.waiting(), 0, "callers left parked");
    assert_eq!(
        bulkhead.in_flight(),
        abandoned,
        "slots held once every call has ended ({})",
        tally.summary()
    );

    // Past reclaim_after every forgotten slot can be taken again (it counts
    // as held until it is), and retaking all of them reclaims exactly the
    // forgotten ones.
    clock.advance(RECLAIM);
    assert!(!bulkhead.is_saturated());
    assert_eq!(bulkhead.in_flight(), abandoned);
    let permits: Vec<_> = (0..LIMIT)
        .map(|_| bulkhead.try_acquire().expect("a free slot"))
        .collect();
    let reclaimed = permits.iter().filter(|p| p.was_reclaimed()).count();
    assert_eq!(reclaimed, abandoned, "reclaimed slots vs forgotten permits");
    assert!(bulkhead.try_acquire().is_err());
    drop(permits);
    assert_eq!(bulkhead.in_flight(), 0);
    assert_eq!(bulkhead.available(), LIMIT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_through_the_layer_never_exceeds_the_limit_and_leaks_only_what_was_forgotten() {
    soak(Config::new(LIMIT, RECLAIM).name("soak")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_with_a_wait_budget_never_exceeds_the_limit_and_leaks_only_what_was_forgotten() {
    soak(
        Config::new(LIMIT, RECLAIM)
            .name("soak-wait")
            .wait(Duration::from_millis(2))
            .max_waiting(DRIVERS),
    )
    .await;
}
