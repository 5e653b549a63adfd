//! A runtime shut down under a bulkhead it shares with another runtime, with
//! calls in flight (holding slots) and callers parked for one: shutdown drops
//! every task, and every drop must give back what it held. Afterwards the
//! other runtime finds no slot held, nobody parked, and the whole limit free.
//!
//! The reclaim clock is a `ManualClock` that never moves, so a slot that
//! comes back can only have been released, never reclaimed.

use std::convert::Infallible;
use std::future::{pending, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Once;
use std::time::{Duration, Instant};
use tokio::runtime::{Builder, Runtime};
use tokio::task::JoinHandle;
use tower::util::ServiceFn;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_inflight::{
    BoxError, Bulkhead, Concurrency, ConcurrencyLayer, Config, ManualClock, ServiceSaturated,
};

const LIMIT: usize = 4;
const RECLAIM: Duration = Duration::from_secs(60);
/// Long enough that no parked caller gives up during a test.
const WAIT: Duration = Duration::from_secs(30);
/// Threads of the runtime that is shut down are named with this prefix, so
/// that the panic hook can tell their panics apart.
const DOOMED: &str = "doomed-runtime";

/// Panics seen on the doomed runtimes' threads (tasks dropped at shutdown
/// run their destructors there).
static DOOMED_PANICS: AtomicUsize = AtomicUsize::new(0);

fn count_panics_on_doomed_threads() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let thread = std::thread::current();
            if thread.name().is_some_and(|name| name.starts_with(DOOMED)) {
                DOOMED_PANICS.fetch_add(1, Ordering::SeqCst);
            }
            previous(info);
        }));
    });
}

type Answer = Pin<Box<dyn Future<Output = Result<u32, Infallible>> + Send>>;

/// The bulkhead around a service whose request 0 never answers.
type Hanging = Concurrency<ServiceFn<fn(u32) -> Answer>>;

/// Request 0 never answers; any other is answered at once.
fn hang_or_answer(request: u32) -> Answer {
    Box::pin(async move {
        if request == 0 {
            pending::<()>().await;
        }
        Ok(request)
    })
}

fn shared_bulkhead(limit: usize) -> (ConcurrencyLayer, Bulkhead) {
    let layer = ConcurrencyLayer::new(
        Config::new(limit, RECLAIM)
            .wait(WAIT)
            .name("shared")
            .clock(ManualClock::new()),
    );
    let bulkhead = layer.bulkhead();
    (layer, bulkhead)
}

fn service(layer: &ConcurrencyLayer) -> Hanging {
    layer.layer(service_fn(hang_or_answer as fn(u32) -> Answer))
}

fn doomed_multi_thread(name: &str) -> Runtime {
    Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(format!("{DOOMED}-{name}"))
        .enable_all()
        .build()
        .unwrap()
}

fn survivor() -> Runtime {
    Builder::new_current_thread().enable_all().build().unwrap()
}

