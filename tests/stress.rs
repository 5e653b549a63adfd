//! Many callers on several threads, cancelled at random in every way a call
//! can end early. Whatever happens, the inner service never sees more than
//! `limit` calls at once, and at the end nothing is held and nobody waits.

mod support;

use support::{Meter, Rng};

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::task::JoinSet;
use tower::{Layer, Service, ServiceExt};
use tower_inflight::{BoxError, Bulkhead, ConcurrencyLayer, Config, ServiceSaturated};

const RECLAIM: Duration = Duration::from_secs(120);
const LIMIT: usize = 4;
const TASKS: u64 = 32;
const CALLS_PER_TASK: u64 = 200;

/// The inner service: the request says how long to work, in yields (or, past
/// 1000, a real sleep of that many microseconds minus 1000).
#[derive(Clone)]
struct Metered(Meter);

impl Service<u64> for Metered {
    type Response = ();
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, work: u64) -> Self::Future {
        let meter = self.0.clone();
        Box::pin(async move {
            let _inside = meter.enter();
            if work >= 1000 {
                tokio::time::sleep(Duration::from_micros(work - 1000)).await;
            } else {
                for _ in 0..work {
                    tokio::task::yield_now().await;
                }
            }
            meter.completed.fetch_add(1, Ordering::SeqCst);
            if work % 7 == 3 {
                Err("inner failure".into())
            } else {
                Ok(())
            }
        })
    }
}

#[derive(Default)]
struct Tally {
    ok: AtomicUsize,
    shed: AtomicUsize,
    failed: AtomicUsize,
    cancelled: AtomicUsize,
}

