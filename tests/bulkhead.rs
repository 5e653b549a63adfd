//! The core `Bulkhead` API, used from plain code without tower: admission,
//! shedding, the queries, and the absence of any cooldown.

use futures_util::FutureExt;
use std::future::{poll_fn, Future};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;
use tokio::task::coop;
use tower_inflight::{Bulkhead, Config, Event, ServiceSaturated, ShedReason};

const RECLAIM: Duration = Duration::from_secs(60);

fn bulkhead(limit: usize) -> Bulkhead {
    Bulkhead::new(Config::new(limit, RECLAIM))
}

#[test]
fn queries_track_permits_taken_and_dropped() {
    let bulkhead = bulkhead(3);
    assert_eq!(bulkhead.limit(), 3);
    assert_eq!(
        (bulkhead.in_flight(), bulkhead.available()),
        (0, 3),
        "a new bulkhead holds nothing"
    );
    assert!(!bulkhead.is_saturated());
    assert_eq!(bulkhead.waiting(), 0);

    let a = bulkhead.try_acquire().unwrap();
    let b = bulkhead.try_acquire().unwrap();
    assert_eq!((bulkhead.in_flight(), bulkhead.available()), (2, 1));
    assert!(!bulkhead.is_saturated());

    let c = bulkhead.try_acquire().unwrap();
    assert_eq!((bulkhead.in_flight(), bulkhead.available()), (3, 0));
    assert!(bulkhead.is_saturated());

    drop(b);
    assert_eq!((bulkhead.in_flight(), bulkhead.available()), (2, 1));
    assert!(!bulkhead.is_saturated());
    drop((a, c));
    assert_eq!((bulkhead.in_flight(), bulkhead.available()), (0, 3));
    assert_eq!(bulkhead.limit(), 3, "the limit never changes");
}

#[test]
fn try_acquire_over_the_limit_sheds_with_limit_reached_name_and_limit() {
    let bulkhead = Bulkhead::new(
        Config::new(2, RECLAIM)
            .name("payments")
            .retry_after(Duration::from_secs(7)),
    );
    let _held = [
        bulkhead.try_acquire().unwrap(),
        bulkhead.try_acquire().unwrap(),
    ];

    let shed: ServiceSaturated = bulkhead.try_acquire().unwrap_err();
    assert_eq!(shed.reason(), ShedReason::LimitReached);
    assert_eq!(shed.name(), Some("payments"));
    assert_eq!(shed.limit(), 2);
    #[cfg(feature = "http")]
    assert_eq!(shed.http_status().as_u16(), 503);
    assert_eq!(shed.retry_after(), Duration::from_secs(7));
    let shown = shed.to_string();
    assert!(shown.contains("payments") && shown.contains('2'), "{shown}");
    assert_eq!(bulkhead.in_flight(), 2, "a shed call holds nothing");
}

#[test]
fn shed_without_a_name_still_carries_the_limit() {
    let bulkhead = bulkhead(1);
    let _held = bulkhead.try_acquire().unwrap();
    let shed = bulkhead.try_acquire().unwrap_err();
    assert_eq!(shed.name(), None);
    assert_eq!(shed.limit(), 1);
    assert_eq!(bulkhead.name(), None);
}

#[test]
fn dropped_permit_frees_its_slot_at_once_without_cooldown() {
    // The clock never moves: the slot must be free with no time passing.
    let clock = tower_inflight::ManualClock::new();
    let bulkhead = Bulkhead::new(Config::new(1, RECLAIM).clock(clock.clone()));
    for _ in 0..100 {
        let permit = bulkhead.try_acquire().expect("the slot was just released");
        assert!(bulkhead.try_acquire().is_err());
        drop(permit);
        assert_eq!(bulkhead.in_flight(), 0);
    }
    assert_eq!(clock.elapsed(), Duration::ZERO);
}

#[test]
fn try_acquire_works_without_any_runtime() {
    // A plain #[test]: no tokio runtime, no tower.
    let bulkhead = bulkhead(1);
    let permit = bulkhead.try_acquire().unwrap();
    assert!(!permit.was_reclaimed());
    assert!(bulkhead.try_acquire().is_err());
    drop(permit);
    assert!(bulkhead.try_acquire().is_ok());
}

