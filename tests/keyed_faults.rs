//! Faults of keyed bulkheads found by an adversarial reading, each a
//! promise of the docs (or a plain invariant) that an earlier version
//! broke: races between the first calls of a new key, callers that gave up
//! (or were shed after their turn came) moving their key's turn back or its
//! callers still in line, weights rounded away, admissions counted
//! twice (also for a call the ceiling shed after it waited), a status call
//! or a panicking `Hash` pinning keys, a leaked
//! permit's gauge outliving its key, sheds for too many keys counted
//! nowhere, a key's share of the ceiling misjudged while a caller of it
//! was on its way to the ceiling's line, and a key evicted while its caller
//! waited for the ceiling with the key's slot.
#![cfg(all(feature = "metrics", feature = "axum"))]

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;
use tower::{service_fn, ServiceBuilder, ServiceExt};
use tower_inflight::keyed::{KeyedBulkhead, KeyedConcurrencyLayer, KeyedConfig, KeyedPermit};
use tower_inflight::{BoxError, Config, ManualClock, ShedReason};

mod support;

use support::turns::{order_served, served_in_turns};

const LONG: Duration = Duration::from_secs(30);
const GENEROUS: Duration = Duration::from_secs(60);

/// A per-key limit and a ceiling of 8 (a key's limit is held to the
/// ceiling's), each waiting up to `wait`.
fn eight_at_once(wait: Duration) -> KeyedConfig<&'static str> {
    KeyedConfig::new(Config::new(8, LONG).wait(wait)).ceiling(Config::new(8, LONG).wait(wait))
}

/// `config`'s keyed bulkhead with its ceiling of 8 full, held by key
/// "holder".
fn filled(config: KeyedConfig<&'static str>) -> (KeyedBulkhead<&'static str>, Vec<KeyedPermit>) {
    let keyed = KeyedBulkhead::new(config);
    let held = (0..8)
        .map(|_| keyed.try_acquire(&"holder").unwrap())
        .collect();
    (keyed, held)
}

// ---------------------------------------------------------------------------
// Two first calls of the same new key: the second is refused as if it
//    were a key too many (keys.rs `insert`: the reservation is per caller,
//    not per key).
// ---------------------------------------------------------------------------

/// A limit function that blocks its first call until told to go on, and
/// says when it has been entered.
fn blocking_limit(
    limit: usize,
) -> (
    impl Fn(&&'static str) -> usize + Send + Sync + 'static,
    mpsc::Receiver<()>,
    mpsc::Sender<()>,
) {
    let (entered_tx, entered_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let entered_tx = Mutex::new(entered_tx);
    let go_rx = Mutex::new(go_rx);
    let first = AtomicBool::new(true);
    let f = move |_: &&'static str| {
        if first.swap(false, Ordering::SeqCst) {
            entered_tx.lock().unwrap().send(()).unwrap();
            let _ = go_rx.lock().unwrap().recv_timeout(GENEROUS);
        }
        limit
    };
    (f, entered_rx, go_tx)
}

/// `max_keys(1)` and no key held at all: two concurrent first calls of
/// key "a" (which has room for both) should both be admitted. The second
/// is shed with `TooManyKeys`, as if "a" were a second key.
#[test]
fn two_first_calls_of_one_new_key_are_not_refused_as_too_many_keys() {
    let (limit, entered, go) = blocking_limit(2);
    let keyed = KeyedBulkhead::new(
        KeyedConfig::new(Config::new(2, LONG))
            .limit_per_key(limit)
            .max_keys(1),
    );
    let first = std::thread::spawn({
        let keyed = keyed.clone();
        move || keyed.try_acquire(&"a").map(drop).map_err(|e| e.reason())
    });
    entered.recv_timeout(GENEROUS).unwrap();
    // The first call is making key "a" (outside the lock) now; it is let
    // go on shortly (so that a fix that waits for it does not hang).
    let opener = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        let _ = go.send(());
    });
    let second = keyed.try_acquire(&"a").map(drop).map_err(|e| e.reason());
    opener.join().unwrap();
    let first = first.join().unwrap();
    assert_eq!(first, Ok(()));
    assert_eq!(
        second,
        Ok(()),
        "the second call of key \"a\" was refused though \"a\" is the only key \
         (refused_new_keys = {})",
        keyed.status(0).refused_new_keys
    );
}

/// `max_keys(2)`, one idle key "x": key "a" fits beside it. Two concurrent
/// first calls of "a" each reserve a place, and the second evicts "x" for
/// nothing.
#[test]
fn two_first_calls_of_one_new_key_evict_no_key_that_fits() {
    let (entered_tx, entered_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let gate = Mutex::new(Some((entered_tx, go_rx)));
    let keyed = KeyedBulkhead::new(
        KeyedConfig::new(Config::new(2, LONG))
            .limit_per_key(move |key: &&'static str| {
                if *key == "a" {
                    let taken = gate.lock().unwrap().take();
                    if let Some((entered, go)) = taken {
                        entered.send(()).unwrap();
                        let _ = go.recv_timeout(GENEROUS);
                    }
                }
                2
            })
            .max_keys(2),
    );
    drop(keyed.try_acquire(&"x").unwrap());
    let first = std::thread::spawn({
        let keyed = keyed.clone();
        move || keyed.try_acquire(&"a").map(drop).map_err(|e| e.reason())
    });
    entered_rx.recv_timeout(GENEROUS).unwrap();
    let opener = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        let _ = go_tx.send(());
    });
    let second = keyed.try_acquire(&"a").map(drop).map_err(|e| e.reason());
    opener.join().unwrap();
    assert_eq!(first.join().unwrap(), Ok(()));
    assert_eq!(second, Ok(()));
    let status = keyed.status(0);
    assert_eq!(
        (status.keys, status.evicted),
        (2, 0),
        "\"x\" and \"a\" fit in max_keys(2), yet \"x\" was evicted"
    );
}

// ---------------------------------------------------------------------------
// Turns: callers that left the ceiling's line unserved (their wait ran
//    out, or they were dropped) still advanced their key's tag, so the
//    key's next caller is put behind the other keys' whole backlog.
// ---------------------------------------------------------------------------

