//! Leaked slots and late releases: what no `Drop` covers is reclaimed after
//! `reclaim_after` (never before), and a late release never evicts the newer
//! holder, across reclaim and across `reset()`.
//!
//! `reclaim_after` is timed with `ManualClock`; nothing sleeps.

use std::convert::Infallible;
use std::future::{pending, poll_fn, Future};
use std::task::Poll;
use std::time::Duration;
use tower::{service_fn, Layer, Service, ServiceExt};
use tower_inflight::{BoxError, Bulkhead, ConcurrencyLayer, Config, ManualClock, ServiceSaturated};

const RECLAIM: Duration = Duration::from_secs(30);
const NANO: Duration = Duration::from_nanos(1);

fn manual(limit: usize) -> (Bulkhead, ManualClock) {
    let clock = ManualClock::new();
    let bulkhead = Bulkhead::new(Config::new(limit, RECLAIM).clock(clock.clone()));
    (bulkhead, clock)
}

#[test]
fn forgotten_permit_is_reclaimed_after_reclaim_after() {
    let (bulkhead, clock) = manual(1);
    std::mem::forget(bulkhead.try_acquire().unwrap());
    assert_eq!(bulkhead.in_flight(), 1);
    assert!(bulkhead.try_acquire().is_err());

    clock.advance(RECLAIM);
    assert!(!bulkhead.is_saturated(), "the expired slot can be taken");
    assert_eq!(
        bulkhead.in_flight(),
        1,
        "and counts as held until it is reclaimed"
    );
    let permit = bulkhead
        .try_acquire()
        .expect("the leaked slot was reclaimed");
    assert!(permit.was_reclaimed());
    assert_eq!(bulkhead.in_flight(), 1);
}

#[test]
fn forgotten_permit_is_not_reclaimed_before_reclaim_after() {
    let (bulkhead, clock) = manual(1);
    std::mem::forget(bulkhead.try_acquire().unwrap());
    clock.advance(RECLAIM - NANO);
    assert_eq!(bulkhead.in_flight(), 1);
    assert!(bulkhead.is_saturated());
    assert!(
        bulkhead.try_acquire().is_err(),
        "reclaimed {:?} early",
        NANO
    );
}

#[test]
fn forgotten_permit_taken_mid_tick_is_not_reclaimed_before_reclaim_after() {
    let clock = ManualClock::new();
    let reclaim = Duration::from_secs(1); // exactly 1024 ticks: no rounding up
    let bulkhead = Bulkhead::new(Config::new(1, reclaim).clock(clock.clone()));
    clock.advance(Duration::from_micros(900)); // inside the first tick (976.5 us)
    std::mem::forget(bulkhead.try_acquire().unwrap());

    // 999.1 ms after the claim: reclaim_after has not elapsed yet.
    clock.advance(Duration::from_micros(999_100));
    assert!(
        bulkhead.try_acquire().is_err(),
        "reclaimed {:?} after the claim, before reclaim_after ({reclaim:?})",
        clock.elapsed() - Duration::from_micros(900)
    );
}

#[test]
fn forgotten_permit_with_bytes_gives_its_bytes_back_after_reclaim_after() {
    let clock = ManualClock::new();
    let bulkhead = Bulkhead::new(Config::new(2, RECLAIM).max_bytes(1000).clock(clock.clone()));
    std::mem::forget(bulkhead.try_acquire_bytes(800).unwrap());
    assert!(bulkhead.try_acquire_bytes(800).is_err());
    clock.advance(RECLAIM);
    assert!(!bulkhead.is_saturated(), "the slot can be reclaimed");
    assert!(
        bulkhead.try_acquire_bytes(800).is_ok(),
        "the slot came back but its {} reserved bytes never will",
        bulkhead.bytes_reserved()
    );
}

#[test]
fn permit_not_forgotten_is_never_reported_as_reclaimed() {
    let (bulkhead, clock) = manual(1);
    let permit = bulkhead.try_acquire().unwrap();
    assert!(!permit.was_reclaimed());
    drop(permit);
    clock.advance(RECLAIM * 2);
    let again = bulkhead.try_acquire().unwrap();
    assert!(
        !again.was_reclaimed(),
        "a slot that was released is not a reclaimed one, however long ago"
    );
}

