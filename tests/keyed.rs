//! Bulkheads per key: each rule of `tower_inflight::keyed`.

mod support;

use support::turns::{order_served, served_in_turns};

use std::time::Duration;
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
use tower_inflight::keyed::{KeyedBulkhead, KeyedConcurrencyLayer, KeyedConfig};
use tower_inflight::{BoxError, Config, ManualClock, ServiceSaturated, ShedReason};

const LONG: Duration = Duration::from_secs(30);

fn reason<T>(outcome: Result<T, ServiceSaturated>) -> ShedReason {
    match outcome {
        Ok(_) => panic!("admitted"),
        Err(shed) => shed.reason(),
    }
}

#[test]
fn one_key_s_burst_leaves_the_other_keys_their_slots() {
    let keyed = KeyedBulkhead::new(KeyedConfig::new(Config::new(2, LONG)));
    let noisy: Vec<_> = (0..2)
        .map(|_| keyed.try_acquire(&"noisy").unwrap())
        .collect();
    for _ in 0..10 {
        assert_eq!(
            reason(keyed.try_acquire(&"noisy")),
            ShedReason::LimitReached
        );
    }
    let quiet = (
        keyed.try_acquire(&"quiet").unwrap(),
        keyed.try_acquire(&"quiet").unwrap(),
    );
    assert_eq!(keyed.keys(), 2);
    drop((noisy, quiet));
}

#[test]
fn a_call_takes_its_key_s_slot_and_the_ceiling_s_both_or_neither() {
    let keyed =
        KeyedBulkhead::new(KeyedConfig::new(Config::new(2, LONG)).ceiling(Config::new(3, LONG)));
    let a = (
        keyed.try_acquire(&1).unwrap(),
        keyed.try_acquire(&1).unwrap(),
    );
    let b = keyed.try_acquire(&2).unwrap();
    // Key 2 has room, the ceiling has none: key 2's slot is given back.
    assert_eq!(reason(keyed.try_acquire(&2)), ShedReason::LimitReached);
    let ceiling = keyed.ceiling().unwrap();
    assert_eq!(ceiling.in_flight(), 3);
    let status = keyed.status(10);
    let two = status.busiest.iter().find(|key| key.key == 2).unwrap();
    assert_eq!(
        (two.in_flight, two.limit),
        (1, 2),
        "the refused call holds nothing"
    );
    drop(a);
    assert_eq!(ceiling.in_flight(), 1);
    let more = (
        keyed.try_acquire(&2).unwrap(),
        keyed.try_acquire(&3).unwrap(),
    );
    assert_eq!(ceiling.in_flight(), 3);
    drop((b, more));
    assert_eq!(ceiling.in_flight(), 0);
}

#[test]
fn a_key_s_own_shed_says_so_and_the_ceiling_s_does_not() {
    let keyed = KeyedBulkhead::new(
        KeyedConfig::new(Config::new(1, Duration::from_secs(30)))
            .ceiling(Config::new(2, Duration::from_secs(30)).name("tenants")),
    );
    let _a = keyed.try_acquire(&"a").unwrap();
    let by_key = keyed.try_acquire(&"a").unwrap_err();
    assert!(by_key.is_per_key());
    assert_eq!(by_key.limit(), 1);
    // The per-key configuration has no name: the ceiling's names it.
    assert_eq!(by_key.name(), Some("tenants"));
    assert!(by_key.to_string().contains("limit 1 per key"), "{by_key}");

    let _b = keyed.try_acquire(&"b").unwrap();
    let by_ceiling = keyed.try_acquire(&"c").unwrap_err();
    assert!(!by_ceiling.is_per_key());
    assert_eq!(by_ceiling.limit(), 2);
    assert!(!by_ceiling.to_string().contains("per key"), "{by_ceiling}");
}

