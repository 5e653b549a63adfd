//! `Bulkhead::status()`: the state now, lifetime totals, windowed rollups;
//! and the event hook.

use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower_inflight::{Bulkhead, Config, Event, ManualClock, ShedReason};

const MINUTE: Duration = Duration::from_secs(60);

fn manual(limit: usize) -> (Bulkhead, ManualClock) {
    let clock = ManualClock::new();
    let config = Config::new(limit, Duration::from_secs(30 * 60))
        .name("db")
        .clock(clock.clone());
    (Bulkhead::new(config), clock)
}

#[test]
fn status_reports_the_state_now() {
    let (bulkhead, _clock) = manual(3);
    let _held = bulkhead.try_acquire().unwrap();
    let status = bulkhead.status();
    assert_eq!(status.name.as_deref(), Some("db"));
    assert_eq!(
        (
            status.limit,
            status.in_flight,
            status.available,
            status.waiting
        ),
        (3, 1, 2, 0)
    );
    assert_eq!((status.bytes_reserved, status.max_bytes), (0, None));
}

#[test]
fn lifetime_totals_count_every_admission_and_rejection() {
    let (bulkhead, _clock) = manual(1);
    drop(bulkhead.try_acquire().unwrap());
    let held = bulkhead.try_acquire().unwrap();
    assert!(bulkhead.try_acquire().is_err());
    drop(held);
    let totals = bulkhead.status().totals;
    assert_eq!(totals.admitted, 2);
    assert_eq!(totals.rejected_limit, 1);
    assert_eq!(totals.rejected(), 1);
    assert_eq!(totals.reclaimed, 0);
}

#[test]
fn windows_cover_only_their_own_minutes() {
    let (bulkhead, clock) = manual(4);
    for _ in 0..3 {
        drop(bulkhead.try_acquire().unwrap());
    }
    clock.advance(MINUTE * 2);
    drop(bulkhead.try_acquire().unwrap());
    let status = bulkhead.status();
    assert_eq!(status.totals.admitted, 4);
    assert_eq!(
        status.last_minute.admitted, 1,
        "the first three were two minutes ago"
    );
    assert_eq!(status.last_5_minutes.admitted, 4);
    assert_eq!(status.last_day.admitted, 4);
    assert!(status.last_minute.span <= MINUTE);
}

#[test]
fn a_day_forgets_what_happened_before_it() {
    let (bulkhead, clock) = manual(4);
    drop(bulkhead.try_acquire().unwrap());
    clock.advance(MINUTE * 60 * 25);
    drop(bulkhead.try_acquire().unwrap());
    let status = bulkhead.status();
    assert_eq!(status.totals.admitted, 2);
    assert_eq!(status.last_day.admitted, 1);
    assert_eq!(status.last_hour.admitted, 1);
}

#[test]
fn windows_are_right_even_when_status_is_seldom_asked() {
    let (bulkhead, clock) = manual(4);
    // Minute by minute traffic, never a status() call in between.
    for minute in 0..20 {
        for _ in 0..minute {
            drop(bulkhead.try_acquire().unwrap());
        }
        clock.advance(MINUTE);
    }
    let status = bulkhead.status();
    // It is the very start of minute 20: the last 5 minutes are 15..=19.
    assert_eq!(status.last_5_minutes.admitted, (15..20).sum::<u64>());
    assert_eq!(status.last_5_minutes.span, MINUTE * 5);
    assert_eq!(status.last_15_minutes.admitted, (5..20).sum::<u64>());
    assert_eq!(status.last_hour.admitted, (0..20).sum::<u64>());
}

