//! A key's slot taken up late: handed to a caller whose task runs only
//! after the slot's deadline (a busy runtime), or claimed by a layer's call
//! whose future is polled late. The call is admitted on a fresh slot, or
//! shed by its key, and either way its key and the ceiling count it once,
//! both or neither, and its key is not evicted while it is in flight.

use std::sync::Arc;
use std::time::Duration;
use tower_inflight::keyed::{KeyedBulkhead, KeyedConfig};
use tower_inflight::{Config, ManualClock, ShedReason};

const LONG: Duration = Duration::from_secs(30);
const RECLAIM: Duration = Duration::from_secs(1);
/// Shorter than `RECLAIM`: construction accepts it.
const CEILING_WAIT: Duration = Duration::from_millis(500);

/// Lets the spawned callers run up to their next park (paused time: the
/// ceiling's wait of 500 ms is far off).
async fn settle() {
    tokio::time::sleep(Duration::from_millis(10)).await;
}

/// Key a, whose one call is in flight on a slot taken just now, must not be
/// evicted for a new key b (a cap of one key): b is refused.
fn assert_a_stays_while_b_is_refused(keyed: &KeyedBulkhead<&'static str>) {
    let b = keyed.try_acquire(&"b");
    let evicted = keyed.status(0).evicted;
    assert!(
        b.as_ref()
            .is_err_and(|shed| shed.reason() == ShedReason::TooManyKeys)
            && evicted == 0,
        "key a, whose call is in flight on a slot taken just now, was evicted for key b \
         (b: {:?}, evicted {evicted})",
        b.as_ref().map(drop).map_err(|shed| shed.reason()),
    );
}

// ---------------------------------------------------------------------------
// A slot whose deadline passed before its caller took it up: the permit
// is made on a fresh slot, which is what the key notes, so the sweep never
// takes the key for one whose every slot is past its deadline.
// ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_permit_made_on_a_fresh_slot_after_its_grant_lapsed_keeps_its_key() {
    let clock = ManualClock::new();
    let keyed = KeyedBulkhead::new(
        KeyedConfig::new(Config::new(1, RECLAIM).clock(clock.clone()))
            .ceiling(Config::new(2, LONG).wait(CEILING_WAIT))
            .max_keys(1),
    );
    let ceiling = keyed.ceiling().unwrap().clone();
    let c1 = ceiling.try_acquire().unwrap();
    let c2 = ceiling.try_acquire().unwrap();
    let waiter = tokio::spawn({
        let keyed = keyed.clone();
        async move { keyed.acquire(&"a").await }
    });
    settle().await;
    // The key's clock runs past the grant's deadline while it waits.
    clock.advance(RECLAIM * 2);
    drop(c1);
    let a = waiter
        .await
        .unwrap()
        .expect("a's call gets the ceiling's slot and a fresh slot of its key's");
    drop(c2);
    assert!(
        !a.key_permit().was_reclaimed(),
        "precondition: a's permit is on a slot freshly taken"
    );
    // a's one call is in flight, its slot taken just now (deadline 1 s
    // ahead): its key must not be evicted for a new key.
    assert_a_stays_while_b_is_refused(&keyed);
    // Key a's limit is 1, and its one call is still in flight.
    let second = keyed.try_acquire(&"a");
    assert!(
        second.is_err(),
        "a second call of key a (limit 1) was admitted while its first is in flight"
    );
    drop(a);
}

/// The same fault with no ceiling at all, nor any ceiling wait for the
/// validation to bound: a slot handed to a caller parked on its key, whose
/// task is polled only after the slot's deadline (a busy executor). Before
/// the key's slot is claimed afresh, and that is the slot its key notes.
#[tokio::test(start_paused = true)]
async fn a_slot_handed_over_and_taken_up_late_keeps_its_key_without_a_ceiling() {
    let clock = ManualClock::new();
    let keyed = KeyedBulkhead::new(
        KeyedConfig::new(
            Config::new(1, RECLAIM)
                .wait(CEILING_WAIT)
                .clock(clock.clone()),
        )
        .max_keys(1),
    );
    let first = keyed.try_acquire(&"a").unwrap();
    let waiter = tokio::spawn({
        let keyed = keyed.clone();
        async move { keyed.acquire(&"a").await }
    });
    settle().await;
    // The slot is handed to the parked caller, whose task runs only once
    // the key's clock is past the handed slot's deadline.
    drop(first);
    clock.advance(RECLAIM * 2);
    let a = waiter.await.unwrap().expect("a's waiter is admitted");
    assert_a_stays_while_b_is_refused(&keyed);
    assert!(
        keyed.try_acquire(&"a").is_err(),
        "a second call of key a (limit 1) was admitted while its first is in flight"
    );
    drop(a);
}