impl Tally {
    fn record(&self, outcome: Option<Result<(), BoxError>>) {
        let counter = match outcome {
            None => &self.cancelled,
            Some(Ok(())) => &self.ok,
            Some(Err(error)) if error.is::<ServiceSaturated>() => &self.shed,
            Some(Err(_)) => &self.failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// One caller: a series of calls, each ending in a randomly chosen way.
async fn caller<S>(mut service: S, seed: u64, tally: Arc<Tally>)
where
    S: Service<u64, Response = (), Error = BoxError> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    let mut rng = Rng::new(seed);
    for _ in 0..CALLS_PER_TASK {
        let work = match rng.below(10) {
            0 => 1000 + rng.below(300), // a real (sub-)millisecond sleep
            _ => rng.below(6),
        };
        match rng.below(7) {
            // Runs to completion.
            0 | 1 => {
                let outcome = async { service.ready().await?.call(work).await }.await;
                tally.record(Some(outcome));
            }
            // Dropped after one poll.
            2 => {
                let call = match service.ready().await {
                    Ok(ready) => ready.call(work),
                    Err(error) => panic!("poll_ready failed: {error}"),
                };
                tally.record(futures_util::FutureExt::now_or_never(call));
            }
            // Dropped before it was ever polled.
            3 => {
                drop(service.ready().await.unwrap().call(work));
                tally.record(None);
            }
            // A tiny timeout around the whole call, readiness included.
            4 => {
                let budget = Duration::from_micros(rng.below(400));
                let call = async { service.ready().await?.call(work).await };
                tally.record(tokio::time::timeout(budget, call).await.ok());
            }
            // A clone in a task of its own, aborted after a few yields.
            5 => {
                let mut clone = service.clone();
                let task = tokio::spawn(async move { clone.ready().await?.call(work).await });
                for _ in 0..rng.below(4) {
                    tokio::task::yield_now().await;
                }
                task.abort();
                tally.record(task.await.ok());
            }
            // A clone that polls ready and is dropped without calling.
            _ => {
                let mut clone = service.clone();
                let budget = Duration::from_micros(rng.below(400));
                let _ = tokio::time::timeout(budget, clone.ready()).await;
                drop(clone);
                tally.record(None);
            }
        }
    }
}

async fn run(config: Config) -> (Bulkhead, Meter, Arc<Tally>) {
    let layer = ConcurrencyLayer::new(config);
    let bulkhead = layer.bulkhead();
    let meter = Meter::default();
    let service = layer.layer(Metered(meter.clone()));
    let tally = Arc::new(Tally::default());
    let mut tasks = JoinSet::new();
    for seed in 0..TASKS {
        tasks.spawn(caller(service.clone(), seed + 1, tally.clone()));
    }
    while let Some(joined) = tasks.join_next().await {
        joined.expect("a caller panicked");
    }
    (bulkhead, meter, tally)
}

fn assert_settled(bulkhead: &Bulkhead, meter: &Meter, tally: &Tally) {
    assert!(
        meter.peak() <= LIMIT,
        "the inner service saw {} calls at once, over the limit of {LIMIT}",
        meter.peak()
    );
    assert!(meter.peak() >= 1, "nothing ever ran");
    assert_eq!(meter.current.load(Ordering::SeqCst), 0);
    assert_eq!(bulkhead.in_flight(), 0, "slots leaked");
    assert_eq!(bulkhead.waiting(), 0, "callers left parked");
    assert_eq!(bulkhead.available(), LIMIT);
    assert!(
        tally.ok.load(Ordering::Relaxed) > 0,
        "no call ever succeeded"
    );
    let total = tally.ok.load(Ordering::Relaxed)
        + tally.shed.load(Ordering::Relaxed)
        + tally.failed.load(Ordering::Relaxed)
        + tally.cancelled.load(Ordering::Relaxed);
    assert_eq!(total as u64, TASKS * CALLS_PER_TASK);
    // With everything released, the full limit is usable again at once.
    let permits: Vec<_> = (0..LIMIT)
        .map(|_| bulkhead.try_acquire().unwrap())
        .collect();
    assert!(bulkhead.try_acquire().is_err());
    drop(permits);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_cancellation_never_exceeds_the_limit_nor_leaks_a_slot() {
    let (bulkhead, meter, tally) = run(Config::new(LIMIT, RECLAIM)).await;
    assert_settled(&bulkhead, &meter, &tally);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_cancellation_with_a_wait_budget_never_exceeds_the_limit_nor_leaks() {
    let config = Config::new(LIMIT, RECLAIM)
        .wait(Duration::from_millis(1))
        .max_waiting(16);
    let (bulkhead, meter, tally) = run(config).await;
    assert_settled(&bulkhead, &meter, &tally);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_acquires_dropped_at_random_never_strand_a_slot() {
    let bulkhead = Bulkhead::new(Config::new(2, RECLAIM).wait(Duration::from_millis(1)));
    let holders = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let mut tasks = JoinSet::new();
    for seed in 0..16 {
        let (bulkhead, holders, peak) = (bulkhead.clone(), holders.clone(), peak.clone());
        tasks.spawn(async move {
            let mut rng = Rng::new(seed + 100);
            for _ in 0..200 {
                let budget = Duration::from_micros(rng.below(300));
                // Shed, or cancelled while parked (or while just handed a slot).
                let Ok(Ok(permit)) = tokio::time::timeout(budget, bulkhead.acquire()).await else {
                    continue;
                };
                let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                for _ in 0..rng.below(3) {
                    tokio::task::yield_now().await;
                }
                holders.fetch_sub(1, Ordering::SeqCst);
                drop(permit);
            }
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.unwrap();
    }
    assert!(peak.load(Ordering::SeqCst) <= 2);
    assert!(peak.load(Ordering::SeqCst) >= 1);
    assert_eq!(bulkhead.in_flight(), 0);
    assert_eq!(bulkhead.waiting(), 0);
}

#[test]
fn threads_hammering_try_acquire_never_exceed_the_limit() {
    let bulkhead = Bulkhead::new(Config::new(3, RECLAIM));
    let holders = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let admitted = Arc::new(AtomicUsize::new(0));
    std::thread::scope(|scope| {
        for _ in 0..4 {
            let (bulkhead, holders, peak, admitted) = (&bulkhead, &holders, &peak, &admitted);
            scope.spawn(move || {
                for _ in 0..20_000 {
                    if let Ok(permit) = bulkhead.try_acquire() {
                        let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
                        peak.fetch_max(now, Ordering::SeqCst);
                        admitted.fetch_add(1, Ordering::Relaxed);
                        std::hint::spin_loop();
                        holders.fetch_sub(1, Ordering::SeqCst);
                        drop(permit);
                    }
                }
            });
        }
    });
    assert!(peak.load(Ordering::SeqCst) <= 3);
    assert!(admitted.load(Ordering::Relaxed) > 0);
    assert_eq!(bulkhead.in_flight(), 0);
}

/// A large table (a ledger of 10,000 entries), filled and emptied again and
/// again: one thread is shed exactly when every slot is held, never beside
/// a free one, and the count of slots held stays exact.
#[test]
fn at_a_large_limit_one_thread_is_shed_exactly_when_every_slot_is_held() {
    const LARGE: usize = 5_000;
    let bulkhead = Bulkhead::new(Config::new(LARGE, RECLAIM));
    let mut rng = Rng::new(7);
    let mut held = Vec::new();
    let mut sheds = 0;
    for step in 0..200_000u64 {
        // Phases of 20,000 steps that mostly take, then mostly give back.
        let filling = (step / 20_000) % 2 == 0;
        let take = (rng.below(4) != 0) == filling;
        if take {
            match bulkhead.try_acquire() {
                Ok(permit) => held.push(permit),
                Err(_) => {
                    sheds += 1;
                    assert_eq!(held.len(), LARGE, "shed with a slot free");
                }
            }
        } else if !held.is_empty() {
            let at = rng.below(held.len() as u64) as usize;
            drop(held.swap_remove(at));
        }
        if step % 997 == 0 {
            assert_eq!(bulkhead.in_flight(), held.len());
        }
    }
    assert!(sheds > 0, "the table never filled");
    drop(held);
    assert_eq!(bulkhead.in_flight(), 0);
}

/// Four threads keep a table of 5,000 slots nearly full, taking until they
/// are shed and giving back at random: never more than the limit held, and
/// every slot free and found at the end.
#[test]
fn at_a_large_limit_threads_filling_the_table_never_exceed_it() {
    const LARGE: usize = 5_000;
    let bulkhead = Bulkhead::new(Config::new(LARGE, RECLAIM));
    let holders = AtomicUsize::new(0);
    let peak = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for seed in 0..4 {
            let (bulkhead, holders, peak) = (&bulkhead, &holders, &peak);
            scope.spawn(move || {
                let mut rng = Rng::new(seed);
                let mut held = Vec::new();
                for _ in 0..20 {
                    while let Ok(permit) = bulkhead.try_acquire() {
                        let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
                        peak.fetch_max(now, Ordering::SeqCst);
                        held.push(permit);
                    }
                    for _ in 0..held.len() / 2 {
                        let at = rng.below(held.len() as u64) as usize;
                        holders.fetch_sub(1, Ordering::SeqCst);
                        drop(held.swap_remove(at));
                    }
                }
                holders.fetch_sub(held.len(), Ordering::SeqCst);
            });
        }
    });
    assert!(peak.load(Ordering::SeqCst) <= LARGE);
    assert_eq!(bulkhead.in_flight(), 0);
    let all: Vec<_> = (0..LARGE)
        .map(|_| bulkhead.try_acquire().unwrap())
        .collect();
    assert!(bulkhead.try_acquire().is_err());
    drop(all);
}

/// Callers each holding at most one slot at a time, never more than the
/// limit in all: at every moment a slot is free for the caller that asks,
/// so none is ever shed. Each thread serves a few callers in turn, each
/// dropping its permit and taking another, so callers keep moving between
/// ledger entries while others claim: the count, not the entries, decides
/// admission, so a claim never sees a slot held that was free.
#[test]
fn callers_that_each_hold_one_slot_at_most_are_never_shed_on_many_threads() {
    for (threads, callers_each) in [(2, 1), (2, 2), (3, 1), (2, 3), (3, 2)] {
        let limit = threads * callers_each;
        let bulkhead = Bulkhead::new(Config::new(limit, Duration::from_secs(30)));
        let shed: usize = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..threads)
                .map(|_| {
                    scope.spawn(|| {
                        let mut permits: Vec<_> = (0..callers_each).map(|_| None).collect();
                        let mut shed = 0;
                        for call in 0..1_000_000 {
                            let permit = &mut permits[call % callers_each];
                            // The caller's release, then its next claim.
                            *permit = None;
                            match bulkhead.try_acquire() {
                                Ok(taken) => *permit = Some(taken),
                                Err(_) => shed += 1,
                            }
                        }
                        shed
                    })
                })
                .collect();
            threads
                .into_iter()
                .map(|thread| thread.join().unwrap())
                .sum()
        });
        assert_eq!(
            shed, 0,
            "{threads} threads of {callers_each} callers: shed beside a free slot"
        );
        assert_eq!(bulkhead.in_flight(), 0);
    }
}
