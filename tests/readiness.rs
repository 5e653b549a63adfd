//! The `poll_ready`/`call` contract, driven by hand with tower-test mocks:
//! the slot is taken in `call`, a parked service holds none, the head of the
//! line is woken with a slot handed to it, a dropped service passes its turn
//! on, and saturation is never a `poll_ready` error.

use std::task::Poll;
use std::time::Duration;
use tokio::time::advance;
use tokio_test::task::spawn;
use tower::Layer;
use tower_inflight::{
    BoxError, Bulkhead, Concurrency, ConcurrencyLayer, Config, ServiceSaturated, ShedReason,
};
use tower_test::mock::{self, Handle, Mock, Spawn};

const RECLAIM: Duration = Duration::from_secs(60);
const WAIT: Duration = Duration::from_millis(100);
const MS: Duration = Duration::from_millis(1);

type Svc = Spawn<Concurrency<Mock<u32, u32>>>;

/// A layer, its bulkhead, and `n` services built over one mock.
fn services(config: Config, n: usize) -> (Bulkhead, Vec<Svc>, Handle<u32, u32>) {
    let layer = ConcurrencyLayer::new(config);
    let (mock, handle) = mock::pair::<u32, u32>();
    let services = (0..n)
        .map(|_| Spawn::new(layer.layer(mock.clone())))
        .collect();
    (layer.bulkhead(), services, handle)
}

fn waiting(limit: usize) -> Config {
    Config::new(limit, RECLAIM).wait(WAIT)
}

fn assert_ready(service: &mut Svc) {
    match service.poll_ready() {
        Poll::Ready(Ok(())) => {}
        Poll::Ready(Err(error)) => panic!("poll_ready failed: {error}"),
        Poll::Pending => panic!("poll_ready was pending"),
    }
}

fn assert_pending(service: &mut Svc) {
    match service.poll_ready() {
        Poll::Pending => {}
        Poll::Ready(Ok(())) => panic!("poll_ready was ready"),
        Poll::Ready(Err(error)) => panic!("poll_ready failed: {error}"),
    }
}

/// Calls `service` and expects the call to fail at once with saturation.
fn call_sheds(service: &mut Svc, request: u32) -> ServiceSaturated {
    let mut response = spawn(service.call(request));
    match response.poll() {
        Poll::Ready(Err(error)) => error
            .downcast::<ServiceSaturated>()
            .map(|shed| *shed)
            .unwrap_or_else(|error: BoxError| panic!("expected ServiceSaturated, got {error}")),
        Poll::Ready(Ok(_)) => panic!("expected the call to be shed, it succeeded"),
        Poll::Pending => panic!("expected the call to be shed at once, it is pending"),
    }
}

fn no_request_reached(handle: &mut Handle<u32, u32>) {
    assert!(
        handle.poll_request().is_pending(),
        "a request reached the inner service"
    );
}

#[tokio::test]
async fn poll_ready_is_ready_with_room_and_the_slot_is_taken_only_in_call() {
    let (bulkhead, mut services, mut handle) = services(Config::new(1, RECLAIM), 1);
    let service = &mut services[0];
    assert_ready(service);
    assert_eq!(bulkhead.in_flight(), 0, "poll_ready took a slot");

    let mut response = spawn(service.call(7));
    assert_eq!(bulkhead.in_flight(), 1, "call took no slot");
    let (request, reply) = handle.next_request().await.unwrap();
    assert_eq!(request, 7);
    assert!(response.poll().is_pending());
    reply.send_response(14);
    assert!(response.is_woken());
    assert!(matches!(response.poll(), Poll::Ready(Ok(14))));
    assert_eq!(bulkhead.in_flight(), 0);
}

#[tokio::test]
async fn service_polled_ready_then_left_idle_pins_nothing() {
    let (bulkhead, mut services, mut handle) = services(waiting(2), 2);
    let [idle, busy] = &mut services[..] else {
        unreachable!()
    };
    assert_ready(idle);
    assert_eq!(bulkhead.in_flight(), 0);

    // Another clone takes every slot while the first one idles, ready.
    let mut responses = Vec::new();
    for request in 0..2 {
        assert_ready(busy);
        responses.push(spawn(busy.call(request)));
    }
    assert_eq!(bulkhead.in_flight(), 2);
    for _ in 0..2 {
        handle.next_request().await.unwrap();
    }

    // The idle one had been promised nothing: its call is shed, not queued.
    let shed = call_sheds(idle, 9);
    assert_eq!(shed.reason(), ShedReason::LimitReached);
    no_request_reached(&mut handle);
    assert_eq!(bulkhead.in_flight(), 2);
}

