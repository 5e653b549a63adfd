//! Lifecycle: `close()`, `cancel_waiting()` and `drain()`.

mod support;

use support::spawn_acquire;

use std::time::Duration;
use tower::{Layer, Service, ServiceExt};
use tower_inflight::{
    BoxError, Bulkhead, ConcurrencyLayer, Config, ManualClock, ServiceSaturated, ShedReason, Ticket,
};

const WAIT: Duration = Duration::from_millis(100);

fn waiting(limit: usize) -> Bulkhead {
    Bulkhead::new(Config::new(limit, Duration::from_secs(30)).wait(WAIT))
}

#[test]
fn a_closed_bulkhead_refuses_new_calls_with_closed_even_with_free_slots() {
    let bulkhead = Bulkhead::new(Config::new(4, Duration::from_secs(30)));
    bulkhead.close();
    assert!(bulkhead.is_closed());
    let shed = bulkhead.try_acquire().unwrap_err();
    assert_eq!(shed.reason(), ShedReason::Closed);
    assert_eq!(bulkhead.status().totals.rejected_closed, 1);
}

#[tokio::test(start_paused = true)]
async fn closing_turns_away_parked_callers_at_once_and_lets_calls_in_flight_finish() {
    let bulkhead = waiting(1);
    let in_flight = bulkhead.try_acquire().unwrap();
    let parked = spawn_acquire(&bulkhead, Ticket::new());
    tokio::task::yield_now().await;
    assert_eq!(bulkhead.waiting(), 1);

    bulkhead.close();
    let refused = parked.await.unwrap().unwrap_err();
    assert_eq!(refused.reason(), ShedReason::Closed);
    assert_eq!(bulkhead.waiting(), 0);
    assert_eq!(bulkhead.in_flight(), 1, "the call in flight goes on");
    assert_eq!(
        bulkhead.acquire().await.unwrap_err().reason(),
        ShedReason::Closed
    );

    drop(in_flight);
    assert_eq!(bulkhead.in_flight(), 0);
    assert_eq!(
        bulkhead.try_acquire().unwrap_err().reason(),
        ShedReason::Closed
    );
}

#[tokio::test(start_paused = true)]
async fn cancel_waiting_turns_away_only_those_waiting_now() {
    let bulkhead = waiting(1);
    let held = bulkhead.try_acquire().unwrap();
    let parked: Vec<_> = (0..2)
        .map(|_| {
            let bulkhead = bulkhead.clone();
            tokio::spawn(async move { bulkhead.acquire().await.map(drop) })
        })
        .collect();
    tokio::task::yield_now().await;
    assert_eq!(bulkhead.waiting(), 2);

    bulkhead.cancel_waiting();
    for caller in parked {
        assert_eq!(
            caller.await.unwrap().unwrap_err().reason(),
            ShedReason::Cancelled
        );
    }
    assert_eq!(bulkhead.status().totals.rejected_cancelled, 2);

    // A caller arriving later waits as usual, and gets the slot.
    let later = spawn_acquire(&bulkhead, Ticket::new());
    tokio::task::yield_now().await;
    assert_eq!(bulkhead.waiting(), 1);
    drop(held);
    assert!(later.await.unwrap().is_ok());
}

#[tokio::test(start_paused = true)]
async fn drain_resolves_when_the_last_call_finishes() {
    let bulkhead = waiting(2);
    let first = bulkhead.try_acquire().unwrap();
    let second = bulkhead.try_acquire().unwrap();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(first);
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(second);
    });
    let started = tokio::time::Instant::now();
    bulkhead.drain(Duration::from_secs(1)).await.unwrap();
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(100) && took < Duration::from_millis(110),
        "{took:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn drain_is_woken_by_the_last_release_not_by_a_poll() {
    let bulkhead = waiting(1);
    let held = bulkhead.try_acquire().unwrap();
    // Between two of the drain's 100 ms rechecks: only the release's own
    // wake-up ends the drain at 130 ms.
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(130)).await;
        drop(held);
    });
    let started = tokio::time::Instant::now();
    bulkhead.drain(Duration::from_secs(1)).await.unwrap();
    assert_eq!(started.elapsed(), Duration::from_millis(130));
}

