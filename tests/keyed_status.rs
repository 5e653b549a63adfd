//! What a keyed bulkhead and its ceiling keep and report: a key keeps its
//! totals and no history of minutes, right across days and to the clock's
//! end; the ceiling, and a plain bulkhead built from the same configuration,
//! keep theirs; no setting a user cannot set shows in a configuration. And
//! where a caller of the ceiling itself stands in its line: ahead of the
//! keys taking turns, from the first turn.

use std::time::Duration;
use tower_inflight::keyed::{KeyedBulkhead, KeyedConfig};
use tower_inflight::{Bulkhead, Config, ManualClock, ShedReason};

const LONG: Duration = Duration::from_secs(30);
const MINUTE: Duration = Duration::from_secs(60);

/// Lets every spawned task run until it parks (no timer fires: the main
/// task never idles, so paused time does not move).
async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

/// The ceiling of a keyed bulkhead is built from its own configuration: it
/// keeps its minutes, so its windows are windows, not lifetime totals or
/// nothing.
#[test]
fn the_ceiling_keeps_its_history_of_minutes() {
    let clock = ManualClock::new();
    let keyed = KeyedBulkhead::new(
        KeyedConfig::new(Config::new(4, LONG).clock(clock.clone()))
            .ceiling(Config::new(8, LONG).clock(clock.clone())),
    );
    for _ in 0..3 {
        drop(keyed.try_acquire(&1u32).unwrap());
    }
    clock.advance(2 * MINUTE);
    drop(keyed.try_acquire(&1u32).unwrap());
    let ceiling = keyed.status(0).ceiling.unwrap();
    assert_eq!(ceiling.totals.admitted, 4);
    assert_eq!(ceiling.last_minute.admitted, 1, "{ceiling:?}");
    assert_eq!(ceiling.last_5_minutes.admitted, 4, "{ceiling:?}");
    // And a day on, the day's window still sees the minutes.
    for _ in 0..30 {
        clock.advance(MINUTE);
        drop(keyed.try_acquire(&1u32).unwrap());
    }
    let ceiling = keyed.status(0).ceiling.unwrap();
    // A window of n minutes spans n to n + 1: six calls, one a minute.
    assert_eq!(ceiling.last_5_minutes.admitted, 6, "{ceiling:?}");
    assert_eq!(ceiling.last_hour.admitted, 34, "{ceiling:?}");
}

/// A plain bulkhead built from the very configuration a keyed bulkhead was
/// given keeps its history: the flag is set on the keys' copy alone.
#[test]
fn a_plain_bulkhead_from_the_per_key_configuration_keeps_its_history() {
    let clock = ManualClock::new();
    let per_key = Config::new(4, LONG).clock(clock.clone());
    let keyed: KeyedBulkhead<u32> = KeyedBulkhead::new(KeyedConfig::new(per_key.clone()));
    drop(keyed.try_acquire(&7).unwrap());
    let plain = Bulkhead::new(per_key);
    for _ in 0..3 {
        drop(plain.try_acquire().unwrap());
    }
    clock.advance(2 * MINUTE);
    drop(plain.try_acquire().unwrap());
    let status = plain.status();
    assert_eq!(
        (status.last_minute.admitted, status.last_5_minutes.admitted),
        (1, 4),
        "{status:?}"
    );
}

/// A key's totals, as `status().busiest` reports them, stay right across a
/// day and more of minutes turning (the minute never seen to turn: no entry
/// written, nothing skipped), with sheds, waits and a peak at the limit;
/// and the clock run to the end of what a manual clock can date neither
/// overflows nor panics on `next_minute = u64::MAX`.
#[test]
fn a_key_s_totals_stay_right_across_days_and_to_the_clock_s_end() {
    let clock = ManualClock::new();
    let keyed: KeyedBulkhead<u32> =
        KeyedBulkhead::new(KeyedConfig::new(Config::new(2, LONG).clock(clock.clone())));
    let mut admitted = 0;
    let mut shed = 0;
    for minute in 0..(24 * 60 + 90) {
        clock.advance(MINUTE);
        let held = (
            keyed.try_acquire(&1).unwrap(),
            keyed.try_acquire(&1).unwrap(),
        );
        admitted += 2;
        if minute % 7 == 0 {
            assert_eq!(
                keyed.try_acquire(&1).unwrap_err().reason(),
                ShedReason::LimitReached
            );
            shed += 1;
        }
        if minute % 100 == 0 {
            let status = keyed.status(1);
            let key = &status.busiest[0];
            assert_eq!(key.in_flight, 2);
            assert_eq!(key.totals.admitted, admitted);
            assert_eq!(key.totals.rejected_limit, shed);
        }
        drop(held);
    }
    // Held across the end of a manual clock (about 51 days of ticks): the
    // clock stops short of its last tick; nothing wraps.
    let held = (
        keyed.try_acquire(&1).unwrap(),
        keyed.try_acquire(&1).unwrap(),
    );
    clock.advance(Duration::from_secs(60 * 86_400));
    // Both slots held since before are past their deadlines: reclaimed.
    let reclaiming = keyed.try_acquire(&1).unwrap();
    admitted += 3;
    assert!(reclaiming.key_permit().was_reclaimed());
    let status = keyed.status(1);
    let key = &status.busiest[0];
    assert_eq!(
        (
            key.totals.admitted,
            key.totals.rejected_limit,
            key.totals.reclaimed
        ),
        (admitted, shed, 1)
    );
    drop((held, reclaiming));
    assert!(keyed.status(1).busiest.is_empty());
}

