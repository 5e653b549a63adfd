//! CoDel: once the line of waiting callers has stood for a whole interval,
//! new waits are cut to the target; a line that empties gets full waits.

use std::time::Duration;
use tokio::time::Instant;
use tower_inflight::{Bulkhead, Config, ShedReason};

const WAIT: Duration = Duration::from_millis(100);
const TARGET: Duration = Duration::from_millis(10);
const INTERVAL: Duration = Duration::from_millis(50);

fn bulkhead() -> Bulkhead {
    Bulkhead::new(
        Config::new(1, Duration::from_secs(30))
            .wait(WAIT)
            .codel(TARGET, INTERVAL),
    )
}

/// Waits for a slot and returns how long it waited and how it ended.
async fn timed_wait(bulkhead: Bulkhead) -> (Duration, Option<ShedReason>) {
    let start = Instant::now();
    let outcome = bulkhead.acquire().await.err().map(|shed| shed.reason());
    (start.elapsed(), outcome)
}

#[tokio::test(start_paused = true)]
async fn a_caller_joining_a_line_that_has_stood_a_whole_interval_waits_only_the_target() {
    let bulkhead = bulkhead();
    let _held = bulkhead.try_acquire().unwrap();
    let first = tokio::spawn(timed_wait(bulkhead.clone()));
    tokio::time::sleep(INTERVAL + Duration::from_millis(10)).await;
    assert!(
        bulkhead.status().waits_cut_short,
        "the line has stood 60 ms"
    );
    let (late_waited, late) = timed_wait(bulkhead.clone()).await;
    assert_eq!(late, Some(ShedReason::WaitExpired));
    assert_eq!(late_waited, TARGET, "cut to the target");
    let (first_waited, first) = first.await.unwrap();
    assert_eq!(first, Some(ShedReason::WaitExpired));
    assert_eq!(
        first_waited, WAIT,
        "a caller already waiting keeps its budget"
    );
}

#[tokio::test(start_paused = true)]
async fn a_line_that_empties_gives_full_waits_again() {
    let bulkhead = bulkhead();
    let held = bulkhead.try_acquire().unwrap();
    let first = tokio::spawn(timed_wait(bulkhead.clone()));
    tokio::time::sleep(INTERVAL + Duration::from_millis(10)).await;
    assert!(bulkhead.status().waits_cut_short);
    drop(held); // the waiting caller gets the slot: the line is empty
    let (_, first) = first.await.unwrap();
    assert_eq!(first, None);
    assert!(!bulkhead.status().waits_cut_short);

    let _held = bulkhead.try_acquire().unwrap();
    let (waited, outcome) = timed_wait(bulkhead.clone()).await;
    assert_eq!(outcome, Some(ShedReason::WaitExpired));
    assert_eq!(waited, WAIT, "a burst gets the whole budget");
}

#[tokio::test(start_paused = true)]
async fn a_line_younger_than_the_interval_gives_full_waits() {
    let bulkhead = bulkhead();
    let _held = bulkhead.try_acquire().unwrap();
    let first = tokio::spawn(timed_wait(bulkhead.clone()));
    tokio::time::sleep(INTERVAL - Duration::from_millis(10)).await;
    let (waited, _) = timed_wait(bulkhead.clone()).await;
    assert_eq!(waited, WAIT);
    first.await.unwrap();
}

#[test]
fn a_codel_target_of_zero_or_not_shorter_than_wait_is_refused() {
    let base = Config::new(4, Duration::from_secs(30)).wait(WAIT);
    for config in [
        base.clone().codel(Duration::ZERO, INTERVAL),
        base.clone().codel(TARGET, Duration::ZERO),
        base.clone().codel(WAIT, INTERVAL),
    ] {
        assert_eq!(config.validate().unwrap_err().field(), "codel");
    }
    assert!(base.codel(TARGET, INTERVAL).validate().is_ok());
}
