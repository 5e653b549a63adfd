//! What a keyed bulkhead and its ceiling keep and report: a key keeps its
//! totals and no history of minutes, right across days and to the clock's
//! end; the ceiling, and a plain bulkhead built from the same configuration,
//! keep theirs. And
//! where a caller of the ceiling itself stands in its line, whatever its
//! priority: behind keys below their share, ahead of the keys taking turns,
//! from the first turn on. And limits and labels at their extremes.

use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower_inflight::keyed::{KeyedBulkhead, KeyedConfig, KeyedPermit};
use tower_inflight::{Bulkhead, Config, ManualClock, ShedReason};

const LONG: Duration = Duration::from_secs(30);
const MINUTE: Duration = Duration::from_secs(60);
const WAIT: Duration = Duration::from_secs(10);

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
    // Both slots held since before are past their deadlines: the claim
    // that finds the key full reclaims both.
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
        (admitted, shed, 2)
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

/// A keyed bulkhead whose ceiling of 2 (with a wait budget) is full, both
/// slots held by key 1.
fn ceiling_full_of_key_one() -> (KeyedBulkhead<u32>, (KeyedPermit, KeyedPermit)) {
    let keyed = KeyedBulkhead::new(
        KeyedConfig::new(Config::new(2, LONG))
            .ceiling(Config::new(2, LONG).wait(Duration::from_secs(10))),
    );
    let held = (
        keyed.try_acquire(&1).unwrap(),
        keyed.try_acquire(&1).unwrap(),
    );
    (keyed, held)
}

/// A caller of the ceiling's own `acquire` goes ahead of a key's caller
/// taking its turn, even one that came first, and even at the first turn
/// (the virtual time at 0, where a key's tag starts).
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_direct_caller_of_the_ceiling_goes_ahead_of_a_key_taking_its_turn() {
    let (keyed, held) = ceiling_full_of_key_one();
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
    let (keyed, held) = ceiling_full_of_key_one();
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

type Order = Arc<Mutex<Vec<String>>>;

/// A keyed caller of `key` that notes its name once both slots are held,
/// then holds them 1 ms (paused time).
fn keyed_caller(
    keyed: &KeyedBulkhead<&'static str>,
    key: &'static str,
    order: &Order,
) -> tokio::task::JoinHandle<()> {
    let (keyed, order) = (keyed.clone(), order.clone());
    tokio::spawn(async move {
        let permit = keyed.acquire(&key).await.expect("keyed caller admitted");
        order.lock().unwrap().push(format!("key:{key}"));
        tokio::time::sleep(Duration::from_millis(1)).await;
        drop(permit);
    })
}

/// Callers of `keys` come to the ceiling's line, then a direct caller of
/// priority `i32::MAX`; `held`, the ceiling's one slot, is let go: the order
/// they were served in.
async fn keys_then_a_direct_caller(
    keyed: &KeyedBulkhead<&'static str>,
    held: tower_inflight::Permit,
    keys: [&'static str; 2],
) -> Vec<String> {
    let order: Order = Arc::default();
    let mut tasks: Vec<_> = keys
        .iter()
        .map(|key| keyed_caller(keyed, key, &order))
        .collect();
    settle().await;
    tasks.push(direct_caller(keyed, i32::MAX, &order));
    settle().await;
    drop(held);
    for task in tasks {
        task.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    order
}

/// A direct caller of the ceiling at `priority`.
fn direct_caller(
    keyed: &KeyedBulkhead<&'static str>,
    priority: i32,
    order: &Order,
) -> tokio::task::JoinHandle<()> {
    let (ceiling, order) = (keyed.ceiling().unwrap().clone(), order.clone());
    tokio::spawn(async move {
        let permit = ceiling
            .acquire_with_priority(priority)
            .await
            .expect("direct caller admitted");
        order.lock().unwrap().push(format!("direct:{priority}"));
        tokio::time::sleep(Duration::from_millis(1)).await;
        drop(permit);
    })
}

/// Every extreme of i32 against keys in turn (first turn, tag 0) and a key
/// below its share: below-share first, then every direct caller by its
/// priority (i32::MIN .. i32::MAX), then the keys in turn, whatever the
/// arrival order.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn every_i32_priority_sits_between_below_share_and_the_turns() {
    let keyed: KeyedBulkhead<&'static str> = KeyedBulkhead::new(
        KeyedConfig::new(Config::new(4, LONG))
            .ceiling(Config::new(1, LONG).wait(WAIT))
            .guarantee_per_key(|key: &&str| usize::from(*key == "share")),
    );
    let held = keyed.ceiling().unwrap().try_acquire().unwrap();
    let order: Order = Arc::default();
    let mut tasks = Vec::new();
    // Keys in turn arrive first, then directs (highest priority value
    // first), then the key below its share last of all.
    tasks.push(keyed_caller(&keyed, "a", &order));
    settle().await;
    tasks.push(keyed_caller(&keyed, "b", &order));
    settle().await;
    for priority in [i32::MAX, i32::MAX - 1, 1, 0, -1, i32::MIN + 1, i32::MIN] {
        tasks.push(direct_caller(&keyed, priority, &order));
        settle().await;
    }
    tasks.push(keyed_caller(&keyed, "share", &order));
    settle().await;
    assert_eq!(keyed.ceiling().unwrap().waiting(), 10);
    drop(held);
    for task in tasks {
        task.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    assert_eq!(
        order,
        [
            "key:share",
            &format!("direct:{}", i32::MIN),
            &format!("direct:{}", i32::MIN + 1),
            "direct:-1",
            "direct:0",
            "direct:1",
            &format!("direct:{}", i32::MAX - 1),
            &format!("direct:{}", i32::MAX),
            "key:a",
            "key:b",
        ]
    );
}

/// After the virtual time has moved on (many turns served), a direct caller
/// of i32::MAX that comes last still goes ahead of keys in turn that came
/// before it, and the keys still alternate.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn direct_i32_max_is_ahead_of_turns_after_many_turns() {
    let keyed: KeyedBulkhead<&'static str> = KeyedBulkhead::new(
        KeyedConfig::new(Config::new(1, LONG).wait(WAIT)).ceiling(Config::new(1, LONG).wait(WAIT)),
    );
    // Move the virtual time: 40 turns of two keys served through the line.
    let held = keyed.ceiling().unwrap().try_acquire().unwrap();
    let warm: Order = Arc::default();
    let mut tasks = Vec::new();
    for _ in 0..20 {
        tasks.push(keyed_caller(&keyed, "x", &warm));
        tasks.push(keyed_caller(&keyed, "y", &warm));
    }
    settle().await;
    drop(held);
    for task in tasks {
        task.await.unwrap();
    }
    let warm = warm.lock().unwrap().clone();
    assert_eq!(warm.len(), 40);
    for pair in warm.chunks(2) {
        assert_ne!(pair[0], pair[1], "keys alternate: {warm:?}");
    }

    let held = keyed.ceiling().unwrap().try_acquire().unwrap();
    let order = keys_then_a_direct_caller(&keyed, held, ["x", "new"]).await;
    assert_eq!(order[0], format!("direct:{}", i32::MAX), "{order:?}");
}