#[tokio::test(start_paused = true)]
async fn drain_reclaims_a_leaked_slot_at_its_deadline() {
    let clock = ManualClock::new();
    let reclaim = Duration::from_secs(30);
    let bulkhead = Bulkhead::new(Config::new(2, reclaim).max_bytes(100).clock(clock.clone()));
    std::mem::forget(bulkhead.try_acquire_bytes(60).unwrap());
    let timed_out = bulkhead
        .drain(Duration::from_millis(250))
        .await
        .unwrap_err();
    assert_eq!(timed_out.in_flight, 1, "held until its deadline");

    clock.advance(reclaim);
    bulkhead.drain(Duration::from_secs(1)).await.unwrap();
    assert_eq!(bulkhead.in_flight(), 0);
    assert_eq!(bulkhead.bytes_reserved(), 0, "its bytes came back with it");
    assert_eq!(bulkhead.status().totals.reclaimed, 1);
    assert!(bulkhead.try_acquire_bytes(100).is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_leaked_slot_the_drain_reclaims_goes_to_the_caller_waiting_for_it() {
    let clock = ManualClock::new();
    let reclaim = Duration::from_secs(30);
    let bulkhead = Bulkhead::new(
        Config::new(1, reclaim)
            .wait(Duration::from_secs(20))
            .clock(clock.clone()),
    );
    std::mem::forget(bulkhead.try_acquire().unwrap());
    let waiting = bulkhead.clone();
    let waiter = tokio::spawn(async move { waiting.acquire().await.map(drop) });
    while bulkhead.waiting() == 0 {
        tokio::task::yield_now().await;
    }
    clock.advance(reclaim);
    assert_eq!(bulkhead.drain(Duration::from_secs(5)).await, Ok(()));
    waiter
        .await
        .unwrap()
        .expect("the waiter got the reclaimed slot");
}

#[tokio::test(start_paused = true)]
async fn drain_with_the_longest_timeout_does_not_panic_and_waits_for_the_last_call() {
    let bulkhead = waiting(1);
    assert_eq!(bulkhead.drain(Duration::MAX).await, Ok(()), "idle");
    let held = bulkhead.try_acquire().unwrap();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(3600)).await;
        drop(held);
    });
    assert_eq!(bulkhead.drain(Duration::MAX).await, Ok(()), "busy");
    assert_eq!(bulkhead.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn drain_fails_at_its_deadline_saying_what_is_left() {
    let bulkhead = waiting(1);
    let _stuck = bulkhead.try_acquire().unwrap();
    let timed_out = bulkhead.drain(Duration::from_millis(30)).await.unwrap_err();
    assert_eq!((timed_out.in_flight, timed_out.waiting), (1, 0));
    assert!(timed_out.to_string().contains("1 in flight"));
}

#[tokio::test(start_paused = true)]
async fn a_service_parked_in_poll_ready_is_refused_by_close_and_call_sheds_with_closed() {
    let layer = ConcurrencyLayer::new(Config::new(1, Duration::from_secs(30)).wait(WAIT));
    let bulkhead = layer.bulkhead();
    let held = bulkhead.try_acquire().unwrap();
    let mut service = layer.layer(tower::service_fn(
        |x: u32| async move { Ok::<_, BoxError>(x) },
    ));
    let call = tokio::spawn(async move {
        let ready = service.ready().await?;
        ready.call(1).await
    });
    tokio::task::yield_now().await;
    assert_eq!(bulkhead.waiting(), 1);
    bulkhead.close();
    let error = call.await.unwrap().unwrap_err();
    let shed = error.downcast::<ServiceSaturated>().expect("saturation");
    assert_eq!(shed.reason(), ShedReason::Closed);
    drop(held);
}