#[test]
fn peak_in_flight_is_seen_when_the_limit_sheds() {
    let (bulkhead, clock) = manual(2);
    let held = (
        bulkhead.try_acquire().unwrap(),
        bulkhead.try_acquire().unwrap(),
    );
    assert!(bulkhead.try_acquire().is_err());
    drop(held);
    assert_eq!(bulkhead.status().last_minute.peak_in_flight, 2);
    clock.advance(MINUTE * 3);
    drop(bulkhead.try_acquire().unwrap());
    let status = bulkhead.status();
    assert_eq!(status.last_5_minutes.peak_in_flight, 2);
    assert_eq!(
        status.last_minute.peak_in_flight, 1,
        "the peak of 2 was minutes ago"
    );
}

#[test]
fn throughput_is_admissions_per_second_of_the_span() {
    let (bulkhead, clock) = manual(4);
    clock.advance(MINUTE * 10);
    bulkhead.status(); // a minute boundary to start from
    for _ in 0..60 {
        drop(bulkhead.try_acquire().unwrap());
    }
    clock.advance(Duration::from_secs(30));
    // 30 s into minute 10: the last minute runs from the start of minute 9.
    let window = bulkhead.status().last_minute;
    assert_eq!(window.admitted, 60);
    assert_eq!(window.span, Duration::from_secs(90));
    assert!(
        (window.throughput - 60.0 / 90.0).abs() < 1e-9,
        "{}",
        window.throughput
    );
}

#[tokio::test(start_paused = true)]
async fn mean_wait_is_the_mean_of_the_waits_in_the_window() {
    let clock = ManualClock::new();
    let bulkhead = Bulkhead::new(
        Config::new(1, Duration::from_secs(30))
            .wait(Duration::from_millis(100))
            .clock(clock),
    );
    let held = bulkhead.try_acquire().unwrap();
    assert!(bulkhead.acquire().await.is_err()); // waits 100 ms in vain
    let waiter = tokio::spawn({
        let bulkhead = bulkhead.clone();
        async move { bulkhead.acquire().await.map(drop).is_ok() }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    drop(held);
    assert!(waiter.await.unwrap()); // waited 20 ms
    let status = bulkhead.status();
    assert_eq!(status.totals.waits, 2);
    assert_eq!(status.totals.rejected_wait_expired, 1);
    assert_eq!(
        status.last_minute.mean_wait,
        Some(Duration::from_millis(60))
    );
}

#[test]
fn the_hook_sees_every_event_in_order() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let clock = ManualClock::new();
    let config = Config::new(1, Duration::from_secs(30))
        .clock(clock.clone())
        .on_event({
            let seen = seen.clone();
            move |event| seen.lock().unwrap().push(*event)
        });
    let bulkhead = Bulkhead::new(config);
    std::mem::forget(bulkhead.try_acquire().unwrap());
    assert!(bulkhead.try_acquire().is_err());
    clock.advance(Duration::from_secs(30));
    drop(bulkhead.try_acquire().unwrap());
    assert_eq!(
        *seen.lock().unwrap(),
        [
            Event::Admitted,
            Event::Rejected {
                reason: ShedReason::LimitReached
            },
            Event::Reclaimed,
            Event::Admitted,
        ]
    );
}

#[test]
fn status_of_a_reset_bulkhead_keeps_its_history() {
    let (bulkhead, _clock) = manual(1);
    std::mem::forget(bulkhead.try_acquire().unwrap());
    bulkhead.reset();
    let status = bulkhead.status();
    assert_eq!(status.in_flight, 0);
    assert_eq!(status.totals.admitted, 1);
}

#[cfg(feature = "serde")]
#[test]
fn status_serializes_with_seconds_for_durations() {
    let (bulkhead, _clock) = manual(2);
    let _held = bulkhead.try_acquire().unwrap();
    let json = serde_json::to_value(bulkhead.status()).unwrap();
    assert_eq!(json["name"], "db");
    assert_eq!(json["in_flight"], 1);
    assert_eq!(json["totals"]["admitted"], 1);
    assert_eq!(json["totals"]["wait_time"], 0.0);
    assert!(json["last_hour"]["span"].is_f64());
    assert!(json["last_minute"]["mean_wait"].is_null());
}