/// Key "a" sent eight callers that all gave up at the ceiling (their wait
/// expired). Later, with one ceiling slot cycling, "b" queues six callers
/// and "a" one: "a" has no backlog, so per the docs it "starts where the
/// turns are, neither ahead of the keys that waited nor behind a busy
/// key's backlog", and should be served first or second. It is served
/// last, behind all of b's: the tags of callers never served still count.
/// (Each time a's callers give up, its next caller is pushed further back,
/// so under sustained load a key that once timed out keeps timing out.)
#[tokio::test(start_paused = true)]
async fn a_key_whose_callers_gave_up_is_not_put_behind_the_others_backlog() {
    // A key's limit is held to the ceiling's: 8 each.
    let (keyed, mut held) = filled(
        KeyedConfig::new(Config::new(8, LONG).wait(Duration::from_secs(10)))
            .ceiling(Config::new(8, LONG).wait(Duration::from_millis(50))),
    );
    let mut gave_up = Vec::new();
    for _ in 0..8 {
        let keyed = keyed.clone();
        gave_up.push(tokio::spawn(async move {
            keyed.acquire(&"a").await.map(drop).unwrap_err().reason()
        }));
        tokio::task::yield_now().await;
    }
    for task in gave_up {
        assert_eq!(task.await.unwrap(), ShedReason::WaitExpired);
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
    // One ceiling slot is freed, and cycles among the callers (1 ms each).
    let one = held.pop().unwrap();
    let order = order_served(&keyed, &["b", "b", "b", "b", "b", "b", "a"], move || {
        drop(one)
    })
    .await;
    drop(held);
    let a = order.iter().position(|key| *key == "a").unwrap();
    assert!(
        a <= 1,
        "key \"a\" (no backlog) was served behind {a} of b's callers: {order:?}"
    );
}

// ---------------------------------------------------------------------------

/// A key of weight 40 against one of weight 20 should get two turns to one
/// (40 of 60), as weight 2 against 1 does. It gets three to one.
#[tokio::test(start_paused = true)]
async fn weights_forty_and_twenty_share_turns_two_to_one() {
    let wait = Duration::from_secs(20);
    let keyed = KeyedBulkhead::new(
        KeyedConfig::new(Config::new(4, LONG).wait(wait))
            .ceiling(Config::new(4, LONG).wait(wait))
            .weight_per_key(|key: &&str| if *key == "heavy" { 40 } else { 20 }),
    );
    let order = served_in_turns(&keyed, &[("light", 4), ("heavy", 4)], 60).await;
    let heavy = order.iter().filter(|key| **key == "heavy").count();
    assert!(
        (38..=42).contains(&heavy),
        "weight 40 vs 20 got {heavy} of 60 turns (2:1 would be 40): {order:?}"
    );
}

/// Weights 64 and 33: the docs hold weights to 1..=64 and promise turns in
/// their proportion (about 39 of 60 for 64 against 33). Both cost 1 unit,
/// so they alternate.
#[tokio::test(start_paused = true)]
async fn weights_sixty_four_and_thirty_three_are_not_served_alike() {
    let wait = Duration::from_secs(20);
    let keyed = KeyedBulkhead::new(
        KeyedConfig::new(Config::new(4, LONG).wait(wait))
            .ceiling(Config::new(4, LONG).wait(wait))
            .weight_per_key(|key: &&str| if *key == "heavy" { 64 } else { 33 }),
    );
    let order = served_in_turns(&keyed, &[("light", 4), ("heavy", 4)], 60).await;
    let heavy = order.iter().filter(|key| **key == "heavy").count();
    assert!(
        heavy >= 36,
        "weight 64 vs 33 got {heavy} of 60 turns (in proportion: ~40): {order:?}"
    );
}

// ---------------------------------------------------------------------------
// Counts: a key's bulkhead counts an admission for a call that the
//    ceiling shed, and the layer's try-before-waiting counts a call that
//    waited for the ceiling twice.
// ---------------------------------------------------------------------------

/// Through the layer: the ceiling is full, a request of key "b" tries,
/// is refused by the ceiling (unrecorded), waits, and is served. One call,
/// one admission: b's totals say 2.
#[tokio::test(start_paused = true)]
async fn a_layer_call_that_waited_for_the_ceiling_is_admitted_once_by_its_key() {
    let wait = Duration::from_secs(10);
    let layer = KeyedConcurrencyLayer::new(
        KeyedConfig::new(Config::new(2, LONG).wait(wait)).ceiling(Config::new(1, LONG).wait(wait)),
        |request: &&'static str| *request,
    );
    let keyed = layer.bulkhead();
    let service = ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(|_: &'static str| async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Ok::<_, BoxError>(())
        }));
    let held = keyed.try_acquire(&"holder").unwrap();
    let call = tokio::spawn(service.oneshot("b"));
    tokio::time::sleep(Duration::from_millis(10)).await;
    drop(held);
    tokio::time::sleep(Duration::from_millis(10)).await;
    let status = keyed.status(10);
    let b = status
        .busiest
        .iter()
        .find(|key| key.key == "b")
        .expect("b is in flight");
    assert_eq!(b.in_flight, 1);
    let admitted = b.totals.admitted;
    call.await.unwrap().unwrap();
    assert_eq!(
        admitted, 1,
        "one call of key b, which waited for the ceiling, counted {admitted} admissions"
    );
}

/// `try_acquire`: the ceiling sheds a call of key "b" ("both or neither":
/// it got neither), yet b's bulkhead counts it admitted.
#[test]
fn a_call_shed_by_the_ceiling_is_not_counted_admitted_by_its_key() {
    let keyed =
        KeyedBulkhead::new(KeyedConfig::new(Config::new(2, LONG)).ceiling(Config::new(1, LONG)));
    let held = keyed.try_acquire(&"a").unwrap();
    assert_eq!(
        keyed.try_acquire(&"b").unwrap_err().reason(),
        ShedReason::LimitReached
    );
    drop(held);
    let b = keyed.try_acquire(&"b").unwrap();
    let status = keyed.status(10);
    let totals = status
        .busiest
        .iter()
        .find(|key| key.key == "b")
        .unwrap()
        .totals;
    drop(b);
    assert_eq!(
        totals.admitted, 1,
        "key b: one call admitted, one shed by the ceiling; totals {totals:?}"
    );
}

/// `key`'s admissions so far, read while one call of it is held (so that
/// it shows among the busiest keys).
fn admitted_of(keyed: &KeyedBulkhead<&'static str>, key: &'static str) -> u64 {
    let held = keyed.try_acquire(&key).expect("a call of the key fits now");
    let status = keyed.status(64);
    let totals = status
        .busiest
        .iter()
        .find(|status| status.key == key)
        .expect("the key is in flight")
        .totals;
    drop(held);
    totals.admitted
}

/// `acquire`: the key's slot is granted, the ceiling's wait then runs out,
/// and the call gets neither; its key must not count it admitted.
#[tokio::test(start_paused = true)]
async fn a_call_whose_ceiling_wait_ran_out_is_not_counted_admitted_by_its_key() {
    let keyed = KeyedBulkhead::new(
        KeyedConfig::new(Config::new(2, LONG))
            .ceiling(Config::new(1, LONG).wait(Duration::from_millis(100))),
    );
    let held = keyed.try_acquire(&"a").unwrap();
    assert_eq!(
        keyed.acquire(&"b").await.unwrap_err().reason(),
        ShedReason::WaitExpired
    );
    drop(held);
    let admitted = admitted_of(&keyed, "b");
    assert_eq!(
        admitted, 1,
        "key b: one call admitted, one shed by the ceiling after waiting; b counts {admitted}"
    );
}

/// The same through the layer, whose call claims the key's slot before it
/// waits for the ceiling's.
#[tokio::test(start_paused = true)]
async fn a_layer_call_shed_by_the_ceiling_after_waiting_is_not_counted_admitted_by_its_key() {
    let layer = KeyedConcurrencyLayer::new(
        KeyedConfig::new(Config::new(2, LONG))
            .ceiling(Config::new(1, LONG).wait(Duration::from_millis(100))),
        |request: &&'static str| *request,
    );
    let keyed = layer.bulkhead();
    let service = ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(|_: &'static str| async {
            Ok::<_, BoxError>(())
        }));
    let held = keyed.try_acquire(&"a").unwrap();
    let error = service.clone().oneshot("b").await.unwrap_err();
    let shed = error
        .downcast_ref::<tower_inflight::ServiceSaturated>()
        .unwrap();
    assert_eq!(shed.reason(), ShedReason::WaitExpired);
    drop(held);
    let admitted = admitted_of(&keyed, "b");
    assert_eq!(
        admitted, 1,
        "key b: one call admitted, one shed by the ceiling; b counts {admitted}"
    );
}

// ---------------------------------------------------------------------------
// `status()` clones every key's bulkhead and looks at them outside the
//    lock: while it does, every key is "shared", hence busy to the sweep,
//    and a new key is shed with TooManyKeys though every key is idle.
// ---------------------------------------------------------------------------

static HOLD_NEXT_DROP: AtomicBool = AtomicBool::new(false);
static DROP_GATE: Mutex<Option<(mpsc::Sender<()>, mpsc::Receiver<()>)>> = Mutex::new(None);

