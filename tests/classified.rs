//! The classified layer: each request's priority and weight come from a
//! classifier, and a request that must wait does so in its response future.

mod support;

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::Meter;
use tower::{service_fn, Service, ServiceExt};
use tower_inflight::{
    BoxError, Bulkhead, ConcurrencyLayer, Config, QueueOrder, ServiceSaturated, ShedReason, Ticket,
};

/// A request: its name, priority and weight.
#[derive(Clone, Copy)]
struct Job(char, i32, usize);

fn ticket(job: &Job) -> Ticket {
    Ticket::new().priority(job.1).weight(job.2)
}

fn reason(error: BoxError) -> ShedReason {
    error.downcast::<ServiceSaturated>().unwrap().reason()
}

/// A layer with a wait budget and priority order, and a service behind it
/// that logs each job's name and holds its slots for a millisecond.
fn logging_service(
    limit: usize,
) -> (
    Bulkhead,
    Arc<Mutex<String>>,
    impl Service<Job, Response = (), Error = BoxError, Future = impl Send> + Clone + Send,
) {
    let layer = ConcurrencyLayer::new(
        Config::new(limit, Duration::from_secs(30))
            .wait(Duration::from_secs(10))
            .queue_order(QueueOrder::PriorityFifo),
    )
    .classify(ticket);
    let bulkhead = layer.bulkhead();
    let log = Arc::new(Mutex::new(String::new()));
    let service = tower::ServiceBuilder::new()
        .layer(layer)
        .service(service_fn({
            let log = log.clone();
            move |job: Job| {
                log.lock().unwrap().push(job.0);
                async move {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    Ok::<_, Infallible>(())
                }
            }
        }));
    (bulkhead, log, service)
}

