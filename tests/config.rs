//! Every configuration the bulkhead refuses, and how it says so: `try_new`
//! returns a `ConfigError` naming the field, `new` panics naming it.

use std::time::Duration;
use tower_inflight::{Bulkhead, ConcurrencyLayer, Config, ConfigError, ManualClock, ShedReason};

const SECOND: Duration = Duration::from_secs(1);
const DAY: Duration = Duration::from_secs(86_400);
const YEAR: Duration = Duration::from_secs(365 * 86_400);
const MAX_LIMIT: usize = 1 << 20;

/// Checks that both fallible constructors refuse `config` for `field`, and
/// that the error's `Display` names the field.
fn assert_refused(config: Config, field: &str) {
    let from_bulkhead: ConfigError = Bulkhead::try_new(config.clone())
        .map(|_| ())
        .expect_err("Bulkhead::try_new accepted a bad config");
    let from_layer: ConfigError = ConcurrencyLayer::try_new(config.clone())
        .map(|_| ())
        .expect_err("ConcurrencyLayer::try_new accepted a bad config");
    let from_validate = config
        .validate()
        .expect_err("validate accepted a bad config");

    for error in [&from_bulkhead, &from_layer, &from_validate] {
        assert_eq!(error.field(), field, "wrong field in {error}");
        let shown = error.to_string();
        assert!(
            shown.contains(&format!("`{field}`")),
            "Display {shown:?} does not name `{field}`"
        );
    }
    assert_eq!(from_bulkhead, from_layer);
    // It is a std error, so it can travel in a `Box<dyn Error>`.
    let _: Box<dyn std::error::Error + Send + Sync> = Box::new(from_bulkhead);
}

#[test]
fn zero_limit_is_refused_naming_limit() {
    assert_refused(Config::new(0, SECOND), "limit");
}

#[test]
fn limit_over_the_maximum_is_refused_naming_limit() {
    assert_refused(Config::new(MAX_LIMIT + 1, SECOND), "limit");
    assert_refused(Config::new(usize::MAX, SECOND), "limit");
}

#[test]
fn limit_at_the_maximum_is_accepted() {
    let bulkhead = Bulkhead::try_new(Config::new(MAX_LIMIT, SECOND)).expect("1,048,576 is allowed");
    assert_eq!(bulkhead.limit(), MAX_LIMIT);
    assert_eq!(bulkhead.available(), MAX_LIMIT);
}

#[test]
fn zero_reclaim_after_is_refused_naming_reclaim_after() {
    assert_refused(Config::new(1, Duration::ZERO), "reclaim_after");
}

#[test]
fn reclaim_after_past_what_a_slot_can_date_is_refused_naming_reclaim_after_and_the_maximum() {
    for reclaim_after in [Duration::from_secs(u64::MAX), Duration::MAX, 200 * YEAR] {
        assert_refused(Config::new(1, reclaim_after), "reclaim_after");
        let error = Config::new(1, reclaim_after).validate().unwrap_err();
        assert!(error.to_string().contains("maximum of"), "{error}");
    }
    // A manual clock counts microseconds: it can date about 51 days.
    assert_refused(
        Config::new(1, 20 * DAY).clock(ManualClock::new()),
        "reclaim_after",
    );
}

#[test]
fn the_longest_reclaim_after_accepted_still_holds_the_limit() {
    for config in [
        Config::new(1, 30 * YEAR),
        Config::new(1, 10 * DAY).clock(ManualClock::new()),
    ] {
        let bulkhead = Bulkhead::try_new(config).expect("accepted");
        let held = bulkhead.try_acquire().unwrap();
        assert_eq!(bulkhead.in_flight(), 1);
        assert!(bulkhead.try_acquire().is_err(), "the limit holds");
        drop(held);
        assert!(bulkhead.try_acquire().is_ok());
    }
}

#[test]
fn a_manual_clock_run_past_what_a_slot_can_date_keeps_the_limit() {
    let clock = ManualClock::new();
    let bulkhead = Bulkhead::new(Config::new(1, 10 * DAY).clock(clock.clone()));
    clock.advance(Duration::MAX);
    let held = bulkhead.try_acquire().unwrap();
    assert_eq!(bulkhead.in_flight(), 1);
    assert!(bulkhead.try_acquire().is_err(), "the limit holds");
    drop(held);
    std::mem::forget(bulkhead.try_acquire().unwrap());
    clock.advance(20 * DAY);
    assert!(
        bulkhead.try_acquire().is_err(),
        "held, never reclaimed early"
    );
}