/// The same on the system clock: the executor thread is blocked for longer
/// than `reclaim_after` (plus the coarse clock's 10 ms) between the hand-over
/// and the waiter's poll. Not timing-flaky: a blocking sleep is a lower
/// bound on the time that passes.
#[tokio::test(start_paused = true)]
async fn a_slot_handed_over_and_taken_up_late_keeps_its_key_on_the_system_clock() {
    let reclaim = Duration::from_millis(100);
    let keyed = KeyedBulkhead::new(
        KeyedConfig::new(Config::new(1, reclaim).wait(Duration::from_millis(50))).max_keys(1),
    );
    let first = keyed.try_acquire(&"a").unwrap();
    let waiter = tokio::spawn({
        let keyed = keyed.clone();
        async move { keyed.acquire(&"a").await }
    });
    tokio::task::yield_now().await;
    tokio::task::yield_now().await;
    drop(first);
    // A busy executor: the woken waiter is polled 300 ms later.
    std::thread::sleep(Duration::from_millis(300));
    let a = waiter.await.unwrap().expect("a's waiter is admitted");
    assert_a_stays_while_b_is_refused(&keyed);
    drop(a);
}

// ---------------------------------------------------------------------------
// A slot reclaimed (by another caller of the key, past its deadline)
// before its caller took it up: the call is shed by its key, and the
// ceiling, whose slot it was granted, does not count it admitted.
// ---------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_call_its_key_sheds_after_the_ceiling_admitted_it_is_not_counted_by_the_ceiling() {
    let clock = ManualClock::new();
    let keyed = KeyedBulkhead::new(
        KeyedConfig::new(Config::new(1, RECLAIM).clock(clock.clone()))
            .ceiling(Config::new(1, LONG).wait(CEILING_WAIT)),
    );
    let ceiling = keyed.ceiling().unwrap().clone();
    let c = ceiling.try_acquire().unwrap();
    let first = tokio::spawn({
        let keyed = keyed.clone();
        async move { keyed.acquire(&"a").await.map(drop).map_err(|s| s.reason()) }
    });
    settle().await;
    clock.advance(RECLAIM * 2);
    // A second caller of a reclaims the first's lapsed slot, and waits for
    // the ceiling behind it.
    let second = tokio::spawn({
        let keyed = keyed.clone();
        async move {
            keyed
                .acquire(&"a")
                .await
                .map(|permit| permit.key_permit().was_reclaimed())
                .map_err(|s| s.reason())
        }
    });
    settle().await;
    drop(c);
    let first = first.await.unwrap();
    let second = second.await.unwrap();
    let admitted_calls = 1 + usize::from(first.is_ok()) + usize::from(second.is_ok());
    let ceiling_admitted = ceiling.status().totals.admitted;
    assert_eq!(
        ceiling_admitted as usize, admitted_calls,
        "the ceiling counts {ceiling_admitted} admissions for {admitted_calls} calls admitted \
         (first: {first:?}, second: {second:?})"
    );
}

/// F2 with no ceiling wait at all (the ceiling has room): the slot handed
/// to a parked caller of a key is reclaimed, past its deadline, by another
/// call of the key before the waiter's task runs; the waiter then takes the
/// ceiling's slot (counted admitted there) and only then finds its key's
/// gone: the ceiling gives its slot back uncounted.
#[tokio::test(start_paused = true)]
async fn a_late_waiter_whose_handed_slot_was_reclaimed_is_not_counted_by_the_ceiling() {
    let clock = ManualClock::new();
    let keyed = KeyedBulkhead::new(
        KeyedConfig::new(
            Config::new(1, RECLAIM)
                .wait(CEILING_WAIT)
                .clock(clock.clone()),
        )
        .ceiling(Config::new(4, LONG)),
    );
    let ceiling = keyed.ceiling().unwrap().clone();
    let first = keyed.try_acquire(&"a").unwrap();
    let waiter = tokio::spawn({
        let keyed = keyed.clone();
        async move { keyed.acquire(&"a").await.map(drop).map_err(|s| s.reason()) }
    });
    settle().await;
    drop(first);
    clock.advance(RECLAIM * 2);
    let reclaimer = keyed
        .try_acquire(&"a")
        .expect("the lapsed slot is reclaimed");
    let waited = waiter.await.unwrap();
    assert_eq!(waited, Err(ShedReason::LimitReached));
    drop(reclaimer);
    let totals = ceiling.status().totals;
    assert_eq!(
        totals.admitted, 2,
        "the ceiling counts {} admissions for 2 calls admitted (first, reclaimer); the waiter \
         was shed by its key",
        totals.admitted
    );
}

// ---------------------------------------------------------------------------
// The tower layer's path that claims the key's slot in `call` and waits for
// the ceiling's in the response future (`Start::Wait(Some(held))`), reached
// deterministically: a heavy caller parked at the head of the ceiling's line
// leaves a slot free (so the ceiling is not saturated) that a light caller
// cannot take.
// ---------------------------------------------------------------------------