#[test]
fn each_leaked_slot_is_reclaimed_by_its_own_deadline() {
    let (bulkhead, clock) = manual(2);
    std::mem::forget(bulkhead.try_acquire().unwrap());
    clock.advance(RECLAIM / 2);
    std::mem::forget(bulkhead.try_acquire().unwrap());
    clock.advance(RECLAIM / 2);
    let first = bulkhead.try_acquire().unwrap();
    assert!(first.was_reclaimed());
    assert!(bulkhead.try_acquire().is_err());
    clock.advance(RECLAIM / 2);
    let second = bulkhead.try_acquire().unwrap();
    assert!(second.was_reclaimed());
}

#[test]
fn late_release_after_reclaim_leaves_the_new_holder_counted() {
    let (bulkhead, clock) = manual(1);
    let old = bulkhead.try_acquire().unwrap();
    clock.advance(RECLAIM); // a wedged holder, not a leaked one
    let new = bulkhead.try_acquire().unwrap();
    assert!(new.was_reclaimed());

    drop(old); // the wedged holder finally finishes
    assert_eq!(
        bulkhead.in_flight(),
        1,
        "the late release evicted the new holder"
    );
    assert!(
        bulkhead.try_acquire().is_err(),
        "the new holder's slot was freed"
    );

    drop(new);
    assert_eq!(bulkhead.in_flight(), 0);
}

#[test]
fn late_release_after_reset_in_the_same_tick_leaves_the_new_holder_counted() {
    let (bulkhead, clock) = manual(1);
    let old = bulkhead.try_acquire().unwrap();
    bulkhead.reset();
    assert_eq!(bulkhead.in_flight(), 0);
    let new = bulkhead.try_acquire().unwrap();
    assert_eq!(clock.elapsed(), Duration::ZERO, "no clock movement at all");

    drop(old);
    assert_eq!(
        bulkhead.in_flight(),
        1,
        "the stale permit freed the new one"
    );
    assert!(bulkhead.try_acquire().is_err());
    drop(new);
    assert_eq!(bulkhead.in_flight(), 0);
}

/// On a clock that stands still, one entry written two million times after
/// a reset comes round to the generation a permit from before the reset
/// wrote: the reset dates every later claim a tick on, so their words never
/// match its, and its late release frees nothing.
#[test]
fn a_late_release_after_a_reset_frees_nothing_however_often_its_entry_was_written() {
    let (bulkhead, clock) = manual(2);
    let stale = bulkhead.try_acquire_weighted(2).unwrap();
    bulkhead.reset();
    // A generation is 22 bits, and a claim and its release each bump it.
    for _ in 0..(1 << 21) - 1 {
        drop(bulkhead.try_acquire().unwrap());
    }
    let current = bulkhead.try_acquire().unwrap();
    assert_eq!(clock.elapsed(), Duration::ZERO, "no clock movement at all");
    drop(stale);
    assert_eq!((bulkhead.in_flight(), bulkhead.limit()), (1, 2));
    drop(current);
    assert_eq!(bulkhead.in_flight(), 0);
}

#[test]
fn late_releases_after_repeated_resets_in_the_same_tick_evict_nobody() {
    let (bulkhead, _clock) = manual(3);
    let mut stale = Vec::new();
    for _ in 0..5 {
        for _ in 0..3 {
            stale.push(bulkhead.try_acquire().unwrap());
        }
        bulkhead.reset();
    }
    let current: Vec<_> = (0..3).map(|_| bulkhead.try_acquire().unwrap()).collect();
    drop(stale);
    assert_eq!(bulkhead.in_flight(), 3);
    assert!(bulkhead.try_acquire().is_err());
    drop(current);
    assert_eq!(bulkhead.in_flight(), 0);
}

#[test]
fn reset_frees_every_slot_including_leaked_ones() {
    let (bulkhead, _clock) = manual(2);
    std::mem::forget(bulkhead.try_acquire().unwrap());
    let _held = bulkhead.try_acquire().unwrap();
    bulkhead.reset();
    assert_eq!(bulkhead.in_flight(), 0);
    assert_eq!(bulkhead.available(), 2);
}