/// A key whose drop can be held (once) while the test acts: it only widens
/// the window in which `busiest` holds the bulkheads' clones.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
struct Tenant(u32);

impl Drop for Tenant {
    fn drop(&mut self) {
        if self.0 == 1 && HOLD_NEXT_DROP.swap(false, Ordering::SeqCst) {
            let gate = DROP_GATE.lock().unwrap().take();
            if let Some((held, release)) = gate {
                held.send(()).unwrap();
                let _ = release.recv_timeout(GENEROUS);
            }
        }
    }
}

#[test]
fn a_status_call_does_not_make_idle_keys_look_busy_to_a_new_key() {
    let keyed = KeyedBulkhead::new(KeyedConfig::new(Config::new(1, LONG)).max_keys(1));
    drop(keyed.try_acquire(&Tenant(1)).unwrap()); // idle now
    let (held_tx, held_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel();
    *DROP_GATE.lock().unwrap() = Some((held_tx, release_rx));
    HOLD_NEXT_DROP.store(true, Ordering::SeqCst);
    let status = std::thread::spawn({
        let keyed = keyed.clone();
        move || keyed.status(10).busiest.len()
    });
    // `busiest` drops its clone of the idle key 1 (held here), with the
    // clone of its bulkhead still alive beside it. (A status that clones
    // nothing of an idle key never gets here: the test goes on anyway.)
    let _ = held_rx.recv_timeout(Duration::from_secs(5));
    HOLD_NEXT_DROP.store(false, Ordering::SeqCst);
    let new = keyed
        .try_acquire(&Tenant(2))
        .map(drop)
        .map_err(|e| e.reason());
    let _ = release_tx.send(());
    assert_eq!(status.join().unwrap(), 0);
    assert_eq!(
        new,
        Ok(()),
        "key 1 is idle, yet a new key was refused while status() ran"
    );
}

// ---------------------------------------------------------------------------
// A key whose Hash panicked during the sweep was popped from the ring and
//    never put back: it stayed in the map, could never be evicted, and every
//    new key was refused for good. A map of keys now hashes a key once, as
//    it comes in: the sweep runs no `Hash` at all.
// ---------------------------------------------------------------------------

static HASH_PANICS: AtomicBool = AtomicBool::new(false);

#[derive(Clone, PartialEq, Eq, Debug)]
struct Flaky(u32);

impl Hash for Flaky {
    fn hash<H: Hasher>(&self, state: &mut H) {
        if self.0 == 0 && HASH_PANICS.load(Ordering::SeqCst) {
            panic!("hash of key 0 panics");
        }
        self.0.hash(state);
    }
}

#[test]
fn a_key_whose_hash_would_panic_is_evicted_by_a_sweep_that_never_hashes_it() {
    let keyed = KeyedBulkhead::new(KeyedConfig::new(Config::new(1, LONG)).max_keys(1));
    drop(keyed.try_acquire(&Flaky(0)).unwrap());
    HASH_PANICS.store(true, Ordering::SeqCst);
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        keyed.try_acquire(&Flaky(1)).map(drop)
    }))
    .is_err();
    HASH_PANICS.store(false, Ordering::SeqCst);
    assert!(!panicked, "the sweep hashed key 0");
    // Key 0 was evicted; key 1 is idle.
    let refused = (2..10u32)
        .filter(|&key| keyed.try_acquire(&Flaky(key)).is_err())
        .count();
    assert_eq!(
        refused,
        0,
        "key 0 is idle, yet {refused} of 8 new keys were refused (keys held: {})",
        keyed.keys()
    );
}

// ---------------------------------------------------------------------------
// Metrics: a reported key evicted with a leaked permit (as the docs
//    allow, once its slot could be reclaimed) leaves its in-flight gauge
//    counting that slot for good: nothing will ever reclaim it.
// ---------------------------------------------------------------------------

#[test]
fn a_reported_key_evicted_with_a_leaked_permit_does_not_leave_its_gauge_counting_it() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    // (The debugging recorder's snapshots read gauges destructively: one
    // snapshot, at the end.)
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let in_flight_gauge = || {
        snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .find_map(|(key, _, _, value)| {
                let key = key.key();
                let acme = key
                    .labels()
                    .any(|label| label.key() == "service" && label.value() == "tenants/acme");
                (key.name() == "tower_inflight_in_flight" && acme).then_some(value)
            })
            .map(|value| match value {
                DebugValue::Gauge(value) => value.into_inner(),
                _ => panic!("not a gauge"),
            })
    };
    metrics::with_local_recorder(&recorder, || {
        let clock = ManualClock::new();
        let keyed = KeyedBulkhead::new(
            KeyedConfig::new(
                Config::new(1, Duration::from_secs(10))
                    .name("tenants")
                    .clock(clock.clone()),
            )
            .metrics_per_key(|key: &&str| (*key == "acme").then(|| "acme".to_owned()))
            .max_keys(1),
        );
        std::mem::forget(keyed.try_acquire(&"acme").unwrap());
        clock.advance(Duration::from_secs(10));
        // acme's slot could be reclaimed now: a new key evicts acme.
        drop(keyed.try_acquire(&"other").unwrap());
        assert_eq!(keyed.status(0).evicted, 1);
        // acme comes back, with a bulkhead of its own, and is idle again.
        drop(keyed.try_acquire(&"acme").unwrap());
        assert_eq!(keyed.keys(), 1);
        assert_eq!(
            in_flight_gauge(),
            Some(0.0),
            "nothing of acme's is in flight (its leaked slot went with its evicted \
             bulkhead), yet its gauge counts it"
        );
    });
}

// ---------------------------------------------------------------------------
// Metrics: a call shed with TooManyKeys is counted nowhere in the
//    metrics. Every bulkhead (the ceiling included) registers a
//    `tower_inflight_rejected_total{reason="too_many_keys"}` series, and
//    nothing ever increments it.
// ---------------------------------------------------------------------------

#[test]
fn a_call_shed_for_too_many_keys_is_counted_in_the_metrics() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let keyed = KeyedBulkhead::new(
            KeyedConfig::new(Config::new(2, LONG).name("tenants"))
                .ceiling(Config::new(8, LONG).name("all-tenants"))
                .max_keys(1),
        );
        let held = keyed.try_acquire(&"a").unwrap();
        for _ in 0..3 {
            assert_eq!(
                keyed.try_acquire(&"b").unwrap_err().reason(),
                ShedReason::TooManyKeys
            );
        }
        assert_eq!(keyed.status(0).refused_new_keys, 3);
        drop(held);
    });
    let series: Vec<(String, u64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| {
            let key = key.key();
            let too_many_keys = key
                .labels()
                .any(|label| label.key() == "reason" && label.value() == "too_many_keys");
            let service = key
                .labels()
                .find(|label| label.key() == "service")
                .map(|label| label.value().to_owned())?;
            match value {
                DebugValue::Counter(n)
                    if key.name() == "tower_inflight_rejected_total" && too_many_keys =>
                {
                    Some((service, n))
                }
                _ => None,
            }
        })
        .collect();
    let counted: u64 = series.iter().map(|(_, n)| n).sum();
    assert_eq!(
        counted, 3,
        "3 calls shed with TooManyKeys; the too_many_keys series say {series:?}"
    );
}

// ---------------------------------------------------------------------------
// Callers of a key that hang up while a later caller of the same key waits
//    for the ceiling: their places stayed ahead of it (turns.rs `leave`
//    gave the cost back to the key's next caller only).
// ---------------------------------------------------------------------------

/// Lets the spawned callers come to the line.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

