//! The saturation signal: stop parking callers when waiting is futile,
//! probe, and resume when a wait succeeds; never refuse a free slot.

mod support;

use support::spawn_acquire;

use std::time::Duration;
use tower_inflight::{Bulkhead, Config, ShedReason, Ticket};

const WAIT: Duration = Duration::from_millis(50);

/// Limit 1, a 50 ms wait, and a signal that rises once 3 of at least 3
/// waits within a second have expired.
fn bulkhead() -> Bulkhead {
    Bulkhead::new(
        Config::new(1, Duration::from_secs(30))
            .wait(WAIT)
            .saturation_signal(1.0, 3, Duration::from_secs(1)),
    )
}

async fn expire_waits(bulkhead: &Bulkhead, n: usize) {
    for _ in 0..n {
        let shed = bulkhead.acquire().await.unwrap_err();
        assert_eq!(shed.reason(), ShedReason::WaitExpired);
    }
}

#[tokio::test(start_paused = true)]
async fn futile_waits_raise_the_signal_and_callers_are_then_shed_at_once() {
    let bulkhead = bulkhead();
    let _held = bulkhead.try_acquire().unwrap();
    expire_waits(&bulkhead, 3).await;
    assert!(bulkhead.status().saturation_signal);

    // The first caller parks as the probe; the next is shed without waiting.
    let probe = spawn_acquire(&bulkhead, Ticket::new());
    tokio::task::yield_now().await;
    assert_eq!(bulkhead.waiting(), 1);
    let started = tokio::time::Instant::now();
    let shed = bulkhead.acquire().await.unwrap_err();
    assert_eq!(shed.reason(), ShedReason::Saturated);
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "shed at once, not after waiting"
    );
    assert_eq!(
        probe.await.unwrap().unwrap_err().reason(),
        ShedReason::WaitExpired
    );
    assert_eq!(bulkhead.status().totals.rejected_saturated, 1);
}

#[tokio::test(start_paused = true)]
async fn a_probe_that_gets_a_slot_lowers_the_signal() {
    let bulkhead = bulkhead();
    let held = bulkhead.try_acquire().unwrap();
    expire_waits(&bulkhead, 3).await;
    let probe = spawn_acquire(&bulkhead, Ticket::new());
    tokio::task::yield_now().await;
    drop(held);
    assert!(probe.await.unwrap().is_ok());
    assert!(!bulkhead.status().saturation_signal);

    // Parking works again.
    let held = bulkhead.try_acquire().unwrap();
    let waiter = spawn_acquire(&bulkhead, Ticket::new());
    tokio::task::yield_now().await;
    assert_eq!(bulkhead.waiting(), 1);
    drop(held);
    assert!(waiter.await.unwrap().is_ok());
}

#[tokio::test(start_paused = true)]
async fn the_signal_never_refuses_a_free_slot() {
    let bulkhead = bulkhead();
    let held = bulkhead.try_acquire().unwrap();
    expire_waits(&bulkhead, 3).await;
    drop(held);
    assert!(bulkhead.status().saturation_signal);
    assert!(bulkhead.acquire().await.is_ok());
    assert!(bulkhead.try_acquire().is_ok());
}

#[tokio::test(start_paused = true)]
async fn waits_that_mostly_succeed_do_not_raise_the_signal() {
    let bulkhead = bulkhead();
    for _ in 0..5 {
        let held = bulkhead.try_acquire().unwrap();
        let waiter = spawn_acquire(&bulkhead, Ticket::new());
        tokio::task::yield_now().await;
        drop(held);
        assert!(waiter.await.unwrap().is_ok());
    }
    let _held = bulkhead.try_acquire().unwrap();
    expire_waits(&bulkhead, 2).await; // 2 of 7 expired
    assert!(!bulkhead.status().saturation_signal);
}

#[tokio::test(start_paused = true)]
async fn old_expiries_fall_out_of_the_window() {
    let bulkhead = bulkhead();
    let _held = bulkhead.try_acquire().unwrap();
    expire_waits(&bulkhead, 2).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    expire_waits(&bulkhead, 2).await; // a new window: 2 waits, under min_waits
    assert!(!bulkhead.status().saturation_signal);
}

#[test]
fn a_signal_that_could_never_be_judged_is_refused() {
    let base = || Config::new(1, Duration::from_secs(30)).wait(WAIT);
    for config in [
        base().saturation_signal(0.0, 3, Duration::from_secs(1)),
        base().saturation_signal(1.5, 3, Duration::from_secs(1)),
        base().saturation_signal(f64::NAN, 3, Duration::from_secs(1)),
        base().saturation_signal(0.5, 0, Duration::from_secs(1)),
        base().saturation_signal(0.5, 3, Duration::ZERO),
    ] {
        assert_eq!(
            Bulkhead::try_new(config).unwrap_err().field(),
            "saturation_signal"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn the_signal_going_up_and_down_is_an_event_each_time() {
    use std::sync::{Arc, Mutex};
    use tower_inflight::Event;

    let changes = Arc::new(Mutex::new(Vec::new()));
    let bulkhead = Bulkhead::new(
        Config::new(1, Duration::from_secs(30))
            .wait(WAIT)
            .saturation_signal(1.0, 3, Duration::from_secs(1))
            .on_event({
                let changes = changes.clone();
                move |event| {
                    if let Event::SaturationSignal { raised } = event {
                        changes.lock().unwrap().push(*raised);
                    }
                }
            }),
    );
    let held = bulkhead.try_acquire().unwrap();
    expire_waits(&bulkhead, 4).await; // the fourth is the probe: it expires too
    assert_eq!(
        *changes.lock().unwrap(),
        [true],
        "raised once, not once a wait"
    );
    let probe = spawn_acquire(&bulkhead, Ticket::new());
    tokio::task::yield_now().await;
    drop(held);
    assert!(probe.await.unwrap().is_ok());
    assert_eq!(*changes.lock().unwrap(), [true, false]);
}