#[test]
fn acquire_without_wait_budget_resolves_on_first_poll_without_a_runtime() {
    let bulkhead = bulkhead(1);
    let permit = bulkhead
        .acquire()
        .now_or_never()
        .expect("without a wait budget acquire never parks")
        .expect("a slot is free");
    let shed = bulkhead
        .acquire()
        .now_or_never()
        .expect("without a wait budget acquire never parks")
        .unwrap_err();
    assert_eq!(shed.reason(), ShedReason::LimitReached);
    assert_eq!(bulkhead.waiting(), 0);
    drop(permit);
    assert_eq!(bulkhead.in_flight(), 0);
}

#[tokio::test]
async fn clones_share_one_limit() {
    let bulkhead = bulkhead(2);
    let other = bulkhead.clone();
    let _a = bulkhead.try_acquire().unwrap();
    let _b = other.try_acquire().unwrap();
    assert!(bulkhead.try_acquire().is_err());
    assert!(other.try_acquire().is_err());
    assert_eq!(other.in_flight(), 2);
}

#[tokio::test]
async fn permit_moved_into_a_spawned_task_holds_the_slot_until_the_task_ends() {
    let bulkhead = bulkhead(2);
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let permit = bulkhead.acquire().await.unwrap();
    let task = tokio::spawn(async move {
        let _permit = permit;
        released.await.ok();
    });
    tokio::task::yield_now().await;
    assert_eq!(bulkhead.in_flight(), 1);
    release.send(()).unwrap();
    task.await.unwrap();
    assert_eq!(bulkhead.in_flight(), 0);
}