/// Key "a" has 8 callers in the ceiling's line; the first 7 hang up, so "a"
/// has one caller (a8) waiting. Then "b" queues 7 callers and "a" one more
/// (a9). a8 should be served first or second, and before its own key's a9.
/// It was served last, behind all seven of b's and behind a9 (["b1", "b2",
/// "a9", "b3", ..., "b7", "a8"]): a caller that gave up gave its cost back
/// to its key's next caller, and none to the key's callers still in line.
#[tokio::test(start_paused = true)]
async fn a_caller_whose_earlier_key_mates_were_cancelled_keeps_its_turn() {
    let wait = Duration::from_secs(10);
    let (keyed, mut held) = filled(eight_at_once(wait));
    let order = Arc::new(Mutex::new(Vec::new()));
    let spawn = |key: &'static str, name: String| {
        let (keyed, order) = (keyed.clone(), order.clone());
        tokio::spawn(async move {
            let permit = keyed.acquire(&key).await.unwrap();
            order.lock().unwrap().push(name);
            tokio::time::sleep(Duration::from_millis(1)).await;
            drop(permit);
        })
    };
    // Eight callers of "a" wait; the first seven hang up.
    let mut a: Vec<_> = Vec::new();
    for i in 1..=8 {
        a.push(spawn("a", format!("a{i}")));
        settle().await;
    }
    let last_a = a.pop().unwrap();
    for task in a {
        task.abort();
    }
    settle().await;
    assert_eq!(keyed.ceiling().unwrap().waiting(), 1);
    let mut tasks = vec![last_a];
    for i in 1..=7 {
        tasks.push(spawn("b", format!("b{i}")));
        settle().await;
    }
    // A later caller of "a".
    tasks.push(spawn("a", "a9".into()));
    settle().await;
    let one = held.pop().unwrap();
    drop(one);
    for task in tasks {
        task.await.unwrap();
    }
    drop(held);
    let order = order.lock().unwrap().clone();
    let a8 = order.iter().position(|k| k == "a8").unwrap();
    let a9 = order.iter().position(|k| k == "a9").unwrap();
    assert!(
        a8 <= 1 && a8 < a9,
        "a8 (its key's only caller in line) served at {a8}, after its key's later a9 at {a9}: {order:?}"
    );
}

/// With weights at their extremes (0, held to 1, and usize::MAX, held to
/// 64): a light key's one caller in line, whose seven earlier key-mates
/// hung up, should get its turn within about 65 of the heavy key's turns,
/// as it does with nobody cancelled. Each key-mate that hung up left its 64
/// units ahead of it (448 heavy turns), and it was shed `WaitExpired` after
/// 301 heavy turns although its key had a single caller waiting throughout.
#[tokio::test(start_paused = true)]
async fn cancelled_key_mates_push_a_light_caller_past_its_wait() {
    let wait = Duration::from_millis(300);
    let (keyed, mut held) =
        filled(
            eight_at_once(wait)
                .weight_per_key(|key: &&str| if *key == "heavy" { usize::MAX } else { 0 }),
        );
    let mut light = Vec::new();
    for _ in 0..8 {
        let keyed = keyed.clone();
        light.push(tokio::spawn(async move {
            keyed
                .acquire(&"light")
                .await
                .map(drop)
                .map_err(|e| e.reason())
        }));
        settle().await;
    }
    let survivor = light.pop().unwrap();
    for task in light {
        task.abort();
    }
    settle().await;
    // The heavy key keeps eight callers in line: one more each time one is served.
    let served = Arc::new(AtomicUsize::new(0));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let heavy = {
        let (keyed, served) = (keyed.clone(), served.clone());
        move |tx: tokio::sync::mpsc::UnboundedSender<()>| {
            let (keyed, served) = (keyed.clone(), served.clone());
            tokio::spawn(async move {
                if let Ok(permit) = keyed.acquire(&"heavy").await {
                    served.fetch_add(1, Ordering::SeqCst);
                    let _ = tx.send(());
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    drop(permit);
                }
            })
        }
    };
    for _ in 0..7 {
        heavy(tx.clone());
        settle().await;
    }
    drop(held.pop());
    let refill = tokio::spawn({
        let tx = tx.clone();
        let heavy = heavy.clone();
        async move {
            let mut tasks = Vec::new();
            while rx.recv().await.is_some() {
                if tasks.len() < 400 {
                    tasks.push(heavy(tx.clone()));
                }
            }
        }
    });
    let outcome = survivor.await.unwrap();
    let before = served.load(Ordering::SeqCst);
    refill.abort();
    drop(held);
    assert!(
        outcome.is_ok() && before <= 70,
        "the light key's only caller in line: {outcome:?} after {before} heavy turns"
    );
}

/// Key "k" (guarantee 2) has three callers below its share, all of whom
/// hang up; its caller `t`, in turn, is then its key's only caller in line,
/// and its key was never served: it should have its key's first turn, right
/// behind "o"'s first caller, as it does with a guarantee of 0 (the same
/// steps, the three in turn). It was left a turn back, behind "o"'s second
/// caller: callers below their share took turns that nobody could be moved
/// into when they left.
#[tokio::test(start_paused = true)]
async fn callers_below_their_share_that_hang_up_push_their_key_s_next_caller_back() {
    let wait = Duration::from_secs(10);
    let (keyed, mut held) =
        filled(eight_at_once(wait).guarantee_per_key(|key: &&str| if *key == "k" { 2 } else { 0 }));
    let order = Arc::new(Mutex::new(Vec::new()));
    let permits = Arc::new(Mutex::new(Vec::new()));
    let spawn = |key: &'static str, name: &'static str| {
        let (keyed, order, permits) = (keyed.clone(), order.clone(), permits.clone());
        tokio::spawn(async move {
            let permit = keyed.acquire(&key).await.unwrap();
            order.lock().unwrap().push(name);
            // Held to the end: each slot freed goes to one caller.
            permits.lock().unwrap().push(permit);
        })
    };
    // "o" has three callers in turn: tags 0, 64, 128.
    let mut tasks = Vec::new();
    for name in ["o1", "o2", "o3"] {
        tasks.push(spawn("o", name));
        settle().await;
    }
    // "k": two callers below its share (tags 0 and 64); the first hangs up,
    // and its tag's cost goes back at the end (64, the second's).
    let f1 = spawn("k", "f1");
    settle().await;
    let f2 = spawn("k", "f2");
    settle().await;
    f1.abort();
    settle().await;
    // A third below its share (tag 64 again), then `t`, in turn (128).
    let f3 = spawn("k", "f3");
    settle().await;
    let t = spawn("k", "t");
    settle().await;
    // Both below the share hang up: `t` should come to tag 0.
    f2.abort();
    settle().await;
    f3.abort();
    settle().await;
    assert_eq!(keyed.ceiling().unwrap().waiting(), 4);
    // Two slots come free, one at a time.
    drop(held.pop());
    settle().await;
    drop(held.pop());
    settle().await;
    let order = order.lock().unwrap().clone();
    t.abort();
    for task in tasks {
        task.abort();
    }
    assert_eq!(
        order,
        ["o1", "t"],
        "\"k\"'s only caller in line, its key never served, went behind \"o\"'s second caller"
    );
}

// ---------------------------------------------------------------------------
// A caller that left after its turn came, or gave up, still pushed its
//    key's others back: a slot handed to a caller dropped before it took it
//    went on before the caller's place did (bulkhead.rs `acquire_after`), a
//    caller its key shed after the ceiling served it kept its turn, and the
//    carry of a caller that gave up was never given back (turns.rs `leave`).
// ---------------------------------------------------------------------------

const WAIT: Duration = Duration::from_secs(10);