mod layer {
    use super::*;
    use std::task::{Context, Poll};
    use tokio::sync::Notify;
    use tower::{service_fn, BoxError, Service, ServiceBuilder, ServiceExt};
    use tower_inflight::keyed::KeyedConcurrencyLayer;
    use tower_inflight::{Bulkhead, Permit, Ticket};

    fn in_flight_of(keyed: &KeyedBulkhead<&'static str>, key: &str) -> usize {
        keyed
            .status(16)
            .busiest
            .iter()
            .find(|status| status.key == key)
            .map_or(0, |status| status.in_flight)
    }

    /// The ceiling, one slot held and a caller of weight 2 parked at its head.
    async fn ceiling_with_heavy_at_head(
        ceiling: &Bulkhead,
    ) -> (Permit, tokio::task::JoinHandle<Result<Permit, ShedReason>>) {
        let held = ceiling.try_acquire().unwrap();
        let heavy = tokio::spawn({
            let ceiling = ceiling.clone();
            async move {
                ceiling
                    .acquire_with(Ticket::new().weight(2))
                    .await
                    .map_err(|s| s.reason())
            }
        });
        settle().await;
        assert_eq!(ceiling.waiting(), 1);
        assert!(!ceiling.is_saturated());
        (held, heavy)
    }

    /// Cancellation: a response future dropped before it is polled, and one
    /// dropped while it waits in the ceiling's line, give their key's slot
    /// back.
    #[tokio::test(start_paused = true)]
    async fn a_layer_call_dropped_unpolled_or_mid_wait_gives_its_key_slot_back() {
        let layer = KeyedConcurrencyLayer::new(
            KeyedConfig::new(Config::new(1, LONG)).ceiling(Config::new(2, LONG).wait(CEILING_WAIT)),
            |request: &&'static str| *request,
        );
        let keyed = layer.bulkhead();
        let ceiling = keyed.ceiling().unwrap().clone();
        let (held, heavy) = ceiling_with_heavy_at_head(&ceiling).await;
        let mut service =
            ServiceBuilder::new()
                .layer(layer)
                .service(service_fn(|_: &'static str| async {
                    Ok::<_, BoxError>(())
                }));
        service.ready().await.unwrap();
        let unpolled = service.call("a");
        assert_eq!(
            in_flight_of(&keyed, "a"),
            1,
            "the key's slot is claimed in call"
        );
        drop(unpolled);
        assert_eq!(in_flight_of(&keyed, "a"), 0);
        service.ready().await.unwrap();
        let mut mid_wait = Box::pin(service.call("a"));
        let waker = futures_util::task::noop_waker();
        assert!(matches!(
            std::future::Future::poll(mid_wait.as_mut(), &mut Context::from_waker(&waker)),
            Poll::Pending
        ));
        assert_eq!(ceiling.waiting(), 2);
        drop(mid_wait);
        assert_eq!(ceiling.waiting(), 1);
        assert_eq!(in_flight_of(&keyed, "a"), 0);
        drop(held);
        drop(heavy.await.unwrap().unwrap());
        assert_eq!(ceiling.in_flight(), 0);
        assert!(keyed.try_acquire(&"a").is_ok());
    }

    /// Through the layer: the key's slot is claimed in `call`, its
    /// deadline running from there, while the ceiling's wait (the one the
    /// configuration bounds) starts only at the future's first poll. A
    /// response future polled after `reclaim_after` is admitted on a fresh
    /// slot, and its key stays while it is in flight.
    #[tokio::test(start_paused = true)]
    async fn a_layer_call_polled_late_keeps_its_key_while_in_flight() {
        let clock = ManualClock::new();
        let layer = KeyedConcurrencyLayer::new(
            KeyedConfig::new(Config::new(1, RECLAIM).clock(clock.clone()))
                .ceiling(Config::new(2, LONG).wait(CEILING_WAIT))
                .max_keys(1),
            |request: &&'static str| *request,
        );
        let keyed = layer.bulkhead();
        let ceiling = keyed.ceiling().unwrap().clone();
        let (held, heavy) = ceiling_with_heavy_at_head(&ceiling).await;
        let release = Arc::new(Notify::new());
        let mut service = ServiceBuilder::new().layer(layer).service(service_fn({
            let release = release.clone();
            move |_: &'static str| {
                let release = release.clone();
                async move {
                    release.notified().await;
                    Ok::<_, BoxError>(())
                }
            }
        }));
        service.ready().await.unwrap();
        let response = service.call("a");
        assert_eq!(
            in_flight_of(&keyed, "a"),
            1,
            "the key's slot is claimed in call"
        );
        drop(held);
        drop(heavy.await.unwrap().unwrap());
        // The response future is polled 2 s (the key's clock) after `call`.
        clock.advance(RECLAIM * 2);
        let call = tokio::spawn(response);
        settle().await;
        assert_eq!(ceiling.in_flight(), 1, "a's call is in flight");
        assert_a_stays_while_b_is_refused(&keyed);
        release.notify_waiters();
        call.await.unwrap().unwrap();
    }
}