#[tokio::test]
async fn plain_async_workers_never_exceed_the_limit() {
    let bulkhead = bulkhead(3);
    let peak = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut admitted = 0;
    let mut shed = 0;
    let mut tasks = Vec::new();
    let gate = Arc::new(tokio::sync::Notify::new());
    for _ in 0..10 {
        match bulkhead.try_acquire() {
            Ok(permit) => {
                admitted += 1;
                let (bulkhead, peak, gate) = (bulkhead.clone(), peak.clone(), gate.clone());
                tasks.push(tokio::spawn(async move {
                    peak.fetch_max(bulkhead.in_flight(), std::sync::atomic::Ordering::SeqCst);
                    gate.notified().await;
                    drop(permit);
                }));
            }
            Err(error) => {
                assert_eq!(error.reason(), ShedReason::LimitReached);
                shed += 1;
            }
        }
    }
    assert_eq!((admitted, shed), (3, 7));
    tokio::task::yield_now().await;
    assert!(bulkhead.is_saturated());
    assert_eq!(bulkhead.available(), 0);
    while !tasks.iter().all(|task| task.is_finished()) {
        gate.notify_waiters();
        tokio::task::yield_now().await;
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(peak.load(std::sync::atomic::Ordering::SeqCst), 3);
    assert_eq!(bulkhead.in_flight(), 0);
    assert_eq!(bulkhead.available(), 3);
}

#[tokio::test]
async fn tight_loop_of_admitted_and_released_permits_never_sheds() {
    let bulkhead = bulkhead(1);
    for round in 0..1000 {
        let permit = bulkhead
            .try_acquire()
            .unwrap_or_else(|shed| panic!("round {round}: shed beside a free slot: {shed}"));
        drop(permit);
    }
    assert_eq!(bulkhead.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn tight_loop_of_acquire_with_wait_budget_never_sheds_or_parks() {
    let bulkhead = Bulkhead::new(Config::new(1, RECLAIM).wait(Duration::from_millis(50)));
    for round in 0..1000 {
        let permit = bulkhead
            .acquire()
            .await
            .unwrap_or_else(|shed| panic!("round {round}: shed beside a free slot: {shed}"));
        drop(permit);
    }
    assert_eq!(bulkhead.in_flight(), 0);
    assert_eq!(bulkhead.waiting(), 0);
}

/// Polls `coop::poll_proceed` until tokio's cooperative budget of the current
/// task is spent, within one poll.
fn exhaust_coop_budget(cx: &mut std::task::Context<'_>) {
    while let Poll::Ready(restore) = coop::poll_proceed(cx) {
        restore.made_progress();
    }
    assert!(!coop::has_budget_remaining());
}

#[tokio::test(start_paused = true)]
async fn free_slot_is_granted_even_with_the_coop_budget_exhausted() {
    let plain = bulkhead(1);
    let waiting = Bulkhead::new(Config::new(1, RECLAIM).wait(Duration::from_millis(50)));
    poll_fn(|cx| {
        exhaust_coop_budget(cx);
        for round in 0..1000 {
            let permit = plain
                .try_acquire()
                .unwrap_or_else(|shed| panic!("round {round}: try_acquire shed: {shed}"));
            drop(permit);
            let mut acquire = std::pin::pin!(waiting.acquire());
            match acquire.as_mut().poll(cx) {
                Poll::Ready(Ok(permit)) => drop(permit),
                Poll::Ready(Err(shed)) => panic!("round {round}: acquire shed: {shed}"),
                Poll::Pending => panic!("round {round}: acquire parked beside a free slot"),
            }
        }
        assert!(!coop::has_budget_remaining());
        Poll::Ready(())
    })
    .await;
    assert_eq!(plain.in_flight() + waiting.in_flight(), 0);
}

#[test]
fn shed_reasons_have_stable_labels_and_readable_messages() {
    assert_eq!(ShedReason::LimitReached.as_str(), "limit");
    assert_eq!(ShedReason::WaitExpired.as_str(), "wait_expired");
    assert_eq!(ShedReason::TooManyWaiting.as_str(), "too_many_waiting");
    let bulkhead = Bulkhead::new(Config::new(1, RECLAIM).name("search"));
    let _held = bulkhead.try_acquire().unwrap();
    let shed = bulkhead.try_acquire().unwrap_err();
    assert_eq!(
        shed.to_string(),
        "bulkhead `search` saturated (limit 1): all slots in use"
    );
}

#[test]
fn service_saturated_survives_boxing_and_downcasting() {
    let bulkhead = Bulkhead::new(Config::new(1, RECLAIM).name("search"));
    let _held = bulkhead.try_acquire().unwrap();
    let boxed: tower_inflight::BoxError = bulkhead.try_acquire().unwrap_err().into();
    let shed = boxed
        .downcast_ref::<ServiceSaturated>()
        .expect("downcastable from BoxError");
    assert_eq!(shed.reason(), ShedReason::LimitReached);
    assert_eq!((shed.name(), shed.limit()), (Some("search"), 1));
}

#[test]
fn a_borrowed_permit_holds_its_slot_until_dropped_and_counts_as_admitted() {
    let bulkhead = Bulkhead::new(Config::new(2, Duration::from_secs(30)));
    let first = bulkhead.try_acquire_borrowed().unwrap();
    let second = bulkhead.try_acquire_borrowed().unwrap();
    assert!(!first.was_reclaimed());
    let shed = bulkhead.try_acquire_borrowed().unwrap_err();
    assert_eq!(shed.reason(), ShedReason::LimitReached);
    drop(first);
    assert_eq!(bulkhead.in_flight(), 1);
    drop(second);
    assert_eq!(bulkhead.in_flight(), 0);
    assert_eq!(bulkhead.status().totals.admitted, 2);
}

#[test]
fn a_panicking_event_hook_leaks_no_slot() {
    let bulkhead = Bulkhead::new(Config::new(1, Duration::from_secs(30)).on_event(|event| {
        if matches!(event, Event::Admitted) {
            panic!("a bug in the hook");
        }
    }));
    for _ in 0..3 {
        let caught = std::panic::catch_unwind(AssertUnwindSafe(|| drop(bulkhead.try_acquire())));
        assert!(caught.is_err());
        assert_eq!(bulkhead.in_flight(), 0);
    }
}

#[tokio::test(start_paused = true)]
async fn a_hook_that_panics_as_a_wait_ends_leaks_no_slot() {
    let bulkhead = Bulkhead::new(
        Config::new(1, Duration::from_secs(30))
            .wait(Duration::from_secs(1))
            .on_event(|event| {
                if matches!(event, Event::Waited { .. }) {
                    panic!("a bug in the hook");
                }
            }),
    );
    let held = bulkhead.try_acquire().unwrap();
    let waiter = tokio::spawn({
        let bulkhead = bulkhead.clone();
        async move { bulkhead.acquire().await.map(drop) }
    });
    tokio::task::yield_now().await;
    assert_eq!(bulkhead.waiting(), 1);
    drop(held); // handed to the waiter, whose hook panics as its wait ends
    assert!(waiter.await.unwrap_err().is_panic());
    assert_eq!((bulkhead.in_flight(), bulkhead.waiting()), (0, 0));
    assert!(bulkhead.try_acquire().is_ok());
}