type Order = Arc<Mutex<Vec<&'static str>>>;

/// A caller of `key`, named `name`, that records when it is served and
/// holds its permit 1 ms.
fn caller(
    keyed: &KeyedBulkhead<&'static str>,
    order: &Order,
    key: &'static str,
    name: &'static str,
) -> tokio::task::JoinHandle<()> {
    let (keyed, order) = (keyed.clone(), order.clone());
    tokio::spawn(async move {
        let permit = keyed.acquire(&key).await.unwrap();
        order.lock().unwrap().push(name);
        tokio::time::sleep(Duration::from_millis(1)).await;
        drop(permit);
    })
}

/// Key "a"'s caller `x` is handed the ceiling's freed slot, and dropped
/// before it takes it up (its task cancelled): it gave up. Its key's other
/// caller `l` (arrived before "b"'s `y`) should get the slot, as it would
/// had `x` never come (then `l` has "a"'s first turn, tag 0, and came
/// before `y`, also at tag 0). The slot went to `y`: in `acquire_after` the
/// ceiling's `Acquire` is dropped (handing its slot to the line as it
/// stands) before `WaitingForCeiling`, whose `leave` only then moves `l`
/// into `x`'s place.
#[tokio::test(start_paused = true)]
async fn a_caller_dropped_with_its_slot_handed_hands_it_past_its_key_s_next_caller() {
    let run = |with_x: bool| async move {
        let (keyed, mut held) = filled(eight_at_once(WAIT));
        let holder = held.pop().unwrap();
        let order: Order = Arc::default();
        let a = "a";
        let mut x = with_x.then(|| tokio_test::task::spawn(keyed.acquire(&a)));
        if let Some(x) = x.as_mut() {
            assert!(x.poll().is_pending());
        }
        settle().await;
        let l = caller(&keyed, &order, "a", "l");
        settle().await;
        let y = caller(&keyed, &order, "b", "y");
        settle().await;
        // The ceiling's slot comes free: handed to `x` (first in line), whose
        // task is cancelled before it runs.
        drop(holder);
        drop(x);
        l.await.unwrap();
        y.await.unwrap();
        drop(held);
        let order = order.lock().unwrap().clone();
        order
    };
    let without_x = run(false).await;
    assert_eq!(without_x, ["l", "y"], "control: x never came");
    let with_x = run(true).await;
    assert_eq!(
        with_x, without_x,
        "a caller of \"a\" that gave up with its slot handed put its key's next caller behind \"b\""
    );
}

/// A keyed bulkhead of 8 a key whose ceiling of 8 is full, held by key
/// "holder" (one of its permits apart, to free a slot), keys weighted by
/// `weight`.
fn full_ceiling(
    weight: fn(&&'static str) -> usize,
) -> (KeyedBulkhead<&'static str>, Vec<KeyedPermit>, KeyedPermit) {
    let (keyed, mut held) = filled(eight_at_once(WAIT).weight_per_key(weight));
    let holder = held.pop().unwrap();
    (keyed, held, holder)
}

/// Sends each key's named callers, key by key, frees the ceiling's slot
/// `holder` held, and returns the order they were served in.
async fn served_after(
    keyed: &KeyedBulkhead<&'static str>,
    order: &Order,
    callers: &[(&'static str, &[&'static str])],
    holder: KeyedPermit,
    held: Vec<KeyedPermit>,
) -> Vec<&'static str> {
    let mut tasks = Vec::new();
    for &(key, names) in callers {
        for &name in names {
            tasks.push(caller(keyed, order, key, name));
            settle().await;
        }
    }
    drop(holder);
    for task in tasks {
        task.await.unwrap();
    }
    drop(held);
    let served = order.lock().unwrap().clone();
    served
}

/// Weight 33 (a call costs 64/33 units: 1, 2, 2, ... with the carry) beside
/// a key of weight 64 (1 unit a call). One caller of the light key gives up
/// at the ceiling: its tag is given back (`next_tag`), its carry is not
/// (turns.rs `leave`), so the key's calls after it are costed from a carry
/// they never ran up: its second caller's tag is 2, not 1, a whole turn of
/// the heavy key later than had the caller who gave up never come.
#[tokio::test(start_paused = true)]
async fn a_caller_that_gave_up_keeps_its_carry_and_pushes_its_key_s_second_caller_back() {
    let run = |with_x: bool| async move {
        let (keyed, held, holder) = full_ceiling(|key| if *key == "heavy" { 64 } else { 33 });
        let order: Order = Arc::default();
        if with_x {
            let x = caller(&keyed, &order, "light", "x");
            settle().await;
            x.abort();
            settle().await;
        }
        assert_eq!(keyed.ceiling().unwrap().waiting(), 0);
        let callers = [
            ("heavy", ["h0", "h1", "h2", "h3"].as_slice()),
            ("light", &["a0", "a1"]),
        ];
        served_after(&keyed, &order, &callers, holder, held).await
    };
    let without_x = run(false).await;
    assert_eq!(
        without_x,
        ["h0", "a0", "h1", "a1", "h2", "h3"],
        "control: x never came"
    );
    let with_x = run(true).await;
    assert_eq!(
        with_x, without_x,
        "one caller of \"light\" that gave up pushed its key's second caller back"
    );
}

/// Key "a" (limit 1, `reclaim_after` 1 s on a manual clock) has caller `x`
/// waiting for the ceiling; a busy runtime lets the key's slot lapse, and
/// "a"'s next caller `y` takes it and waits for the ceiling too; then "b"'s
/// `z` comes. The ceiling's slot goes to `x`, which is shed by its key
/// (its slot is `y`'s now): `x` left unserved, as one whose wait ran out
/// does, but its turn was counted served (`served = true` and the turn left
/// before `renew`), so `y` keeps tag 64 and goes behind `z` (tag 0, came
/// later). Had `x`'s turn been given back, `y` would have had it and gone
/// first.
#[tokio::test(start_paused = true)]
async fn a_caller_shed_by_its_key_after_its_turn_came_still_uses_its_key_s_turn() {
    let clock = ManualClock::new();
    let keyed = KeyedBulkhead::new(
        KeyedConfig::new(
            Config::new(1, Duration::from_secs(1))
                .wait(Duration::from_millis(400))
                .clock(clock.clone()),
        )
        .ceiling(Config::new(1, LONG).wait(Duration::from_millis(500))),
    );
    let holder = keyed.ceiling().unwrap().try_acquire().unwrap();
    let order: Order = Arc::default();
    let x = {
        let keyed = keyed.clone();
        tokio::spawn(async move { keyed.acquire(&"a").await.map(drop).map_err(|e| e.reason()) })
    };
    settle().await;
    // The runtime was busy: the key's clock runs past x's slot's deadline.
    clock.advance(Duration::from_secs(2));
    let y = caller(&keyed, &order, "a", "y");
    settle().await;
    let z = caller(&keyed, &order, "b", "z");
    settle().await;
    assert_eq!(keyed.ceiling().unwrap().waiting(), 3, "x, y and z wait");
    drop(holder);
    let x = x.await.unwrap();
    assert!(x.is_err(), "precondition: x is shed by its key ({x:?})");
    y.await.unwrap();
    z.await.unwrap();
    let order = order.lock().unwrap().clone();
    assert_eq!(
        order,
        ["y", "z"],
        "x, shed unserved, kept its key's turn: its key's y went behind b's later z"
    );
}