#[test]
fn too_many_keys_is_the_keyed_bulkhead_s_refusal_not_a_key_s() {
    for ceiling in [None, Some(Config::new(8, LONG))] {
        let mut config = KeyedConfig::new(Config::new(1, LONG)).max_keys(1);
        if let Some(ceiling) = ceiling {
            config = config.ceiling(ceiling);
        }
        let keyed = KeyedBulkhead::new(config);
        let _a = keyed.try_acquire(&"a").unwrap();
        let shed = keyed.try_acquire(&"b").unwrap_err();
        assert_eq!(shed.reason(), ShedReason::TooManyKeys);
        assert!(!shed.is_per_key(), "{shed}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_key_s_wait_that_runs_out_is_the_key_s_shed() {
    let wait = Duration::from_millis(10);
    let keyed = KeyedBulkhead::new(
        KeyedConfig::new(
            Config::new(1, Duration::from_secs(30))
                .wait(wait)
                .name("per-tenant"),
        )
        .ceiling(
            Config::new(8, Duration::from_secs(30))
                .wait(wait)
                .name("tenants"),
        ),
    );
    let _a = keyed.try_acquire(&"a").unwrap();
    let shed = keyed.acquire(&"a").await.unwrap_err();
    assert_eq!(shed.reason(), ShedReason::WaitExpired);
    assert!(shed.is_per_key());
    assert_eq!(shed.name(), Some("per-tenant"));
}

#[test]
fn a_limit_per_key_is_held_in_range() {
    let keyed = KeyedBulkhead::new(
        KeyedConfig::new(Config::new(2, LONG)).limit_per_key(|key: &u32| *key as usize),
    );
    // A limit of 0 is held to 1; 3 is 3.
    let zero = keyed.try_acquire(&0).unwrap();
    assert_eq!(reason(keyed.try_acquire(&0)), ShedReason::LimitReached);
    let three: Vec<_> = (0..3).map(|_| keyed.try_acquire(&3).unwrap()).collect();
    assert_eq!(reason(keyed.try_acquire(&3)), ShedReason::LimitReached);
    drop((zero, three));
}

#[test]
fn idle_keys_are_evicted_and_held_keys_never_are() {
    let keyed = KeyedBulkhead::new(KeyedConfig::new(Config::new(1, LONG)).max_keys(2));
    let held = keyed.try_acquire(&"held").unwrap();
    drop(keyed.try_acquire(&"idle").unwrap());
    // Full, with one idle key: a new key evicts it.
    let new = keyed.try_acquire(&"new").unwrap();
    assert_eq!(keyed.keys(), 2);
    // Full, with none idle: a new key is shed, and nothing is made for it.
    assert_eq!(
        reason(keyed.try_acquire(&"another")),
        ShedReason::TooManyKeys
    );
    assert_eq!(keyed.keys(), 2);
    // The held key kept its bulkhead: its limit of one still holds.
    assert_eq!(reason(keyed.try_acquire(&"held")), ShedReason::LimitReached);
    let status = keyed.status(10);
    assert_eq!(
        (status.keys, status.evicted, status.refused_new_keys),
        (2, 1, 1)
    );
    drop((held, new));
    assert!(keyed.try_acquire(&"another").is_ok());
}

/// Many keys are spread over several maps, each behind its own lock:
/// `max_keys` still bounds them all together, and an idle key in any of
/// them makes room for a new key of any other.
#[test]
fn max_keys_bounds_every_key_together_and_any_idle_key_makes_room() {
    const MAX_KEYS: u64 = 256;
    let keyed = KeyedBulkhead::new(KeyedConfig::new(Config::new(1, LONG)).max_keys(256));
    for key in 0..MAX_KEYS {
        drop(keyed.try_acquire(&key).expect("room for a key"));
    }
    // Each new key, held, evicts an idle one, wherever it is; the last ones
    // find none left in their own map.
    let held: Vec<_> = (MAX_KEYS..2 * MAX_KEYS)
        .map(|key| {
            keyed
                .try_acquire(&key)
                .unwrap_or_else(|shed| panic!("new key {key}: {shed:?}"))
        })
        .collect();
    assert_eq!(keyed.keys(), 256);
    assert_eq!(
        reason(keyed.try_acquire(&(2 * MAX_KEYS))),
        ShedReason::TooManyKeys
    );
    let status = keyed.status(0);
    assert_eq!((status.keys, status.evicted), (256, 256));
    drop(held);
}

/// A caller waiting for its key's slot keeps its key from eviction by new
/// keys of every shard.
#[tokio::test(flavor = "current_thread")]
async fn a_waiting_caller_keeps_its_key_from_eviction_by_any_shard() {
    const MAX_KEYS: usize = 128; // 2 shards
    let keyed = KeyedBulkhead::new(
        KeyedConfig::new(Config::new(1, LONG).wait(Duration::from_secs(10))).max_keys(MAX_KEYS),
    );
    // Key 0 held, and a caller waiting for it.
    let holder = keyed.try_acquire(&0).unwrap();
    let waiting = {
        let keyed = keyed.clone();
        tokio::spawn(async move { keyed.acquire(&0).await.map(|_| ()) })
    };
    tokio::task::yield_now().await;
    drop(holder);
    // The waiter is handed the slot; before it runs, floods of new keys of
    // every shard look for room.
    for id in 1..=(4 * MAX_KEYS as u64) {
        if let Err(shed) = keyed.try_acquire(&id) {
            assert_eq!(shed.reason(), ShedReason::TooManyKeys);
        }
    }
    waiting.await.unwrap().expect("the waiter got key 0's slot");
    assert!(keyed.keys() <= MAX_KEYS);
}

#[test]
fn a_key_s_leaked_slot_is_reclaimed_after_reclaim_after_not_before() {
    let clock = ManualClock::new();
    let keyed = KeyedBulkhead::new(KeyedConfig::new(
        Config::new(1, Duration::from_secs(10)).clock(clock.clone()),
    ));
    std::mem::forget(keyed.try_acquire(&"leaky").unwrap());
    clock.advance(Duration::from_secs(9));
    assert_eq!(
        reason(keyed.try_acquire(&"leaky")),
        ShedReason::LimitReached
    );
    clock.advance(Duration::from_secs(2));
    let reclaimed = keyed.try_acquire(&"leaky").unwrap();
    assert!(reclaimed.key_permit().was_reclaimed());
}

#[tokio::test(start_paused = true)]
async fn a_caller_waits_for_its_key_then_for_the_ceiling() {
    let wait = Duration::from_millis(100);
    let keyed = KeyedBulkhead::new(
        KeyedConfig::new(Config::new(1, LONG).wait(wait)).ceiling(Config::new(1, LONG).wait(wait)),
    );
    let held = keyed.try_acquire(&"a").unwrap();
    let waiting = tokio::spawn({
        let keyed = keyed.clone();
        async move { keyed.acquire(&"b").await.map(drop) }
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    drop(held); // the ceiling's slot goes to b
    waiting.await.unwrap().unwrap();

    // Nothing frees the ceiling: shed once the ceiling's budget is spent,
    // and b's own slot goes back.
    let held = keyed.try_acquire(&"a").unwrap();
    assert_eq!(reason(keyed.acquire(&"b").await), ShedReason::WaitExpired);
    assert!(keyed.status(10).busiest.iter().all(|key| key.key != "b"));
    drop(held);
}

/// A key with many callers waiting for the ceiling and a key with one take
/// turns: the first caller of each key waiting goes before the second of
/// any, however many a key sends (here up to its limit of 8 at once).
#[tokio::test(start_paused = true)]
async fn a_key_with_many_callers_and_a_key_with_one_take_turns_at_the_ceiling() {
    let wait = Duration::from_secs(10);
    let keyed = KeyedBulkhead::new(
        KeyedConfig::new(Config::new(8, LONG).wait(wait)).ceiling(Config::new(1, LONG).wait(wait)),
    );
    let held = keyed.try_acquire(&"other").unwrap();
    let mut callers = vec!["noisy"; 8];
    callers.push("quiet");
    let order = order_served(&keyed, &callers, move || drop(held)).await;
    let quiet = order.iter().position(|key| *key == "quiet").unwrap();
    assert!(
        quiet <= 1,
        "the quiet key waited behind {quiet} noisy calls: {order:?}"
    );
}

/// A key below its guaranteed share gets the next slots freed, ahead of a
/// key that borrowed the whole ceiling while the other was idle.
#[tokio::test(start_paused = true)]
async fn a_key_below_its_share_gets_the_next_freed_slots() {
    let wait = Duration::from_secs(10);
    let keyed = KeyedBulkhead::new(
        KeyedConfig::new(Config::new(4, LONG).wait(wait))
            .ceiling(Config::new(4, LONG).wait(wait))
            .guarantee_per_key(|key: &&str| if *key == "small" { 2 } else { 0 }),
    );
    // "big" borrows every slot while "small" is idle.
    let borrowed: Vec<_> = (0..4).map(|_| keyed.try_acquire(&"big").unwrap()).collect();
    assert!(keyed.try_acquire(&"other").is_err(), "the ceiling is full");
    // "other" comes first, but is at its share (none): "small" goes ahead.
    let order = order_served(&keyed, &["other", "small", "small"], move || drop(borrowed)).await;
    assert_eq!(order, ["small", "small", "other"]);
}

#[test]
fn bad_configuration_is_refused_naming_the_field() {
    let refused = |config: KeyedConfig<u32>| KeyedBulkhead::try_new(config).unwrap_err().field();
    assert_eq!(refused(KeyedConfig::new(Config::new(0, LONG))), "limit");
    assert_eq!(
        refused(KeyedConfig::new(Config::new(1, LONG)).ceiling(Config::new(1, Duration::ZERO))),
        "ceiling.reclaim_after"
    );
    assert_eq!(
        refused(KeyedConfig::new(Config::new(1, LONG)).ceiling(Config::new(0, LONG))),
        "ceiling.limit"
    );
    assert_eq!(
        refused(KeyedConfig::new(Config::new(1, LONG)).max_keys(0)),
        "max_keys"
    );
    // The ceiling's line takes turns across keys: an order of its own
    // would be overridden.
    assert_eq!(
        refused(
            KeyedConfig::new(Config::new(1, LONG))
                .ceiling(Config::new(2, LONG).queue_order(tower_inflight::QueueOrder::Lifo))
        ),
        "ceiling.queue_order"
    );
    assert!(KeyedBulkhead::<u32>::try_new(
        KeyedConfig::new(Config::new(1, LONG).queue_order(tower_inflight::QueueOrder::Lifo))
            .ceiling(Config::new(2, LONG))
    )
    .is_ok());
    // A caller holds its key's slot while it waits for the ceiling's: a
    // wait that outlasts the key's `reclaim_after` would see the slot
    // reclaimed from under it, and the key run past its limit.
    let per_key = Config::new(1, Duration::from_secs(1));
    let ceiling = |wait| Config::new(2, LONG).wait(wait);
    assert_eq!(
        refused(KeyedConfig::new(per_key.clone()).ceiling(ceiling(Duration::from_secs(1)))),
        "ceiling.wait"
    );
    assert!(KeyedBulkhead::<u32>::try_new(
        KeyedConfig::new(per_key).ceiling(ceiling(Duration::from_millis(999)))
    )
    .is_ok());
    // No byte budget: the keyed layers reserve no bytes, and would ignore it.
    assert_eq!(
        refused(KeyedConfig::new(Config::new(1, LONG).max_bytes(100))),
        "max_bytes"
    );
    assert_eq!(
        refused(
            KeyedConfig::new(Config::new(1, LONG)).ceiling(Config::new(1, LONG).max_bytes(100))
        ),
        "ceiling.max_bytes"
    );
    // A cluster ceiling is the keyed ceiling's to have, not each key's.
    #[cfg(feature = "redis")]
    {
        let client = redis::Client::open("redis://127.0.0.1:1/").unwrap();
        let on_redis = tower_inflight::redis::ClusterCeiling::new(client, "tenants", 10);
        assert_eq!(
            refused(KeyedConfig::new(
                Config::new(1, LONG).cluster_ceiling(on_redis)
            )),
            "cluster_ceiling"
        );
        // On the keyed ceiling, a lease asked for as the wait ends may take
        // its round trip (100 ms by default) more.
        let client = redis::Client::open("redis://127.0.0.1:1/").unwrap();
        let on_redis = tower_inflight::redis::ClusterCeiling::new(client, "tenants", 10);
        assert_eq!(
            refused(
                KeyedConfig::new(Config::new(1, Duration::from_secs(1))).ceiling(
                    Config::new(2, LONG)
                        .wait(Duration::from_millis(950))
                        .cluster_ceiling(on_redis)
                )
            ),
            "ceiling.wait"
        );
    }
}

#[tokio::test]
async fn the_layer_keys_each_request_and_sheds_with_service_saturated() {
    let layer = KeyedConcurrencyLayer::new(
        KeyedConfig::new(Config::new(1, LONG)),
        |request: &(&'static str, u32)| request.0,
    );
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let released = std::sync::Arc::new(std::sync::Mutex::new(Some(released)));
    let mut service = ServiceBuilder::new()
        .layer(layer.clone())
        .service(service_fn(move |(_, n): (&'static str, u32)| {
            let gate = released.lock().unwrap().take();
            async move {
                if let Some(gate) = gate {
                    let _ = gate.await;
                }
                Ok::<_, BoxError>(n)
            }
        }));
    let first = tokio::spawn(service.ready().await.unwrap().call(("a", 1)));
    tokio::task::yield_now().await;
    let shed = service
        .ready()
        .await
        .unwrap()
        .call(("a", 2))
        .await
        .unwrap_err();
    assert_eq!(
        shed.downcast_ref::<ServiceSaturated>().unwrap().reason(),
        ShedReason::LimitReached
    );
    assert_eq!(
        service.ready().await.unwrap().call(("b", 3)).await.unwrap(),
        3
    );
    release.send(()).unwrap();
    assert_eq!(first.await.unwrap().unwrap(), 1);
    assert_eq!(service.oneshot(("a", 4)).await.unwrap(), 4);
    assert!(layer.bulkhead().status(10).busiest.is_empty());
}

/// Keys all used since the sweep last passed them are idle all the same: a
/// new key takes the place of one, however many keys are held and however
/// recently each was used.
#[test]
fn a_new_key_evicts_an_idle_key_even_when_every_key_was_used_lately() {
    let keyed = KeyedBulkhead::new(KeyedConfig::new(Config::new(1, LONG)).max_keys(300));
    for key in 0..300u32 {
        drop(keyed.try_acquire(&key).unwrap());
    }
    for new in 300..350u32 {
        for key in new - 300..new {
            drop(keyed.try_acquire(&key).unwrap());
        }
        assert!(
            keyed.try_acquire(&new).is_ok(),
            "key {new} was shed though every key held was idle"
        );
    }
    let status = keyed.status(0);
    assert_eq!((status.keys, status.refused_new_keys), (300, 0));
}

/// A new key with no room is shed for too many keys even while the ceiling
/// is full (what its caller can mend is the keys it uses); a key held, or a
/// new key with room, is shed for the full ceiling, and no idle key is
/// evicted for it.
#[test]
fn a_new_key_with_no_room_is_shed_for_too_many_keys_while_the_ceiling_is_full() {
    let keyed = KeyedBulkhead::new(
        KeyedConfig::new(Config::new(2, LONG))
            .ceiling(Config::new(2, LONG))
            .max_keys(2),
    );
    let held = (
        keyed.try_acquire(&"a").unwrap(),
        keyed.try_acquire(&"b").unwrap(),
    );
    assert!(keyed.ceiling().unwrap().is_saturated());
    assert_eq!(reason(keyed.try_acquire(&"new")), ShedReason::TooManyKeys);
    assert_eq!(reason(keyed.try_acquire(&"a")), ShedReason::LimitReached);
    assert_eq!(keyed.status(0).refused_new_keys, 1);
    // "b" idle, the ceiling still full (a direct caller of it): a new key
    // would find room, and is shed for the ceiling; "b" stays.
    drop(held.1);
    let direct = keyed.ceiling().unwrap().try_acquire().unwrap();
    assert_eq!(reason(keyed.try_acquire(&"new")), ShedReason::LimitReached);
    let status = keyed.status(0);
    assert_eq!(
        (status.keys, status.evicted, status.refused_new_keys),
        (2, 0, 1)
    );
    drop((held.0, direct));
}

/// A leaked permit holds its key's slot until `reclaim_after`, and its key
/// with it; past that the key is idle (the next call would reclaim the
/// slot), so it no longer takes a place for good.
#[test]
fn a_key_whose_permit_was_leaked_is_evicted_once_its_slot_is_reclaimable_not_before() {
    let clock = ManualClock::new();
    let keyed = KeyedBulkhead::new(
        KeyedConfig::new(Config::new(1, Duration::from_secs(10)).clock(clock.clone())).max_keys(1),
    );
    std::mem::forget(keyed.try_acquire(&"leaky").unwrap());
    assert_eq!(reason(keyed.try_acquire(&"new")), ShedReason::TooManyKeys);
    clock.advance(Duration::from_secs(10) - Duration::from_micros(1));
    assert_eq!(reason(keyed.try_acquire(&"new")), ShedReason::TooManyKeys);
    clock.advance(Duration::from_micros(1));
    assert!(keyed.try_acquire(&"new").is_ok());
    assert_eq!(keyed.status(0).evicted, 1);
}

/// A key that once leaked a permit, and is called every 100 ms since: once
/// the leaked slot could be reclaimed, the key holds nothing and a new key
/// takes its place.
#[test]
fn a_key_in_use_since_it_leaked_a_permit_is_evicted_once_the_slot_is_reclaimable() {
    let clock = ManualClock::new();
    let keyed = KeyedBulkhead::new(
        KeyedConfig::new(Config::new(2, Duration::from_secs(10)).clock(clock.clone())).max_keys(1),
    );
    std::mem::forget(keyed.try_acquire(&"leaky").unwrap());
    for _ in 0..99 {
        clock.advance(Duration::from_millis(100));
        drop(keyed.try_acquire(&"leaky").unwrap());
        assert_eq!(reason(keyed.try_acquire(&"new")), ShedReason::TooManyKeys);
    }
    clock.advance(Duration::from_millis(100));
    drop(keyed.try_acquire(&"leaky").unwrap());
    assert!(keyed.try_acquire(&"new").is_ok());
    assert_eq!(keyed.status(0).evicted, 1);
}

/// The layer tries for a slot before it waits; that try is no shed: the
/// bulkheads record only what came of the call.
#[tokio::test(start_paused = true)]
async fn a_call_that_waits_and_is_served_is_not_counted_as_shed() {
    let wait = Duration::from_secs(10);
    let layer = KeyedConcurrencyLayer::new(
        KeyedConfig::new(Config::new(1, LONG).wait(wait)).ceiling(Config::new(1, LONG).wait(wait)),
        |request: &&'static str| *request,
    );
    let keyed = layer.bulkhead();
    let service = ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(|_: &'static str| async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            Ok::<_, BoxError>(())
        }));
    let (a, b, c) = tokio::join!(
        service.clone().oneshot("a"),
        service.clone().oneshot("a"),
        service.clone().oneshot("b")
    );
    a.unwrap();
    b.unwrap();
    c.unwrap();
    let ceiling = keyed.ceiling().unwrap().status().totals;
    assert_eq!(ceiling.admitted, 3);
    assert_eq!(ceiling.rejected_limit, 0, "{ceiling:?}");
}

/// A key never has more slots than the ceiling: a limit past it is held to
/// it, and a key's table is no bigger than the ceiling's.
#[test]
fn a_key_s_limit_is_held_to_the_ceiling_s() {
    let keyed = KeyedBulkhead::new(
        KeyedConfig::new(Config::new(2, LONG))
            .ceiling(Config::new(10, LONG))
            .limit_per_key(|_: &u32| usize::MAX),
    );
    let held = keyed.try_acquire(&1).unwrap();
    assert_eq!(keyed.status(1).busiest[0].limit, 10);
    drop(held);
}

/// A limit function may look at the keyed bulkhead itself (keys are made
/// outside its lock), and one that panics gives its key's place back.
#[test]
fn limit_functions_may_read_the_keyed_bulkhead_and_may_panic() {
    let this = std::sync::Arc::new(std::sync::OnceLock::<KeyedBulkhead<u32>>::new());
    let keyed = KeyedBulkhead::new(
        KeyedConfig::new(Config::new(1, LONG))
            .max_keys(1)
            .limit_per_key({
                let this = this.clone();
                move |key: &u32| {
                    assert_ne!(*key, 0, "no limit for key 0");
                    this.get().map_or(1, |keyed| keyed.keys() + 1)
                }
            }),
    );
    this.set(keyed.clone()).unwrap();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            keyed.try_acquire(&0).map(drop)
        }))
        .is_err();
        let admitted = keyed.try_acquire(&1).map(drop).is_ok();
        done.send((panicked, admitted)).unwrap();
    });
    let (panicked, admitted) = finished
        .recv_timeout(Duration::from_secs(60))
        .expect("a limit function that reads the keyed bulkhead deadlocked it");
    assert!(panicked);
    assert!(admitted, "the panicking key's place was lost");
}