#[tokio::test(start_paused = true)]
async fn with_a_wait_budget_and_no_room_poll_ready_parks_holding_no_slot() {
    let (bulkhead, mut services, _handle) = services(waiting(1), 1);
    let _held = bulkhead.try_acquire().unwrap();
    let service = &mut services[0];
    assert_pending(service);
    assert_eq!(bulkhead.in_flight(), 1, "the parked service holds no slot");
    assert_eq!(bulkhead.waiting(), 1);
    assert_pending(service); // polling again does not queue it twice
    assert_eq!(bulkhead.waiting(), 1);
}

#[tokio::test(start_paused = true)]
async fn parked_service_is_woken_with_a_slot_handed_to_it_and_call_uses_it() {
    let (bulkhead, mut services, mut handle) = services(waiting(1), 1);
    let held = bulkhead.try_acquire().unwrap();
    let service = &mut services[0];
    assert_pending(service);
    assert!(!service.is_woken());

    drop(held);
    assert!(
        service.is_woken(),
        "the handover must wake the parked service"
    );
    assert_eq!(bulkhead.in_flight(), 1, "the slot is reserved for it");
    assert_eq!(bulkhead.waiting(), 0);
    assert!(
        bulkhead.try_acquire().is_err(),
        "a newcomer took the handed slot"
    );

    assert_ready(service);
    assert_eq!(bulkhead.in_flight(), 1);
    let mut response = spawn(service.call(5));
    assert_eq!(
        bulkhead.in_flight(),
        1,
        "call used the handed slot, not a second one"
    );
    let (request, reply) = handle.next_request().await.unwrap();
    assert_eq!(request, 5);
    reply.send_response(50);
    assert!(matches!(response.poll(), Poll::Ready(Ok(50))));
    assert_eq!(bulkhead.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn when_the_budget_ends_poll_ready_is_ready_and_call_sheds_with_wait_expired() {
    let (bulkhead, mut services, mut handle) = services(waiting(1).name("db"), 1);
    let _held = bulkhead.try_acquire().unwrap();
    let service = &mut services[0];
    assert_pending(service);

    advance(WAIT - MS).await;
    assert!(!service.is_woken(), "woken before the budget ended");
    assert_pending(service);

    advance(MS).await;
    assert!(service.is_woken(), "not woken when the budget ended");
    assert_ready(service);
    assert_eq!(bulkhead.waiting(), 0);
    let shed = call_sheds(service, 1);
    assert_eq!(shed.reason(), ShedReason::WaitExpired);
    assert_eq!(shed.name(), Some("db"));
    no_request_reached(&mut handle);
    assert_eq!(bulkhead.in_flight(), 1);
}

#[tokio::test(start_paused = true)]
async fn only_the_head_of_the_line_is_woken() {
    let (bulkhead, mut services, _handle) = services(waiting(1), 2);
    let held = bulkhead.try_acquire().unwrap();
    let [first, second] = &mut services[..] else {
        unreachable!()
    };
    assert_pending(first);
    assert_pending(second);
    assert_eq!(bulkhead.waiting(), 2);

    drop(held);
    assert!(first.is_woken());
    assert!(!second.is_woken(), "a slot for one woke two");
    assert_pending(second);
    assert_ready(first);
    assert_eq!(bulkhead.waiting(), 1);
}

#[tokio::test(start_paused = true)]
async fn next_parked_service_is_woken_when_the_head_finishes_its_call() {
    let (bulkhead, mut services, mut handle) = services(waiting(1), 2);
    let held = bulkhead.try_acquire().unwrap();
    let [first, second] = &mut services[..] else {
        unreachable!()
    };
    assert_pending(first);
    assert_pending(second);
    drop(held);
    assert_ready(first);
    let mut response = spawn(first.call(1));
    let (_, reply) = handle.next_request().await.unwrap();
    assert!(!second.is_woken());
    reply.send_response(1);
    assert!(matches!(response.poll(), Poll::Ready(Ok(1))));
    assert!(second.is_woken());
    assert_ready(second);
    assert_eq!(bulkhead.in_flight(), 1);
}

#[tokio::test(start_paused = true)]
async fn parked_service_that_is_dropped_passes_its_turn_on() {
    let (bulkhead, mut services, _handle) = services(waiting(1), 2);
    let held = bulkhead.try_acquire().unwrap();
    assert_pending(&mut services[0]);
    assert_pending(&mut services[1]);
    let mut second = services.pop().unwrap();
    drop(services); // the head of the line goes away while still parked
    assert_eq!(bulkhead.waiting(), 1);

    drop(held);
    assert!(second.is_woken());
    assert_ready(&mut second);
    assert_eq!(bulkhead.in_flight(), 1);
}

#[tokio::test(start_paused = true)]
async fn service_handed_a_slot_but_dropped_before_polling_passes_it_on() {
    let (bulkhead, mut services, _handle) = services(waiting(1), 2);
    let held = bulkhead.try_acquire().unwrap();
    assert_pending(&mut services[0]);
    assert_pending(&mut services[1]);
    let mut second = services.pop().unwrap();

    drop(held);
    assert!(services[0].is_woken());
    assert!(!second.is_woken());
    drop(services); // handed the slot, never polled again
    assert!(second.is_woken(), "the dropped service kept its slot");
    assert_ready(&mut second);
    assert_eq!(bulkhead.in_flight(), 1);
}

#[tokio::test(start_paused = true)]
async fn service_ready_with_a_handed_slot_but_dropped_before_call_passes_it_on() {
    let (bulkhead, mut services, mut handle) = services(waiting(1), 2);
    let held = bulkhead.try_acquire().unwrap();
    assert_pending(&mut services[0]);
    assert_pending(&mut services[1]);
    let mut second = services.pop().unwrap();

    drop(held);
    assert_ready(&mut services[0]); // holds the slot until its call...
    assert_eq!(bulkhead.in_flight(), 1);
    drop(services); // ...which never comes
    assert!(second.is_woken());
    assert_ready(&mut second);
    let _response = spawn(second.call(3));
    assert_eq!(handle.next_request().await.unwrap().0, 3);
    assert_eq!(bulkhead.in_flight(), 1);
}

#[tokio::test]
async fn saturation_without_a_wait_budget_is_never_a_poll_ready_error() {
    let (bulkhead, mut services, mut handle) = services(Config::new(1, RECLAIM), 1);
    let _held = bulkhead.try_acquire().unwrap();
    let service = &mut services[0];
    for _ in 0..3 {
        assert_ready(service);
    }
    assert_eq!(call_sheds(service, 1).reason(), ShedReason::LimitReached);
    no_request_reached(&mut handle);
    assert_ready(service);
}

#[tokio::test(start_paused = true)]
async fn saturation_past_max_waiting_is_never_a_poll_ready_error() {
    let (bulkhead, mut services, mut handle) = services(waiting(1).max_waiting(1), 2);
    let _held = bulkhead.try_acquire().unwrap();
    let [parked, refused] = &mut services[..] else {
        unreachable!()
    };
    assert_pending(parked);
    assert_ready(refused);
    assert_eq!(bulkhead.waiting(), 1);
    assert_eq!(call_sheds(refused, 2).reason(), ShedReason::TooManyWaiting);
    no_request_reached(&mut handle);
}

#[tokio::test(start_paused = true)]
async fn expired_wait_is_never_a_poll_ready_error() {
    let (bulkhead, mut services, _handle) = services(waiting(1), 1);
    let _held = bulkhead.try_acquire().unwrap();
    assert_pending(&mut services[0]);
    advance(WAIT).await;
    assert_ready(&mut services[0]);
}

#[tokio::test]
async fn inner_poll_ready_error_passes_through_and_is_not_saturation() {
    let (bulkhead, mut services, mut handle) = services(Config::new(1, RECLAIM), 1);
    handle.send_error("inner broken");
    let Poll::Ready(Err(error)) = services[0].poll_ready() else {
        panic!("the inner service's poll_ready error was swallowed");
    };
    assert!(!error.is::<ServiceSaturated>());
    assert_eq!(error.to_string(), "inner broken");
    assert_eq!(bulkhead.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn inner_not_ready_means_no_slot_held_and_no_place_in_line() {
    let (bulkhead, mut services, mut handle) = services(waiting(1), 1);
    handle.allow(0);
    let held = bulkhead.try_acquire().unwrap();
    let service = &mut services[0];
    assert_pending(service);
    assert_eq!(
        bulkhead.waiting(),
        0,
        "parked while the inner service was not ready"
    );
    drop(held);
    assert_pending(service);
    assert_eq!(
        bulkhead.in_flight(),
        0,
        "a slot was taken while the inner was not ready"
    );

    handle.allow(1);
    assert!(service.is_woken());
    assert_ready(service);
    assert_eq!(bulkhead.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn clones_share_the_bulkhead_but_not_readiness() {
    let (bulkhead, mut services, mut handle) = services(waiting(1), 1);
    let held = bulkhead.try_acquire().unwrap();
    let mut original = services.pop().unwrap();
    assert_pending(&mut original);
    drop(held);
    assert_ready(&mut original); // a slot was handed to `original`

    let mut clone = Spawn::new(original.get_ref().clone());
    assert_eq!(
        clone.get_ref().bulkhead().in_flight(),
        1,
        "one shared bulkhead"
    );
    assert_pending(&mut clone); // the handed slot is not the clone's
    assert_eq!(bulkhead.waiting(), 1);

    let mut response = spawn(original.call(1));
    let (request, reply) = handle.next_request().await.unwrap();
    assert_eq!(request, 1);
    assert!(!clone.is_woken());
    reply.send_response(2);
    assert!(matches!(response.poll(), Poll::Ready(Ok(2))));
    assert!(clone.is_woken(), "the clone is next in line");
    assert_ready(&mut clone);
    assert_eq!(bulkhead.in_flight(), 1);
}

#[tokio::test]
async fn clones_share_one_limit() {
    let (bulkhead, mut services, mut handle) = services(Config::new(1, RECLAIM), 1);
    let mut clone = Spawn::new(services[0].get_ref().clone());
    assert_ready(&mut services[0]);
    let _response = spawn(services[0].call(1));
    handle.next_request().await.unwrap();
    assert_ready(&mut clone);
    assert_eq!(call_sheds(&mut clone, 2).reason(), ShedReason::LimitReached);
    assert_eq!(bulkhead.in_flight(), 1);
}

// ---- awaited through `ServiceExt::ready`, as a real caller would ------------

#[tokio::test(start_paused = true)]
async fn awaited_ready_waits_out_the_budget_then_call_sheds_with_wait_expired() {
    use tower::{Service, ServiceExt};
    let layer = ConcurrencyLayer::new(waiting(1));
    let bulkhead = layer.bulkhead();
    let mut service = layer.layer(tower::service_fn(
        |n: u32| async move { Ok::<_, BoxError>(n) },
    ));
    let _held = bulkhead.try_acquire().unwrap();
    let start = tokio::time::Instant::now();
    let ready = service
        .ready()
        .await
        .expect("saturation is not a poll_ready error");
    assert_eq!(
        start.elapsed(),
        WAIT,
        "ready exactly when the budget ran out"
    );
    let error = ready.call(1).await.unwrap_err();
    let shed = error.downcast_ref::<ServiceSaturated>().unwrap();
    assert_eq!(shed.reason(), ShedReason::WaitExpired);
}

#[tokio::test(start_paused = true)]
async fn awaited_ready_is_handed_a_slot_another_task_frees() {
    use tower::{Service, ServiceExt};
    let layer = ConcurrencyLayer::new(waiting(1));
    let bulkhead = layer.bulkhead();
    let mut service = layer.layer(tower::service_fn(
        |n: u32| async move { Ok::<_, BoxError>(n) },
    ));
    let held = bulkhead.try_acquire().unwrap();
    let holder = tokio::spawn(async move {
        tokio::time::sleep(WAIT / 2).await;
        drop(held);
    });
    let start = tokio::time::Instant::now();
    let answer = service.ready().await.unwrap().call(9).await.unwrap();
    assert_eq!(answer, 9);
    assert_eq!(
        start.elapsed(),
        WAIT / 2,
        "admitted the moment the slot came free"
    );
    holder.await.unwrap();
    assert_eq!(bulkhead.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_slot_freed_after_the_budget_ran_out_is_used_if_poll_ready_is_called_again() {
    let (bulkhead, mut services, mut handle) = services(waiting(1), 1);
    let held = bulkhead.try_acquire().unwrap();
    let service = &mut services[0];
    assert_pending(service);
    advance(WAIT).await;
    assert_ready(service); // the budget is spent: call would shed

    drop(held);
    assert_ready(service); // polled again beside a free slot
    handle.allow(1);
    let mut response = spawn(service.call(7));
    assert!(response.poll().is_pending(), "shed beside a free slot");
    let (request, reply) = handle.next_request().await.unwrap();
    assert_eq!(request, 7);
    reply.send_response(70);
    assert!(matches!(response.poll(), Poll::Ready(Ok(70))));
    assert_eq!(bulkhead.in_flight(), 0);
}