/// A turn given up (wait expired) refunds its cost without disturbing the
/// order against direct callers: the key's next caller is still behind a
/// later direct caller, and ahead of nobody it should not be.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_refunded_turn_keeps_direct_callers_ahead() {
    let keyed: KeyedBulkhead<&'static str> = KeyedBulkhead::new(
        KeyedConfig::new(Config::new(4, LONG)).ceiling(Config::new(1, LONG).wait(WAIT)),
    );
    let held = keyed.ceiling().unwrap().try_acquire().unwrap();
    // Three callers of "a" wait out the ceiling's budget.
    let gave_up: Vec<_> = (0..3)
        .map(|_| {
            let keyed = keyed.clone();
            tokio::spawn(async move { keyed.acquire(&"a").await.map(drop) })
        })
        .collect();
    for task in gave_up {
        assert!(task.await.unwrap().is_err());
    }
    let order = keys_then_a_direct_caller(&keyed, held, ["b", "a"]).await;
    assert_eq!(
        order,
        [&format!("direct:{}", i32::MAX), "key:b", "key:a"],
        "{order:?}"
    );
}

/// A limit function returning 0 or usize::MAX, with a ceiling and without,
/// with labels that report metrics (odd ones too): the key's bulkhead is
/// made (the `expect` in `Keys::make` is never reached), its limit held to
/// 1 ..= the ceiling's limit, or 1 ..= 2^20.
#[test]
fn extreme_limits_and_labels_never_reach_the_fallback_panic() {
    for ceiling in [None, Some(3usize)] {
        let mut config = KeyedConfig::new(Config::new(2, LONG).name("t"))
            .limit_per_key(|key: &u32| match key {
                0 => 0,
                1 => usize::MAX,
                2 => (1 << 20) + 1,
                _ => 2,
            })
            .metrics_per_key(|key: &u32| match key {
                0 => Some(String::new()),
                1 => Some("x".repeat(10_000)),
                2 => Some("\u{0}/\n".to_owned()),
                _ => None,
            });
        if let Some(limit) = ceiling {
            config = config.ceiling(Config::new(limit, LONG));
        }
        let keyed = KeyedBulkhead::new(config);
        let top = ceiling.unwrap_or(1 << 20);
        for (key, limit) in [(0u32, 1), (1, top), (2, top), (3, 2)] {
            let permit = keyed.try_acquire(&key).unwrap();
            let status = keyed.status(8);
            let found = status.busiest.iter().find(|s| s.key == key).unwrap();
            assert_eq!(found.limit, limit, "key {key}, ceiling {ceiling:?}");
            drop(permit);
        }
    }
}