fn turns_config() -> KeyedConfig<&'static str> {
    let wait = Duration::from_secs(20);
    KeyedConfig::new(Config::new(4, LONG).wait(wait)).ceiling(Config::new(4, LONG).wait(wait))
}

/// A key of weight 2 is given two freed ceiling slots for each one a key of
/// weight 1 is given, while both have callers waiting.
#[tokio::test(start_paused = true)]
async fn a_key_of_weight_two_gets_two_turns_at_the_ceiling_to_one() {
    let keyed =
        KeyedBulkhead::new(
            turns_config().weight_per_key(|key: &&str| if *key == "heavy" { 2 } else { 1 }),
        );
    let order = served_in_turns(&keyed, &[("light", 4), ("heavy", 4)], 60).await;
    let heavy = order.iter().filter(|key| **key == "heavy").count();
    assert!((38..=42).contains(&heavy), "{heavy} of 60: {order:?}");
}

/// A key that keeps one caller waiting does not starve a key whose callers
/// came in a burst: turns follow the line's virtual time, not each key's
/// count of callers.
#[tokio::test(start_paused = true)]
async fn a_key_that_keeps_one_caller_waiting_does_not_starve_a_burst() {
    let keyed = KeyedBulkhead::new(turns_config());
    let order = served_in_turns(&keyed, &[("burst", 4), ("steady", 1)], 40).await;
    let burst = order.iter().filter(|key| **key == "burst").count();
    assert!(
        (18..=22).contains(&burst),
        "the burst got {burst} of 40 turns: {order:?}"
    );
}