#[test]
fn reset_gives_back_the_bytes_on_slots_and_keeps_those_split_off() {
    let clock = ManualClock::new();
    let bulkhead = Bulkhead::new(Config::new(4, RECLAIM).max_bytes(1000).clock(clock));
    std::mem::forget(bulkhead.try_acquire_bytes(300).unwrap());
    let late = bulkhead.try_acquire_bytes(200).unwrap();
    let mut split = bulkhead.try_acquire_bytes(100).unwrap();
    let reservation = split.split_bytes();
    bulkhead.reset();
    assert_eq!(bulkhead.bytes_reserved(), 100, "the split-off bytes stay");
    drop((late, split));
    assert_eq!(
        bulkhead.bytes_reserved(),
        100,
        "late releases give back nothing"
    );
    let next = bulkhead.try_acquire_bytes(900).unwrap();
    drop(reservation);
    assert_eq!(bulkhead.bytes_reserved(), 900, "only the new holder's");
    drop(next);
    assert_eq!(bulkhead.bytes_reserved(), 0);
}

// ---- through the tower layer ------------------------------------------------

/// Answers its request at once, except request 0, which hangs forever.
fn hanging_service() -> impl Service<
    u32,
    Response = u32,
    Error = Infallible,
    Future = impl Future<Output = Result<u32, Infallible>>,
> + Clone {
    service_fn(|request: u32| async move {
        if request == 0 {
            pending::<()>().await;
        }
        Ok::<_, Infallible>(request)
    })
}

fn shed_of(error: &BoxError) -> &ServiceSaturated {
    error
        .downcast_ref::<ServiceSaturated>()
        .unwrap_or_else(|| panic!("expected ServiceSaturated, got {error}"))
}

#[tokio::test]
async fn forgotten_response_future_is_reclaimed_after_reclaim_after() {
    let clock = ManualClock::new();
    let layer = ConcurrencyLayer::new(Config::new(1, RECLAIM).clock(clock.clone()));
    let bulkhead = layer.bulkhead();
    let mut service = layer.layer(hanging_service());

    let leaked = service.ready().await.unwrap().call(0);
    std::mem::forget(leaked);
    assert_eq!(bulkhead.in_flight(), 1);

    clock.advance(RECLAIM - NANO);
    let error = service.ready().await.unwrap().call(1).await.unwrap_err();
    shed_of(&error);

    clock.advance(NANO);
    assert!(!bulkhead.is_saturated());
    let permit = bulkhead
        .try_acquire()
        .expect("the leaked slot was reclaimed");
    assert!(
        permit.was_reclaimed(),
        "the slot came from the leaked future"
    );
    drop(permit);
    assert_eq!(service.ready().await.unwrap().call(1).await.unwrap(), 1);
}

#[tokio::test]
async fn call_through_the_layer_is_admitted_on_a_reclaimed_slot() {
    let clock = ManualClock::new();
    let layer = ConcurrencyLayer::new(Config::new(1, RECLAIM).clock(clock.clone()));
    let bulkhead = layer.bulkhead();
    let mut service = layer.layer(hanging_service());
    std::mem::forget(service.ready().await.unwrap().call(0));
    clock.advance(RECLAIM);
    assert_eq!(service.ready().await.unwrap().call(7).await.unwrap(), 7);
    assert_eq!(bulkhead.in_flight(), 0);
}