#[tokio::test(start_paused = true)]
async fn the_classifier_s_priorities_order_the_line() {
    let (bulkhead, log, service) = logging_service(1);
    let held = bulkhead.try_acquire().unwrap();
    let mut calls = Vec::new();
    for job in [
        Job('a', 5, 1),
        Job('b', 0, 1),
        Job('c', 5, 1),
        Job('d', 0, 1),
    ] {
        let service = service.clone();
        calls.push(tokio::spawn(service.oneshot(job)));
        tokio::task::yield_now().await;
    }
    assert_eq!(bulkhead.waiting(), 4);
    assert_eq!(
        log.lock().unwrap().as_str(),
        "",
        "nobody called while waiting"
    );
    drop(held);
    for call in calls {
        call.await.unwrap().unwrap();
    }
    assert_eq!(log.lock().unwrap().as_str(), "bdac");
    assert_eq!(bulkhead.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_heavy_request_holds_its_weight_in_slots_while_it_runs() {
    let layer = ConcurrencyLayer::new(Config::new(4, Duration::from_secs(30))).classify(ticket);
    let bulkhead = layer.bulkhead();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut service = tower::ServiceBuilder::new()
        .layer(layer)
        .service(service_fn({
            let (bulkhead, seen) = (bulkhead.clone(), seen.clone());
            move |_job: Job| {
                seen.lock().unwrap().push(bulkhead.in_flight());
                async { Ok::<_, Infallible>(()) }
            }
        }));
    service
        .ready()
        .await
        .unwrap()
        .call(Job('h', 0, 3))
        .await
        .unwrap();
    service
        .ready()
        .await
        .unwrap()
        .call(Job('l', 0, 1))
        .await
        .unwrap();
    assert_eq!(*seen.lock().unwrap(), [3, 1]);
    assert_eq!(bulkhead.in_flight(), 0);
}

#[tokio::test]
async fn without_a_wait_budget_a_request_that_does_not_fit_is_shed() {
    let meter = Meter::default();
    let layer = ConcurrencyLayer::new(Config::new(2, Duration::from_secs(30))).classify(ticket);
    let bulkhead = layer.bulkhead();
    let mut service = tower::ServiceBuilder::new()
        .layer(layer)
        .service(service_fn({
            let meter = meter.clone();
            move |_job: Job| {
                let _inside = meter.enter();
                async { Ok::<_, Infallible>(()) }
            }
        }));
    let _held = bulkhead.try_acquire().unwrap();
    let shed = service.ready().await.unwrap().call(Job('h', 0, 2)).await;
    assert_eq!(reason(shed.unwrap_err()), ShedReason::LimitReached);
    let invalid = service.ready().await.unwrap().call(Job('x', 0, 3)).await;
    assert_eq!(reason(invalid.unwrap_err()), ShedReason::InvalidWeight);
    assert_eq!(
        meter.peak(),
        0,
        "the inner service never saw a shed request"
    );
    assert_eq!(bulkhead.in_flight(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_waiting_request_whose_budget_runs_out_is_shed_without_calling_inner() {
    let layer = ConcurrencyLayer::new(
        Config::new(1, Duration::from_secs(30)).wait(Duration::from_millis(50)),
    )
    .classify(ticket);
    let bulkhead = layer.bulkhead();
    let called = Arc::new(Mutex::new(0));
    let service = tower::ServiceBuilder::new()
        .layer(layer)
        .service(service_fn({
            let called = called.clone();
            move |_job: Job| {
                *called.lock().unwrap() += 1;
                async { Ok::<_, Infallible>(()) }
            }
        }));
    let held = bulkhead.try_acquire().unwrap();
    let started = tokio::time::Instant::now();
    let shed = service.oneshot(Job('a', 0, 1)).await.unwrap_err();
    assert_eq!(reason(shed), ShedReason::WaitExpired);
    assert!(started.elapsed() >= Duration::from_millis(50));
    assert_eq!(*called.lock().unwrap(), 0);
    drop(held);
    assert_eq!(bulkhead.in_flight(), 0);
    assert_eq!(bulkhead.waiting(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_waiting_request_that_is_dropped_passes_its_turn_on() {
    let (bulkhead, log, service) = logging_service(1);
    let held = bulkhead.try_acquire().unwrap();
    let first = tokio::spawn(service.clone().oneshot(Job('a', 0, 1)));
    tokio::task::yield_now().await;
    let second = tokio::spawn(service.clone().oneshot(Job('b', 0, 1)));
    tokio::task::yield_now().await;
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    drop(held);
    second.await.unwrap().unwrap();
    assert_eq!(log.lock().unwrap().as_str(), "b");
    assert_eq!(bulkhead.in_flight(), 0);
    assert_eq!(bulkhead.waiting(), 0);
}

#[tokio::test(start_paused = true)]
async fn slots_are_released_when_the_inner_call_panics_at_once_or_after_waiting() {
    #[derive(Clone)]
    struct PanicsInCall;
    impl Service<Job> for PanicsInCall {
        type Response = ();
        type Error = Infallible;
        type Future = std::future::Ready<Result<(), Infallible>>;
        fn poll_ready(
            &mut self,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), Infallible>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: Job) -> Self::Future {
            panic!("inner call panicked")
        }
    }
    let layer =
        ConcurrencyLayer::new(Config::new(2, Duration::from_secs(30)).wait(Duration::from_secs(1)))
            .classify(ticket);
    let bulkhead = layer.bulkhead();
    let service = tower::Layer::layer(&layer, PanicsInCall);

    // Called at once, with room.
    let joined = tokio::spawn(service.clone().oneshot(Job('a', 0, 2))).await;
    assert!(joined.unwrap_err().is_panic());
    assert_eq!(bulkhead.in_flight(), 0);

    // Called from the response future, after waiting for its slots.
    let held = bulkhead.try_acquire().unwrap();
    let waiting = tokio::spawn(service.oneshot(Job('b', 0, 2)));
    tokio::task::yield_now().await;
    assert_eq!(bulkhead.waiting(), 1);
    drop(held);
    assert!(waiting.await.unwrap_err().is_panic());
    assert_eq!(bulkhead.in_flight(), 0);
}