/// Keys "a" and "b" of weight 3 (costs 21, 21, 22 units with the carry).
/// "a" has two callers x0 (tag 0, carry before 0) and x1 (tag 21, carry
/// before 1) waiting; both give up, x0 first, which moves x1 to tag 0.
/// x1 leaving then frees tag 0, and the carry given back was that of the
/// place x1 first came to (1), not of tag 0 (0): "a"'s callers then got
/// tags 0, 21, 43 instead of 0, 21, 42, and its third went behind "b"'s
/// third, which came after it. A moved caller now takes the figures of
/// the place it moves to.
#[tokio::test(start_paused = true)]
async fn two_callers_that_gave_up_leave_their_key_a_carry_it_never_ran_up() {
    let run = |with_x: bool| async move {
        let (keyed, held, holder) = full_ceiling(|key| if *key == "holder" { 1 } else { 3 });
        let order: Order = Arc::default();
        if with_x {
            let x0 = caller(&keyed, &order, "a", "x0");
            settle().await;
            let x1 = caller(&keyed, &order, "a", "x1");
            settle().await;
            assert_eq!(keyed.ceiling().unwrap().waiting(), 2);
            x0.abort();
            settle().await;
            x1.abort();
            settle().await;
        }
        assert_eq!(keyed.ceiling().unwrap().waiting(), 0);
        let callers = [
            ("a", ["a0", "a1", "a2"].as_slice()),
            ("b", &["b0", "b1", "b2"]),
        ];
        served_after(&keyed, &order, &callers, holder, held).await
    };
    let without_x = run(false).await;
    assert_eq!(
        without_x,
        ["a0", "b0", "a1", "b1", "a2", "b2"],
        "control: x0 and x1 never came"
    );
    let with_x = run(true).await;
    assert_eq!(
        with_x, without_x,
        "two callers of \"a\" that gave up pushed its third caller back"
    );
}

// ---------------------------------------------------------------------------
// A caller behind the virtual time that gave up moved its key's next caller
//    (which took its tag from the virtual time) ahead of callers that came
//    before it (turns.rs `leave`).
// ---------------------------------------------------------------------------

mod behind_the_virtual_time {
    use super::*;

    type Held = Arc<Mutex<Vec<KeyedPermit>>>;

    /// A caller of `key`, named `name`, that records when it is served and
    /// keeps its permit in `held`: slots free only as the test frees the
    /// holder's.
    fn caller(
        keyed: &KeyedBulkhead<&'static str>,
        order: &Order,
        held: &Held,
        key: &'static str,
        name: &'static str,
    ) -> tokio::task::JoinHandle<()> {
        let (keyed, order, held) = (keyed.clone(), order.clone(), held.clone());
        tokio::spawn(async move {
            let permit = keyed.acquire(&key).await.unwrap();
            order.lock().unwrap().push(name);
            held.lock().unwrap().push(permit);
        })
    }

    async fn run(with_w: bool) -> Vec<&'static str> {
        let (keyed, mut holder) =
            filled(
                eight_at_once(WAIT).weight_per_key(|key: &&str| if *key == "a" { 64 } else { 1 }),
            );
        let order: Order = Arc::default();
        let held: Held = Arc::default();
        // "b": b0 at tag 0, b1 at tag 64.
        let b0 = caller(&keyed, &order, &held, "b", "b0");
        settle().await;
        let b1 = caller(&keyed, &order, &held, "b", "b1");
        settle().await;
        drop(holder.pop());
        // b0 served: virtual time 0.
        settle().await;
        // W of "a" (weight 64) is spawned, then a slot is handed to b1 (tag
        // 64); W runs before b1 takes its slot up: W's tag is 0.
        let w = with_w.then(|| caller(&keyed, &order, &held, "a", "w"));
        drop(holder.pop());
        // b1 served: virtual time 64.
        settle().await;
        assert_eq!(keyed.ceiling().unwrap().waiting(), usize::from(with_w));
        // "c"'s c0 comes (tag 64), then "a"'s n (tag 64, the virtual time).
        let c0 = caller(&keyed, &order, &held, "c", "c0");
        settle().await;
        let n = caller(&keyed, &order, &held, "a", "n");
        settle().await;
        if let Some(w) = w {
            w.abort();
            settle().await;
        }
        assert_eq!(keyed.ceiling().unwrap().waiting(), 2);
        drop(holder.pop());
        settle().await;
        drop(holder.pop());
        settle().await;
        for t in [b0, b1, c0, n] {
            t.await.unwrap();
        }
        drop(holder);
        held.lock().unwrap().clear();
        let order = order.lock().unwrap().clone();
        order
    }

    /// A caller of "a" (W) comes to its turn while a slot handed at a later tag
    /// is not yet taken up, so its tag is below what the virtual time becomes.
    /// When W gives up, "a"'s next caller, which came later and took its tag
    /// from the virtual time, was moved down into W's old place, ahead of "c"'s
    /// caller that came before it.
    #[tokio::test(start_paused = true)]
    async fn a_caller_that_gave_up_below_the_virtual_time_moves_its_key_s_next_caller_ahead() {
        let without_w = run(false).await;
        assert_eq!(without_w, ["b0", "b1", "c0", "n"], "control: w never came");
        let with_w = run(true).await;
        assert_eq!(
            with_w, without_w,
            "w gave up; its key's n (came after c0, both at the virtual time 64) was moved into w's tag 0, ahead of c0"
        );
    }
}

// ---------------------------------------------------------------------------
// A caller that gave up handed its place to its key's last caller, which may
// have begun a later run (its tag from the virtual time); and a key's caller
// handed its key's slot, not yet at the ceiling's line, counted as a
// ceiling's slot of its key's (keys.rs `ceiling_held`).
// ---------------------------------------------------------------------------

mod by_hand {
    use super::*;
    use std::future::Future;
    use std::pin::Pin;
    use std::task::Poll;
    use tokio_test::task::{spawn, Spawn};
    use tower_inflight::ServiceSaturated;

    type Acquiring = Pin<Box<dyn Future<Output = Result<KeyedPermit, ServiceSaturated>> + Send>>;

    /// A caller of a key, polled by hand.
    struct Caller {
        name: &'static str,
        task: Spawn<Acquiring>,
    }

    /// A caller of `key` that has come to its line (it waits).
    fn come(keyed: &KeyedBulkhead<&'static str>, key: &'static str, name: &'static str) -> Caller {
        let keyed = keyed.clone();
        let future: Acquiring = Box::pin(async move { keyed.acquire(&key).await });
        let mut task = spawn(future);
        assert!(task.poll().is_pending(), "{name} waits");
        Caller { name, task }
    }

    impl Caller {
        /// Its permit, if a slot was handed to it.
        fn served(&mut self) -> Option<KeyedPermit> {
            match self.task.poll() {
                Poll::Ready(outcome) => {
                    Some(outcome.unwrap_or_else(|e| panic!("{}: {e}", self.name)))
                }
                Poll::Pending => None,
            }
        }
    }