#[tokio::test]
async fn never_dropped_response_future_is_reclaimed_and_its_late_drop_evicts_nobody() {
    let clock = ManualClock::new();
    let layer = ConcurrencyLayer::new(Config::new(1, RECLAIM).clock(clock.clone()));
    let bulkhead = layer.bulkhead();
    let mut service = layer.layer(hanging_service());

    // Polled once and then kept alive, never dropped: a holder wedged forever.
    let mut wedged = Box::pin(service.ready().await.unwrap().call(0));
    let first_poll = poll_fn(|cx| Poll::Ready(wedged.as_mut().poll(cx))).await;
    assert!(first_poll.is_pending());
    clock.advance(RECLAIM - NANO);
    assert!(bulkhead.try_acquire().is_err());
    clock.advance(NANO);

    let new = bulkhead
        .try_acquire()
        .expect("the wedged slot was reclaimed");
    assert!(new.was_reclaimed());
    drop(wedged);
    assert_eq!(
        bulkhead.in_flight(),
        1,
        "the wedged future's drop freed the new holder"
    );
    drop(new);
    assert_eq!(bulkhead.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn forgotten_acquire_that_was_handed_a_slot_is_reclaimed() {
    let clock = ManualClock::new();
    let bulkhead = Bulkhead::new(
        Config::new(1, RECLAIM)
            .wait(Duration::from_millis(10))
            .clock(clock.clone()),
    );
    let held = bulkhead.try_acquire().unwrap();
    let mut parked = tokio_test::task::spawn(bulkhead.acquire());
    assert!(parked.poll().is_pending());
    drop(held); // handed to the parked caller...
    std::mem::forget(parked); // ...which vanishes without taking or passing it on
    assert_eq!(bulkhead.in_flight(), 1);
    clock.advance(RECLAIM - NANO);
    assert!(bulkhead.try_acquire().is_err());
    clock.advance(NANO);
    assert!(bulkhead.try_acquire().unwrap().was_reclaimed());
}

#[test]
fn forgotten_borrowed_permit_is_reclaimed_and_its_late_drop_frees_nothing() {
    let (bulkhead, clock) = manual(1);
    let leaked = bulkhead.try_acquire_borrowed().unwrap();
    clock.advance(RECLAIM);
    let newer = bulkhead.try_acquire().unwrap();
    assert!(newer.was_reclaimed());
    drop(leaked);
    assert_eq!(bulkhead.in_flight(), 1, "the newer holder keeps its slot");
    drop(newer);
    assert_eq!(bulkhead.in_flight(), 0);
}

/// A bulkhead whose only slot was handed to a caller waiting for it with
/// `bytes`, which has not run since; its clock then passes the deadline.
fn a_waiter_handed_a_slot_and_left_past_its_deadline(
    bytes: u64,
) -> (
    Bulkhead,
    tokio_test::task::Spawn<impl Future<Output = Result<tower_inflight::Permit, ServiceSaturated>>>,
) {
    let clock = ManualClock::new();
    let bulkhead = Bulkhead::new(
        Config::new(1, Duration::from_secs(30))
            .wait(Duration::from_secs(1))
            .max_bytes(1000)
            .clock(clock.clone()),
    );
    let held = bulkhead.try_acquire().unwrap();
    let waiter = bulkhead.clone();
    let mut waiter = tokio_test::task::spawn(async move { waiter.acquire_bytes(bytes).await });
    assert!(waiter.poll().is_pending());
    drop(held); // handed to the waiter, which does not run yet
    clock.advance(Duration::from_secs(31));
    (bulkhead, waiter)
}

/// What the waiter gets when it runs at last.
fn outcome<T>(waiter: &mut tokio_test::task::Spawn<impl Future<Output = T>>) -> T {
    match waiter.poll() {
        Poll::Ready(outcome) => outcome,
        Poll::Pending => panic!("the waiter still waits"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_grant_used_after_its_slot_was_reclaimed_never_takes_the_new_holder_s_bytes() {
    let (bulkhead, mut waiter) = a_waiter_handed_a_slot_and_left_past_its_deadline(300);
    let reclaimer = bulkhead.try_acquire_bytes(500).unwrap();
    assert!(reclaimer.was_reclaimed());
    // Its slot is gone, and no other is free.
    let late = outcome(&mut waiter);
    assert!(
        late.is_err(),
        "it does not hold a slot beside the reclaimer"
    );
    assert_eq!(bulkhead.bytes_reserved(), 500);
    drop(reclaimer);
    assert_eq!(
        bulkhead.bytes_reserved(),
        0,
        "the reclaimer's bytes came back"
    );
    assert_eq!(bulkhead.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_grant_used_after_its_deadline_takes_a_fresh_slot_and_the_limit_holds() {
    let (bulkhead, mut waiter) = a_waiter_handed_a_slot_and_left_past_its_deadline(600);
    let late = outcome(&mut waiter).unwrap();
    assert_eq!(late.bytes(), 600);
    // Its slot was claimed afresh: it cannot be reclaimed from under it now.
    let shed = bulkhead.try_acquire_bytes(300).unwrap_err();
    assert_eq!(shed.reason(), tower_inflight::ShedReason::LimitReached);
    assert_eq!((bulkhead.in_flight(), bulkhead.bytes_reserved()), (1, 600));
    drop(late);
    assert_eq!((bulkhead.in_flight(), bulkhead.bytes_reserved()), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_weighted_grant_that_lost_a_slot_is_never_made_a_lighter_permit() {
    let clock = ManualClock::new();
    let bulkhead = Bulkhead::new(
        Config::new(2, Duration::from_secs(30))
            .wait(Duration::from_secs(1))
            .clock(clock.clone()),
    );
    let held = bulkhead.try_acquire_weighted(2).unwrap();
    let waiter = bulkhead.clone();
    let mut waiter = tokio_test::task::spawn(async move {
        waiter
            .acquire_with(tower_inflight::Ticket::new().weight(2))
            .await
    });
    assert!(waiter.poll().is_pending());
    drop(held); // both slots handed to the waiter, which does not run yet
    clock.advance(Duration::from_secs(31));
    let reclaimer = bulkhead.try_acquire().unwrap(); // one of them, reclaimed
    assert!(reclaimer.was_reclaimed());
    let late = outcome(&mut waiter);
    assert!(late.is_err(), "a weight of 2 does not run on one slot");
    assert_eq!(bulkhead.in_flight(), 1);
    drop(reclaimer);
    assert_eq!(bulkhead.in_flight(), 0);
}

#[test]
fn a_full_table_of_65536_with_one_leaked_slot_sheds_until_its_deadline_then_admits_into_it() {
    const LIMIT: usize = 65_536;
    let (bulkhead, clock) = manual(LIMIT);
    let mut held: Vec<_> = (0..LIMIT)
        .map(|_| bulkhead.try_acquire().unwrap())
        .collect();
    // One holder vanishes, from the middle of the table.
    let leaked = held.swap_remove(LIMIT / 3);
    let leaked_slot = leaked.slot_indices()[0];
    std::mem::forget(leaked);

    clock.advance(RECLAIM / 2);
    // The others are released and taken again, so that only the leaked slot
    // is past its deadline when the time comes.
    held.clear();
    let held: Vec<_> = (0..LIMIT - 1)
        .map(|_| bulkhead.try_acquire().unwrap())
        .collect();
    for _ in 0..1000 {
        assert!(bulkhead.try_acquire().is_err(), "shed beside a held table");
    }
    assert!(bulkhead.is_saturated());

    clock.advance(RECLAIM / 2);
    assert!(!bulkhead.is_saturated());
    let reclaimer = bulkhead.try_acquire().expect("the leaked slot, reclaimed");
    assert!(reclaimer.was_reclaimed());
    // The leaked entry was freed, or the reclaimer wrote it again.
    assert!(bulkhead.slot_is_released(leaked_slot) || reclaimer.slot_indices() == [leaked_slot]);
    assert!(bulkhead.try_acquire().is_err());
    assert_eq!(bulkhead.status().totals.reclaimed, 1);
    drop((held, reclaimer));
    assert_eq!(bulkhead.in_flight(), 0);
}

#[test]
fn a_table_of_a_million_slots_fills_sheds_and_empties() {
    const LIMIT: usize = 1 << 20;
    let (bulkhead, _clock) = manual(LIMIT);
    let held: Vec<_> = (0..LIMIT)
        .map(|_| bulkhead.try_acquire().unwrap())
        .collect();
    assert_eq!(bulkhead.in_flight(), LIMIT);
    assert!(bulkhead.try_acquire().is_err());
    let mut slots: Vec<usize> = held.iter().map(|permit| permit.slot_indices()[0]).collect();
    slots.sort_unstable();
    slots.dedup();
    assert_eq!(slots.len(), LIMIT, "two permits on one slot");
    drop(held);
    assert_eq!(bulkhead.in_flight(), 0);
    assert_eq!(bulkhead.available(), LIMIT);
}