/// Polls `condition` from a plain thread until it holds (up to 5 s).
fn eventually(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !condition() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Tasks on `runtime`: `LIMIT` calls that hold their slots forever, then
/// `parked_acquires` callers parked in `Bulkhead::acquire` and
/// `parked_services` parked in the service's `poll_ready`. Returns once all
/// of them hold or wait.
fn occupy(
    runtime: &Runtime,
    layer: &ConcurrencyLayer,
    parked_acquires: usize,
    parked_services: usize,
) -> Vec<JoinHandle<Result<u32, BoxError>>> {
    let bulkhead = layer.bulkhead();
    let mut tasks = Vec::new();
    for _ in 0..bulkhead.limit() {
        let mut service = service(layer);
        tasks.push(runtime.spawn(async move { service.ready().await?.call(0).await }));
    }
    eventually("every slot is held by a hanging call", || {
        bulkhead.in_flight() == bulkhead.limit()
    });
    for _ in 0..parked_acquires {
        let bulkhead = bulkhead.clone();
        tasks.push(runtime.spawn(async move {
            let _permit = bulkhead.acquire().await?;
            pending::<()>().await;
            Ok(0)
        }));
    }
    for _ in 0..parked_services {
        let mut service = service(layer);
        tasks.push(runtime.spawn(async move { service.ready().await?.call(0).await }));
    }
    let parked = parked_acquires + parked_services;
    eventually("every other caller is parked", || {
        bulkhead.waiting() == parked
    });
    assert_eq!(bulkhead.in_flight(), bulkhead.limit());
    tasks
}

/// On a runtime of its own: every task of the doomed runtime ended cancelled
/// (none panicked, none completed), nothing is held or parked, and the whole
/// limit can be taken again, released rather than reclaimed.
fn assert_left_clean(layer: &ConcurrencyLayer, tasks: Vec<JoinHandle<Result<u32, BoxError>>>) {
    let bulkhead = layer.bulkhead();
    survivor().block_on(async {
        for task in tasks {
            match task.await {
                Err(joined) if joined.is_cancelled() => {}
                Err(joined) => panic!("a task of the shut-down runtime panicked: {joined}"),
                Ok(outcome) => panic!("a task outlived its runtime: {outcome:?}"),
            }
        }
        assert_eq!(bulkhead.in_flight(), 0, "slots held by dropped tasks");
        assert_eq!(bulkhead.waiting(), 0, "dropped callers still parked");
        assert_eq!(bulkhead.available(), bulkhead.limit());

        let mut permits = Vec::new();
        for _ in 0..bulkhead.limit() {
            let permit = bulkhead.acquire().await.expect("a free slot");
            assert!(!permit.was_reclaimed(), "the slot was not released");
            permits.push(permit);
        }
        assert!(bulkhead.try_acquire().is_err());
        drop(permits);

        let answer = service(layer).ready().await.unwrap().call(7).await.unwrap();
        assert_eq!(answer, 7);
        assert_eq!(bulkhead.in_flight(), 0);
    });
    assert_eq!(
        DOOMED_PANICS.load(Ordering::SeqCst),
        0,
        "a doomed thread panicked"
    );
}

#[test]
fn shutdown_timeout_with_calls_in_flight_and_callers_parked_leaves_nothing_held() {
    count_panics_on_doomed_threads();
    let (layer, bulkhead) = shared_bulkhead(LIMIT);
    let doomed = doomed_multi_thread("timeout");
    let tasks = occupy(&doomed, &layer, 3, 3);

    doomed.shutdown_timeout(Duration::from_secs(5));
    assert_eq!(bulkhead.in_flight(), 0);
    assert_eq!(bulkhead.waiting(), 0);
    assert_left_clean(&layer, tasks);
}

#[test]
fn dropping_a_multi_thread_runtime_with_calls_in_flight_and_callers_parked_leaves_nothing_held() {
    count_panics_on_doomed_threads();
    let (layer, bulkhead) = shared_bulkhead(LIMIT);
    let doomed = doomed_multi_thread("drop");
    let tasks = occupy(&doomed, &layer, 2, 2);

    drop(doomed);
    assert_eq!(bulkhead.in_flight(), 0);
    assert_eq!(bulkhead.waiting(), 0);
    assert_left_clean(&layer, tasks);
}

#[test]
fn shutdown_background_leaves_nothing_held_once_its_workers_are_done() {
    count_panics_on_doomed_threads();
    let (layer, bulkhead) = shared_bulkhead(LIMIT);
    let doomed = doomed_multi_thread("background");
    let tasks = occupy(&doomed, &layer, 3, 1);

    doomed.shutdown_background();
    eventually("the background shutdown gives every slot back", || {
        bulkhead.in_flight() == 0 && bulkhead.waiting() == 0
    });
    assert_left_clean(&layer, tasks);
}

#[test]
fn dropping_a_current_thread_runtime_with_calls_in_flight_and_callers_parked_leaves_nothing_held() {
    count_panics_on_doomed_threads();
    let (layer, bulkhead) = shared_bulkhead(LIMIT);
    // A current-thread runtime runs (and drops) its tasks on the thread that
    // drives it: a doomed thread of its own.
    let tasks = std::thread::Builder::new()
        .name(format!("{DOOMED}-current"))
        .spawn({
            let layer = layer.clone();
            let bulkhead = bulkhead.clone();
            move || {
                let doomed = Builder::new_current_thread().enable_all().build().unwrap();
                let mut tasks = Vec::new();
                doomed.block_on(async {
                    for _ in 0..LIMIT {
                        let mut service = service(&layer);
                        tasks.push(tokio::spawn(
                            async move { service.ready().await?.call(0).await },
                        ));
                    }
                    for _ in 0..2 {
                        let bulkhead = bulkhead.clone();
                        tasks.push(tokio::spawn(async move {
                            let _permit = bulkhead.acquire().await?;
                            pending::<()>().await;
                            Ok(0)
                        }));
                        let mut service = service(&layer);
                        tasks.push(tokio::spawn(
                            async move { service.ready().await?.call(0).await },
                        ));
                    }
                    while bulkhead.in_flight() < LIMIT || bulkhead.waiting() < 4 {
                        tokio::task::yield_now().await;
                    }
                });
                drop(doomed);
                tasks
            }
        })
        .unwrap()
        .join()
        .expect("the doomed thread panicked");

    assert_eq!(bulkhead.in_flight(), 0);
    assert_eq!(bulkhead.waiting(), 0);
    assert_left_clean(&layer, tasks);
}

#[test]
fn caller_parked_on_another_runtime_gets_a_slot_freed_by_the_shutdown() {
    count_panics_on_doomed_threads();
    let (layer, bulkhead) = shared_bulkhead(2);
    let doomed = doomed_multi_thread("handover");
    // The doomed runtime's parked callers are ahead in line: each slot freed
    // by the shutdown goes to one of them first, and must be passed on when
    // that caller is dropped in turn.
    let tasks = occupy(&doomed, &layer, 2, 1);

    let survivor = Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let waiter = survivor.spawn({
        let bulkhead = bulkhead.clone();
        async move {
            let permit = bulkhead.acquire().await?;
            Ok::<_, ServiceSaturated>(permit.was_reclaimed())
        }
    });
    eventually(
        "the survivor's caller is parked behind the doomed ones",
        || bulkhead.waiting() == 4,
    );

    let shut_at = Instant::now();
    doomed.shutdown_timeout(Duration::from_secs(5));
    let reclaimed = survivor
        .block_on(waiter)
        .expect("the waiter task")
        .expect("the parked caller on the other runtime was shed");
    assert!(!reclaimed, "the slot was released, not reclaimed");
    assert!(
        shut_at.elapsed() < WAIT / 2,
        "the caller waited out its budget instead of being handed a slot"
    );
    eventually("the handed-over permit is dropped", || {
        bulkhead.in_flight() == 0
    });
    assert_left_clean(&layer, tasks);
    survivor.shutdown_timeout(Duration::from_secs(5));
}