    /// Which of `callers` are served now, in that order, their permits kept.
    fn served_now(
        callers: &mut [&mut Caller],
        permits: &mut Vec<KeyedPermit>,
    ) -> Vec<&'static str> {
        let mut served = Vec::new();
        for caller in callers {
            if let Some(permit) = caller.served() {
                served.push(caller.name);
                permits.push(permit);
            }
        }
        served
    }

    /// "b" has b0..b4 in line (tags 0..256). b0 is served; three slots are
    /// handed to b1..b3 (tags 64..192), taken up late (a busy runtime).
    /// Meanwhile "k"'s x (tag 0) and y (64) come. Once b1..b3 are served the
    /// virtual time is 192; "d"'s w comes (192), then "k"'s z (192: from the
    /// virtual time, a run of its own, as "k"'s chain ends at 128). x gives
    /// up: y takes its place, not z, which would go ahead of w, which came
    /// before it.
    #[tokio::test(start_paused = true)]
    async fn a_caller_that_gave_up_hands_its_place_within_its_run_only() {
        let run = |with_x: bool| async move {
            let (keyed, mut holder) = filled(eight_at_once(WAIT));
            let mut b: Vec<Caller> = ["b0", "b1", "b2", "b3", "b4"]
                .into_iter()
                .map(|name| come(&keyed, "b", name))
                .collect();
            let mut permits = Vec::new();
            drop(holder.pop());
            permits.push(b[0].served().expect("b0 is handed the slot"));
            // Three slots handed to b1..b3, not taken up yet.
            holder.truncate(holder.len() - 3);
            let x = with_x.then(|| come(&keyed, "k", "x"));
            let mut y = come(&keyed, "k", "y");
            for late in &mut b[1..4] {
                permits.push(late.served().expect("handed a slot"));
            }
            let mut w = come(&keyed, "d", "w");
            let mut z = come(&keyed, "k", "z");
            drop(x); // gives up
            assert_eq!(keyed.ceiling().unwrap().waiting(), 4, "y, w, z and b4 wait");
            holder.truncate(holder.len() - 2);
            served_now(&mut [&mut y, &mut w, &mut z], &mut permits)
        };
        let without_x = run(false).await;
        assert_eq!(without_x, ["y", "w"], "control: x never came");
        let with_x = run(true).await;
        assert_eq!(
            with_x, without_x,
            "x gave up: its key's z (a later run, came after w) was moved into x's tag 0"
        );
    }

    /// "g" (limit 2, guarantee 1) holds two calls; its g3 and g4 wait for
    /// the key's slots. Both calls end at once: their key's slots go to g3
    /// and g4, their ceiling's slots to "o"'s o1 and o2. "g" holds none of
    /// the ceiling now. "p"'s p1 comes to the ceiling's line, then g3: below
    /// its key's share, it goes first, though g4, handed its key's slot, has
    /// not come to the ceiling's line yet.
    #[tokio::test(start_paused = true)]
    async fn a_key_holding_none_of_its_share_goes_first_while_a_key_mate_takes_up_its_key_slot() {
        let run = |with_g4: bool| async move {
            let keyed = KeyedBulkhead::new(
                KeyedConfig::new(Config::new(2, LONG).wait(WAIT))
                    .ceiling(Config::new(3, LONG).wait(WAIT))
                    .guarantee_per_key(|key: &&str| usize::from(*key == "g")),
            );
            let (g1, g2) = (
                keyed.try_acquire(&"g").unwrap(),
                keyed.try_acquire(&"g").unwrap(),
            );
            let other = keyed.ceiling().unwrap().try_acquire().unwrap();
            let mut g3 = come(&keyed, "g", "g3");
            let mut g4 = with_g4.then(|| come(&keyed, "g", "g4"));
            let mut o1 = come(&keyed, "o", "o1");
            let mut o2 = come(&keyed, "o", "o2");
            drop((g1, g2));
            let mut permits = vec![o1.served().expect("o1"), o2.served().expect("o2")];
            assert_eq!(
                keyed.ceiling().unwrap().in_flight(),
                3,
                "o1, o2 and the other"
            );
            let mut p1 = come(&keyed, "p", "p1");
            assert!(g3.served().is_none(), "g3 comes to the ceiling's line");
            if let Some(g4) = g4.as_mut() {
                assert!(g4.served().is_none(), "g4 comes to the ceiling's line");
            }
            drop(other);
            let mut callers: Vec<&mut Caller> = vec![&mut g3];
            callers.extend(g4.as_mut());
            callers.push(&mut p1);
            served_now(&mut callers, &mut permits)
        };
        assert_eq!(run(false).await, ["g3"], "control: no g4");
        assert_eq!(
            run(true).await,
            ["g3"],
            "\"g\" held none of its share of 1 when g3 came (g4 handed its key's slot, not yet at the ceiling's line), yet g3 took its turn"
        );
    }

    /// "o" has o0, o1, o2 in line (tags 0, 64, 128); then "k"'s a (0) and b
    /// (64), if `with_a`, else b alone (0). The slots freed go to the line's
    /// head: o0, a, o1, b (with a) or o0, b, o1 (without). All but a take them
    /// up (a's task is not polled yet). "k"'s c comes (with a: 128, from its
    /// key's chain; without: 64). a gives up (dropped: its slot goes on), or,
    /// without a, one more slot is freed: who gets that slot, c or o2?
    async fn who_gets_the_next_slot(with_a: bool) -> Vec<&'static str> {
        let keyed = KeyedBulkhead::new(
            KeyedConfig::new(Config::new(8, LONG).wait(WAIT))
                .ceiling(Config::new(8, LONG).wait(WAIT)),
        );
        let mut holder: Vec<KeyedPermit> = (0..8)
            .map(|_| keyed.try_acquire(&"holder").unwrap())
            .collect();
        let mut o0 = come(&keyed, "o", "o0");
        let mut o1 = come(&keyed, "o", "o1");
        let mut o2 = come(&keyed, "o", "o2");
        let a = with_a.then(|| come(&keyed, "k", "a"));
        let mut b = come(&keyed, "k", "b");
        let freed = if with_a { 4 } else { 3 };
        holder.truncate(holder.len() - freed);
        let mut permits = vec![
            o0.served().expect("o0 handed a slot"),
            o1.served().expect("o1 handed a slot"),
            b.served().expect("b handed a slot"),
        ];
        let mut c = come(&keyed, "k", "c");
        match a {
            Some(a) => drop(a), // gives up: its slot goes on
            None => drop(holder.pop()),
        }
        served_now(&mut [&mut c, &mut o2], &mut permits)
    }

    #[tokio::test(start_paused = true)]
    async fn a_caller_that_gave_up_after_a_key_mate_was_served_hands_its_place_to_its_next_caller()
    {
        let without_a = who_gets_the_next_slot(false).await;
        assert_eq!(
            without_a,
            ["c"],
            "control: a never came, c (64) goes before o2 (128)"
        );
        let with_a = who_gets_the_next_slot(true).await;
        assert_eq!(
            with_a, without_a,
            "a gave up: c (tag 128, from k's chain) was not handed a's place 0 (b, before \
             it, had been served), and went behind o2"
        );
    }

    const RECLAIM: Duration = Duration::from_secs(10);
    const KEY_WAIT: Duration = Duration::from_secs(1);
    /// Shorter than `RECLAIM`: construction accepts it.
    const CEILING_WAIT: Duration = Duration::from_secs(9);

    /// Key a (limit 1): a holder; w waits for a's slot (deadline 1 s on the
    /// key's clock). The key's slot is handed to w at 2.5 s (its task ran
    /// late: the key's clock is past its deadline, its tokio timer not yet
    /// fired), and w goes to wait for the full ceiling (up to 9 s). At 11.1 s,
    /// 8.6 s into w's ceiling wait, its key's slot (dated 2.5 s) is 1.4 s from
    /// its deadline: key a must not be evicted for a new key, and once the
    /// ceiling frees, no second call of a may be admitted beside w's.
    #[tokio::test(start_paused = true)]
    async fn a_key_is_not_evicted_while_its_caller_handed_a_slot_after_its_deadline_waits_for_the_ceiling(
    ) {
        let clock = ManualClock::new();
        let keyed = KeyedBulkhead::new(
            KeyedConfig::new(Config::new(1, RECLAIM).wait(KEY_WAIT).clock(clock.clone()))
                .ceiling(Config::new(2, LONG).wait(CEILING_WAIT).clock(clock.clone()))
                .max_keys(1),
        );
        let ceiling = keyed.ceiling().unwrap().clone();
        let holder = keyed.try_acquire(&"a").unwrap();
        let other = ceiling.try_acquire().unwrap();
        let mut w = come(&keyed, "a", "w");
        clock.advance(Duration::from_millis(2_500));
        drop(holder); // a's slot handed to w, at 2.5 s; the ceiling's comes free
        let refill = ceiling.try_acquire().unwrap();
        assert!(
            w.served().is_none(),
            "w waits for the ceiling, holding a's slot"
        );
        assert_eq!(ceiling.waiting(), 1);
        clock.advance(Duration::from_millis(8_600));
        // A new key: a is busy (w holds a slot taken 8.6 s ago, live for 1.4 s
        // more, and has 0.4 s of its ceiling wait left).
        let mut newcomer = spawn(Box::pin({
            let keyed = keyed.clone();
            async move { keyed.acquire(&"b").await }
        }) as Acquiring);
        let newcomer_outcome = newcomer.poll();
        let evicted = keyed.status(0).evicted;
        drop(newcomer);
        // The ceiling frees: w is admitted.
        drop(other);
        let w_permit = w.served().expect("w is admitted");
        drop(refill);
        let second = keyed.try_acquire(&"a");
        assert!(
            evicted == 0 && second.is_err(),
            "key a was evicted (evicted {evicted}, newcomer {:?}) while w waited for the ceiling \
             with a's slot; then a second call of a (limit 1) was admitted beside w's: {:?}",
            match newcomer_outcome {
                Poll::Ready(Err(e)) => format!("shed {:?}", e.reason()),
                Poll::Ready(Ok(_)) => "admitted".into(),
                Poll::Pending => "let in, waiting".into(),
            },
            second.as_ref().map(drop).map_err(|e| e.reason()),
        );
        drop(w_permit);
    }

    /// The same with no late hand-over: the caller got its key's slot at
    /// once, and its ceiling wait outlasts the key's `reclaim_after` on the
    /// key's clock (its task runs late: a busy runtime, as in keyed_late.rs,
    /// where a grant that lapsed while its caller waited for the ceiling is
    /// renewed and its key must not be evicted while the call is in flight).
    /// The line's `Arc` the caller holds keeps the key.
    #[tokio::test(start_paused = true)]
    async fn a_key_whose_caller_waits_for_the_ceiling_on_a_lapsed_grant_is_not_evicted() {
        let clock = ManualClock::new();
        let keyed = KeyedBulkhead::new(
            KeyedConfig::new(Config::new(1, RECLAIM).clock(clock.clone()))
                .ceiling(Config::new(2, LONG).wait(CEILING_WAIT))
                .max_keys(1),
        );
        let ceiling = keyed.ceiling().unwrap().clone();
        let (c1, c2) = (
            ceiling.try_acquire().unwrap(),
            ceiling.try_acquire().unwrap(),
        );
        let mut w = come(&keyed, "a", "w");
        clock.advance(RECLAIM * 2);
        let mut newcomer = spawn(Box::pin({
            let keyed = keyed.clone();
            async move { keyed.acquire(&"b").await }
        }) as Acquiring);
        let shed_as_too_many = matches!(
            newcomer.poll(),
            Poll::Ready(Err(ref e)) if e.reason() == ShedReason::TooManyKeys
        );
        let evicted = keyed.status(0).evicted;
        drop(newcomer);
        drop(c1);
        let w_permit = w
            .served()
            .expect("w is admitted on a fresh slot of its key's");
        drop(c2);
        let second = keyed.try_acquire(&"a");
        assert!(
            evicted == 0 && shed_as_too_many && second.is_err(),
            "key a was evicted (evicted {evicted}) while w waited for the ceiling; then a second \
             call of a (limit 1) was admitted beside w's: {:?}",
            second.as_ref().map(drop).map_err(|e| e.reason()),
        );
        drop(w_permit);
    }

    /// A caller of `key` admitted at once (a slot of the ceiling was free):
    /// it takes a turn, served as it comes.
    fn admitted(keyed: &KeyedBulkhead<&'static str>, key: &'static str) -> KeyedPermit {
        let keyed = keyed.clone();
        let future: Acquiring = Box::pin(async move { keyed.acquire(&key).await });
        match spawn(future).poll() {
            Poll::Ready(Ok(permit)) => permit,
            other => panic!("not admitted at once: {other:?}"),
        }
    }

    /// How "k"'s run begun at the virtual time leaves the line.
    #[derive(Clone, Copy, Debug)]
    enum RunLeft {
        /// Its one caller, s, is admitted at once.
        OneServed,
        /// s and t are handed slots, and t takes its slot up first.
        ServedLastFirst,
        /// s and t are handed slots; t takes its slot up, then s gives up.
        FirstGaveUpLast,
    }

    /// "o"'s o0..o3 (weight 2: tags 0, 32, 64, 96) and "k"'s a (0) wait;
    /// all are handed slots, and o0..o3 take them up (the virtual time is
    /// 96); a does not yet. "k"'s run begun at the virtual time (96) leaves
    /// the line as `how` says. "o"'s o4 comes, then "k"'s y (on the run
    /// that left: it begins a run). a gives up (its slot goes on). Without
    /// a, one more slot comes free.
    async fn after_a_run_that_left(how: RunLeft, with_a: bool) -> Vec<&'static str> {
        let keyed =
            KeyedBulkhead::new(
                eight_at_once(WAIT).weight_per_key(|key: &&str| if *key == "o" { 2 } else { 1 }),
            );
        let ceiling = keyed.ceiling().unwrap().clone();
        let mut holders: Vec<_> = (0..8).map(|_| ceiling.try_acquire().unwrap()).collect();
        let mut o: Vec<Caller> = ["o0", "o1", "o2", "o3"]
            .into_iter()
            .map(|name| come(&keyed, "o", name))
            .collect();
        let a = with_a.then(|| come(&keyed, "k", "a"));
        holders.truncate(holders.len() - 4 - usize::from(with_a));
        let mut permits: Vec<KeyedPermit> = o
            .iter_mut()
            .map(|o| o.served().expect("handed a slot"))
            .collect();
        if let RunLeft::OneServed = how {
            drop(holders.pop()); // nobody waits: the slot is free
            permits.push(admitted(&keyed, "k")); // s
        } else {
            let mut s = come(&keyed, "k", "s");
            let mut t = come(&keyed, "k", "t");
            holders.truncate(holders.len() - 2); // handed to s and t
            permits.push(t.served().expect("t handed a slot"));
            match how {
                RunLeft::ServedLastFirst => permits.push(s.served().expect("s handed a slot")),
                _ => {
                    drop(s); // its slot goes back: nobody waits
                    holders.push(ceiling.try_acquire().expect("s's slot came back"));
                }
            }
        }
        let mut o4 = come(&keyed, "o", "o4");
        let mut y = come(&keyed, "k", "y");
        match a {
            Some(a) => drop(a),
            None => drop(holders.pop()),
        }
        served_now(&mut [&mut y, &mut o4], &mut permits)
    }

    #[tokio::test(start_paused = true)]
    async fn a_caller_after_a_run_that_left_the_line_is_not_moved_into_an_earlier_run() {
        for how in [
            RunLeft::OneServed,
            RunLeft::ServedLastFirst,
            RunLeft::FirstGaveUpLast,
        ] {
            let without_a = after_a_run_that_left(how, false).await;
            assert_eq!(
                without_a,
                ["o4"],
                "{how:?}, control: a never came, o4 before y"
            );
            assert_eq!(
                after_a_run_that_left(how, true).await,
                without_a,
                "{how:?}: a gave up, and y (on the run begun at the virtual time, which left the \
                 line) was moved into a's tag 0, ahead of o4, which came before it"
            );
        }
    }
}