#[test]
fn wait_equal_to_reclaim_after_is_refused_naming_wait() {
    assert_refused(Config::new(1, SECOND).wait(SECOND), "wait");
}

#[test]
fn wait_longer_than_reclaim_after_is_refused_naming_wait() {
    assert_refused(Config::new(1, SECOND).wait(SECOND * 2), "wait");
    assert_refused(Config::new(1, SECOND).wait(Duration::MAX), "wait");
}

#[test]
fn wait_just_under_reclaim_after_is_accepted() {
    let config = Config::new(1, SECOND).wait(SECOND - Duration::from_nanos(1));
    assert!(Bulkhead::try_new(config.clone()).is_ok());
    assert!(ConcurrencyLayer::try_new(config).is_ok());
}

#[test]
fn zero_max_waiting_is_refused_naming_max_waiting() {
    assert_refused(
        Config::new(1, SECOND)
            .wait(Duration::from_millis(10))
            .max_waiting(0),
        "max_waiting",
    );
    // Refused even without a wait budget: it can only be a mistake.
    assert_refused(Config::new(1, SECOND).max_waiting(0), "max_waiting");
}

#[test]
fn zero_max_bytes_is_refused_naming_max_bytes() {
    assert_refused(Config::new(1, SECOND).max_bytes(0), "max_bytes");
}

#[test]
fn zero_wait_is_accepted_and_means_no_wait() {
    let bulkhead = Bulkhead::try_new(Config::new(1, SECOND).wait(Duration::ZERO))
        .expect("a zero wait is valid");
    assert_eq!(bulkhead.config().clone().validate(), Ok(()));
    let _held = bulkhead.try_acquire().unwrap();

    // `acquire` does not park: with no budget it sheds at once, without even
    // needing a runtime to time a wait.
    let shed = futures_util::FutureExt::now_or_never(bulkhead.acquire())
        .expect("a zero wait must not park")
        .expect_err("the only slot is held");
    assert_eq!(shed.reason(), ShedReason::LimitReached);
    assert_eq!(bulkhead.waiting(), 0);
}

#[test]
fn zero_wait_is_accepted_even_when_reclaim_after_is_tiny() {
    assert!(
        Bulkhead::try_new(Config::new(1, Duration::from_nanos(1)).wait(Duration::ZERO)).is_ok()
    );
}

#[test]
#[should_panic(expected = "`limit`")]
fn layer_new_panics_naming_limit_when_zero() {
    let _ = ConcurrencyLayer::new(Config::new(0, SECOND));
}

#[test]
#[should_panic(expected = "`limit`")]
fn layer_new_panics_naming_limit_when_over_the_maximum() {
    let _ = ConcurrencyLayer::new(Config::new(MAX_LIMIT + 1, SECOND));
}

#[test]
#[should_panic(expected = "`reclaim_after`")]
fn layer_new_panics_naming_reclaim_after_when_zero() {
    let _ = ConcurrencyLayer::new(Config::new(1, Duration::ZERO));
}

#[test]
#[should_panic(expected = "`wait`")]
fn layer_new_panics_naming_wait_when_not_shorter_than_reclaim_after() {
    let _ = ConcurrencyLayer::new(Config::new(1, SECOND).wait(SECOND));
}

#[test]
#[should_panic(expected = "`max_waiting`")]
fn layer_new_panics_naming_max_waiting_when_zero() {
    let _ = ConcurrencyLayer::new(
        Config::new(1, SECOND)
            .wait(Duration::from_millis(1))
            .max_waiting(0),
    );
}

#[test]
#[should_panic(expected = "`max_bytes`")]
fn layer_new_panics_naming_max_bytes_when_zero() {
    let _ = ConcurrencyLayer::new(Config::new(1, SECOND).max_bytes(0));
}

#[test]
#[should_panic(expected = "`limit`")]
fn bulkhead_new_panics_naming_the_field() {
    let _ = Bulkhead::new(Config::new(0, SECOND));
}