/// A permit that outlived its hold and was dropped after its key's slot
/// was reclaimed by another call frees nothing of the new holder's, and a
/// slot released is free at once (no cooldown), per key as for any
/// bulkhead.
#[test]
fn a_late_release_frees_nothing_of_the_new_holder_s_and_a_release_is_free_at_once() {
    let clock = ManualClock::new();
    let keyed = KeyedBulkhead::new(KeyedConfig::new(
        Config::new(1, Duration::from_secs(10)).clock(clock.clone()),
    ));
    let slow = keyed.try_acquire(&"a").unwrap();
    clock.advance(Duration::from_secs(10));
    let reclaimed = keyed.try_acquire(&"a").unwrap();
    assert!(reclaimed.key_permit().was_reclaimed());
    drop(slow);
    assert_eq!(reason(keyed.try_acquire(&"a")), ShedReason::LimitReached);
    drop(reclaimed);
    assert!(keyed.try_acquire(&"a").is_ok());
}

/// Under `tower::retry`, each attempt takes its key's slot and the
/// ceiling's, and gives both back; a call in backoff holds neither; an
/// attempt shed is not retried and surfaces `ServiceSaturated`.
#[tokio::test(start_paused = true)]
async fn under_retry_each_attempt_takes_and_returns_its_own_slots() {
    use std::sync::{Arc, Mutex};

    type Held = Arc<Mutex<Vec<(usize, usize)>>>;

    /// Retries every failure but a shed, up to `left` times; notes what is
    /// held at each backoff, and takes the key's only slot at the backoff
    /// numbered `steal_at`.
    #[derive(Clone)]
    struct Retries {
        left: usize,
        keyed: KeyedBulkhead<&'static str>,
        in_backoff: Held,
        steal_at: Option<usize>,
        stolen: Arc<Mutex<Vec<tower_inflight::keyed::KeyedPermit>>>,
    }

    impl tower::retry::Policy<u32, u32, BoxError> for Retries {
        type Future = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

        fn retry(
            &mut self,
            _: &mut u32,
            result: &mut Result<u32, BoxError>,
        ) -> Option<Self::Future> {
            match result {
                Err(error) if !error.is::<ServiceSaturated>() && self.left > 0 => {
                    self.left -= 1;
                    let mut in_backoff = self.in_backoff.lock().unwrap();
                    in_backoff.push(held(&self.keyed));
                    if self.steal_at == Some(in_backoff.len()) {
                        self.stolen
                            .lock()
                            .unwrap()
                            .push(self.keyed.try_acquire(&"k").unwrap());
                    }
                    Some(Box::pin(tokio::time::sleep(Duration::from_millis(10))))
                }
                _ => None,
            }
        }

        fn clone_request(&mut self, request: &u32) -> Option<u32> {
            Some(*request)
        }
    }

    /// The key's slots held and the ceiling's.
    fn held(keyed: &KeyedBulkhead<&'static str>) -> (usize, usize) {
        let key = keyed
            .status(1)
            .busiest
            .first()
            .map_or(0, |key| key.in_flight);
        (key, keyed.ceiling().unwrap().in_flight())
    }

    for steal_at in [None, Some(1)] {
        let layer = KeyedConcurrencyLayer::new(
            KeyedConfig::new(Config::new(1, LONG)).ceiling(Config::new(2, LONG)),
            |_: &u32| "k",
        );
        let keyed = layer.bulkhead();
        let (attempts, seen): (Arc<Mutex<usize>>, Held) = Default::default();
        let flaky = {
            let (attempts, seen, keyed) = (attempts.clone(), seen.clone(), keyed.clone());
            service_fn(move |request: u32| {
                seen.lock().unwrap().push(held(&keyed));
                let mut attempts = attempts.lock().unwrap();
                *attempts += 1;
                let outcome = if *attempts <= 3 {
                    Err::<u32, BoxError>("transient failure".into())
                } else {
                    Ok(request)
                };
                async move { outcome }
            })
        };
        let policy = Retries {
            left: 3,
            keyed: keyed.clone(),
            in_backoff: Held::default(),
            steal_at,
            stolen: Arc::default(),
        };
        let (in_backoff, stolen) = (policy.in_backoff.clone(), policy.stolen.clone());
        let mut service = ServiceBuilder::new()
            .retry(policy)
            .layer(layer)
            .service(flaky);
        let outcome = service.ready().await.unwrap().call(42).await;
        match steal_at {
            None => {
                assert_eq!(outcome.unwrap(), 42);
                assert_eq!(
                    *seen.lock().unwrap(),
                    [(1, 1); 4],
                    "each attempt holds one of each"
                );
                assert_eq!(
                    *in_backoff.lock().unwrap(),
                    [(0, 0); 3],
                    "a backoff holds none"
                );
            }
            Some(_) => {
                let shed = outcome.unwrap_err().downcast::<ServiceSaturated>().unwrap();
                assert_eq!(shed.reason(), ShedReason::LimitReached);
                assert_eq!(seen.lock().unwrap().len(), 1, "the shed attempt never ran");
                assert_eq!(held(&keyed), (1, 1), "only the stolen slots are held");
                stolen.lock().unwrap().clear();
            }
        }
        assert_eq!(held(&keyed), (0, 0));
    }
}