/// The keys that report metrics (`metrics_per_key`) keep no history either,
/// and report their totals as any key does.
#[test]
fn a_key_that_reports_metrics_counts_as_any_key() {
    let clock = ManualClock::new();
    let keyed: KeyedBulkhead<u32> = KeyedBulkhead::new(
        KeyedConfig::new(Config::new(1, LONG).clock(clock.clone()).name("tenants"))
            .metrics_per_key(|key: &u32| (*key == 1).then(|| "one".to_owned())),
    );
    for _ in 0..5 {
        clock.advance(MINUTE);
        let held = keyed.try_acquire(&1).unwrap();
        assert!(keyed.try_acquire(&1).is_err());
        let status = keyed.status(1);
        drop(held);
        assert_eq!(status.busiest[0].in_flight, 1);
    }
    let held = keyed.try_acquire(&1).unwrap();
    let status = keyed.status(1);
    assert_eq!(
        (
            status.busiest[0].totals.admitted,
            status.busiest[0].totals.rejected_limit
        ),
        (6, 5)
    );
    drop(held);
}

// ---------------------------------------------------------------------------
// A caller of the ceiling itself.
// ---------------------------------------------------------------------------

/// A caller of the ceiling's own `acquire` goes ahead of a key's caller
/// taking its turn, even one that came first, and even at the first turn
/// (the virtual time at 0, where a key's tag starts).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_direct_caller_of_the_ceiling_goes_ahead_of_a_key_taking_its_turn() {
    let keyed: KeyedBulkhead<u32> = KeyedBulkhead::new(
        KeyedConfig::new(Config::new(2, LONG))
            .ceiling(Config::new(2, LONG).wait(Duration::from_secs(10))),
    );
    let held = (
        keyed.try_acquire(&1).unwrap(),
        keyed.try_acquire(&1).unwrap(),
    );
    let by_key = tokio::spawn({
        let keyed = keyed.clone();
        async move { keyed.acquire(&2).await }
    });
    settle().await;
    let direct = tokio::spawn({
        let ceiling = keyed.ceiling().unwrap().clone();
        async move { ceiling.acquire().await }
    });
    settle().await;
    assert_eq!(keyed.ceiling().unwrap().waiting(), 2);
    let (one, _other) = held;
    drop(one);
    settle().await;
    assert_eq!(keyed.ceiling().unwrap().waiting(), 1, "one served");
    let direct_first = direct.is_finished();
    let key_first = by_key.is_finished();
    if key_first {
        assert!(
            by_key.await.unwrap().is_ok(),
            "the key's caller was admitted"
        );
    } else {
        by_key.abort();
    }
    direct.abort();
    assert!(
        direct_first && !key_first,
        "the ceiling's slot went to key 2's caller in turn, not to the direct caller of \
         the ceiling"
    );
}

/// The same with a direct caller of a positive priority (100, more than a
/// key's first two tags, 0 and 64): still ahead of the keys' turns.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_direct_caller_of_priority_100_goes_ahead_of_keys_in_their_first_turns() {
    let keyed: KeyedBulkhead<u32> = KeyedBulkhead::new(
        KeyedConfig::new(Config::new(2, LONG))
            .ceiling(Config::new(2, LONG).wait(Duration::from_secs(10))),
    );
    let held = (
        keyed.try_acquire(&1).unwrap(),
        keyed.try_acquire(&1).unwrap(),
    );
    // Two callers of key 2 in line: tags 0 and 64.
    let by_key: Vec<_> = (0..2)
        .map(|_| {
            let keyed = keyed.clone();
            tokio::spawn(async move { keyed.acquire(&2).await })
        })
        .collect();
    settle().await;
    let direct = tokio::spawn({
        let ceiling = keyed.ceiling().unwrap().clone();
        async move { ceiling.acquire_with_priority(100).await }
    });
    settle().await;
    assert_eq!(keyed.ceiling().unwrap().waiting(), 3);
    drop(held);
    settle().await;
    assert_eq!(keyed.ceiling().unwrap().waiting(), 1, "two served");
    let direct_served = direct.is_finished();
    let keys_served = by_key.iter().filter(|task| task.is_finished()).count();
    for task in by_key {
        if task.is_finished() {
            assert!(task.await.unwrap().is_ok(), "the key's caller was admitted");
        } else {
            task.abort();
        }
    }
    direct.abort();
    assert!(
        direct_served,
        "both slots freed went to key 2's callers in turn ({keys_served} served), none to \
         the direct caller of priority 100"
    );
}
