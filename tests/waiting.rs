//! Bounded waiting through `Bulkhead::acquire`: a parked caller holds no slot,
//! freed slots go to the longest-parked caller, new arrivals never overtake,
//! `max_waiting` caps the line and the `wait` budget ends in `WaitExpired`.
//!
//! Time is paused; futures are polled by hand with `tokio_test::task::spawn`
//! so that nothing advances the clock but the test.

use std::task::Poll;
use std::time::Duration;
use tokio::time::advance;
use tokio_test::task::{spawn, Spawn};
use tower_inflight::{
    Acquire, Bulkhead, Config, ManualClock, Permit, ServiceSaturated, ShedReason,
};

const RECLAIM: Duration = Duration::from_secs(60);
const WAIT: Duration = Duration::from_millis(100);
const MS: Duration = Duration::from_millis(1);

fn waiting_bulkhead(limit: usize) -> Bulkhead {
    Bulkhead::new(Config::new(limit, RECLAIM).wait(WAIT).name("db"))
}

fn assert_parked(acquire: &mut Spawn<Acquire>) {
    match acquire.poll() {
        Poll::Pending => {}
        Poll::Ready(Ok(_)) => panic!("expected to be parked, was admitted"),
        Poll::Ready(Err(shed)) => panic!("expected to be parked, was shed: {shed}"),
    }
}

fn admitted(acquire: &mut Spawn<Acquire>) -> Permit {
    match acquire.poll() {
        Poll::Ready(Ok(permit)) => permit,
        Poll::Ready(Err(shed)) => panic!("expected a permit, was shed: {shed}"),
        Poll::Pending => panic!("expected a permit, still parked"),
    }
}

fn shed(acquire: &mut Spawn<Acquire>) -> ServiceSaturated {
    match acquire.poll() {
        Poll::Ready(Err(shed)) => shed,
        Poll::Ready(Ok(_)) => panic!("expected to be shed, was admitted"),
        Poll::Pending => panic!("expected to be shed, still parked"),
    }
}

#[tokio::test(start_paused = true)]
async fn acquire_with_a_free_slot_is_admitted_on_first_poll() {
    let bulkhead = waiting_bulkhead(1);
    let mut acquire = spawn(bulkhead.acquire());
    let permit = admitted(&mut acquire);
    assert_eq!(bulkhead.in_flight(), 1);
    assert_eq!(bulkhead.waiting(), 0);
    drop(permit);
    assert_eq!(bulkhead.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn parked_caller_holds_no_slot_and_is_counted_as_waiting() {
    let bulkhead = waiting_bulkhead(2);
    let _a = bulkhead.try_acquire().unwrap();
    let _b = bulkhead.try_acquire().unwrap();

    let mut first = spawn(bulkhead.acquire());
    let mut second = spawn(bulkhead.acquire());
    assert_parked(&mut first);
    assert_eq!(bulkhead.waiting(), 1);
    assert_parked(&mut second);
    assert_eq!(bulkhead.waiting(), 2);

    assert_eq!(bulkhead.in_flight(), 2, "parked callers must hold no slot");
    assert_eq!(bulkhead.available(), 0);
    advance(WAIT / 2).await;
    assert_parked(&mut first);
    assert_parked(&mut second);
    assert_eq!(bulkhead.in_flight(), 2);
    assert_eq!(bulkhead.waiting(), 2);
}

#[tokio::test(start_paused = true)]
async fn dropping_a_parked_acquire_leaves_the_line() {
    let bulkhead = waiting_bulkhead(1);
    let held = bulkhead.try_acquire().unwrap();
    let mut parked = spawn(bulkhead.acquire());
    assert_parked(&mut parked);
    assert_eq!(bulkhead.waiting(), 1);
    drop(parked);
    assert_eq!(bulkhead.waiting(), 0);
    drop(held);
    assert_eq!(
        bulkhead.in_flight(),
        0,
        "nobody was left to hand the slot to"
    );
    assert!(bulkhead.try_acquire().is_ok());
}

#[tokio::test(start_paused = true)]
async fn freed_slot_is_handed_to_the_parked_caller_and_wakes_it() {
    let bulkhead = waiting_bulkhead(1);
    let held = bulkhead.try_acquire().unwrap();
    let mut parked = spawn(bulkhead.acquire());
    assert_parked(&mut parked);
    assert!(!parked.is_woken());

    drop(held);
    assert!(parked.is_woken(), "the release must wake the parked caller");
    assert_eq!(
        bulkhead.in_flight(),
        1,
        "the slot went straight to the parked caller"
    );
    assert_eq!(bulkhead.waiting(), 0);
    let permit = admitted(&mut parked);
    assert!(!permit.was_reclaimed());
    drop(permit);
    assert_eq!(bulkhead.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn freed_slots_go_to_parked_callers_oldest_first() {
    let bulkhead = waiting_bulkhead(1);
    let held = bulkhead.try_acquire().unwrap();
    let mut line: Vec<_> = (0..4).map(|_| spawn(bulkhead.acquire())).collect();
    for acquire in &mut line {
        assert_parked(acquire);
    }
    assert_eq!(bulkhead.waiting(), 4);

    let mut permit = held;
    for turn in 0..4 {
        drop(permit);
        for (index, acquire) in line.iter_mut().enumerate().skip(turn) {
            assert_eq!(
                acquire.is_woken(),
                index == turn,
                "turn {turn}: only caller {turn} may be woken, not {index}"
            );
        }
        for later in line.iter_mut().skip(turn + 1) {
            assert_parked(later);
        }
        permit = admitted(&mut line[turn]);
        assert_eq!(bulkhead.waiting(), 3 - turn);
        assert_eq!(bulkhead.in_flight(), 1);
    }
    drop(permit);
    assert_eq!(bulkhead.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn two_freed_slots_go_to_the_two_oldest_parked_callers() {
    let bulkhead = waiting_bulkhead(2);
    let held = [
        bulkhead.try_acquire().unwrap(),
        bulkhead.try_acquire().unwrap(),
    ];
    let mut line: Vec<_> = (0..3).map(|_| spawn(bulkhead.acquire())).collect();
    for acquire in &mut line {
        assert_parked(acquire);
    }
    drop(held);
    assert!(line[0].is_woken() && line[1].is_woken());
    assert!(!line[2].is_woken());
    assert_parked(&mut line[2]);
    let _first = admitted(&mut line[0]);
    let _second = admitted(&mut line[1]);
    assert_eq!(bulkhead.waiting(), 1);
    assert_eq!(bulkhead.in_flight(), 2);
}

#[tokio::test(start_paused = true)]
async fn try_acquire_never_overtakes_a_parked_caller() {
    let bulkhead = waiting_bulkhead(1);
    let held = bulkhead.try_acquire().unwrap();
    let mut parked = spawn(bulkhead.acquire());
    assert_parked(&mut parked);

    drop(held);
    // The parked caller has not been polled since; the slot is still its.
    let shed = bulkhead.try_acquire().unwrap_err();
    assert_eq!(shed.reason(), ShedReason::LimitReached);
    let _permit = admitted(&mut parked);
}

#[tokio::test(start_paused = true)]
async fn new_acquire_parks_behind_the_line_instead_of_overtaking() {
    let bulkhead = waiting_bulkhead(1);
    let held = bulkhead.try_acquire().unwrap();
    let mut first = spawn(bulkhead.acquire());
    let mut second = spawn(bulkhead.acquire());
    assert_parked(&mut first);
    assert_parked(&mut second);

    drop(held);
    let mut newcomer = spawn(bulkhead.acquire());
    assert_parked(&mut newcomer);
    assert_parked(&mut second);
    let permit = admitted(&mut first);

    drop(permit);
    assert!(second.is_woken());
    assert!(!newcomer.is_woken());
    assert_parked(&mut newcomer);
    let permit = admitted(&mut second);

    drop(permit);
    let _permit = admitted(&mut newcomer);
}

#[tokio::test(start_paused = true)]
async fn reclaimed_slot_goes_to_the_parked_caller_not_to_a_new_arrival() {
    let clock = ManualClock::new();
    let bulkhead = Bulkhead::new(Config::new(1, RECLAIM).wait(WAIT).clock(clock.clone()));
    std::mem::forget(bulkhead.try_acquire().unwrap());
    let mut parked = spawn(bulkhead.acquire());
    assert_parked(&mut parked);

    // The leaked slot expires while the caller is parked (tokio time stands
    // still, so its wait budget is untouched).
    clock.advance(RECLAIM);
    assert!(
        bulkhead.try_acquire().is_err(),
        "a new arrival took the slot from a parked caller"
    );
    assert!(parked.is_woken());
    let permit = admitted(&mut parked);
    assert!(permit.was_reclaimed());
}

#[tokio::test(start_paused = true)]
async fn past_max_waiting_a_caller_is_shed_at_once_with_too_many_waiting() {
    let bulkhead = Bulkhead::new(Config::new(1, RECLAIM).wait(WAIT).max_waiting(2).name("db"));
    let _held = bulkhead.try_acquire().unwrap();
    let mut first = spawn(bulkhead.acquire());
    let mut second = spawn(bulkhead.acquire());
    assert_parked(&mut first);
    assert_parked(&mut second);

    let mut third = spawn(bulkhead.acquire());
    let refused = shed(&mut third);
    assert_eq!(refused.reason(), ShedReason::TooManyWaiting);
    assert_eq!(refused.name(), Some("db"));
    assert_eq!(refused.limit(), 1);
    #[cfg(feature = "http")]
    assert_eq!(refused.http_status().as_u16(), 503);
    assert_eq!(bulkhead.waiting(), 2, "the refused caller did not park");
    assert_eq!(bulkhead.in_flight(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_place_freed_under_max_waiting_can_be_taken_again() {
    let bulkhead = Bulkhead::new(Config::new(1, RECLAIM).wait(WAIT).max_waiting(1));
    let _held = bulkhead.try_acquire().unwrap();
    let mut first = spawn(bulkhead.acquire());
    assert_parked(&mut first);
    assert_eq!(
        shed(&mut spawn(bulkhead.acquire())).reason(),
        ShedReason::TooManyWaiting
    );
    drop(first);
    let mut again = spawn(bulkhead.acquire());
    assert_parked(&mut again);
    assert_eq!(bulkhead.waiting(), 1);
}

#[tokio::test(start_paused = true)]
async fn wait_budget_expiry_sheds_with_wait_expired_not_before_the_budget() {
    let bulkhead = waiting_bulkhead(1);
    let _held = bulkhead.try_acquire().unwrap();
    let mut parked = spawn(bulkhead.acquire());
    assert_parked(&mut parked);

    advance(WAIT - MS).await;
    assert!(!parked.is_woken(), "woken before the budget ran out");
    assert_parked(&mut parked);
    assert_eq!(bulkhead.waiting(), 1);

    advance(MS).await;
    assert!(parked.is_woken(), "not woken when the budget ran out");
    let expired = shed(&mut parked);
    assert_eq!(expired.reason(), ShedReason::WaitExpired);
    assert_eq!(expired.name(), Some("db"));
    assert_eq!(expired.limit(), 1);
    assert_eq!(bulkhead.waiting(), 0);
    assert_eq!(bulkhead.in_flight(), 1);
}

#[tokio::test(start_paused = true)]
async fn wait_budget_counts_from_when_the_caller_parks() {
    let bulkhead = waiting_bulkhead(1);
    let _held = bulkhead.try_acquire().unwrap();
    let mut parked = spawn(bulkhead.acquire());
    advance(WAIT * 3).await; // created but not polled: not parked yet
    assert_parked(&mut parked);
    advance(WAIT - MS).await;
    assert_parked(&mut parked);
    advance(MS).await;
    assert_eq!(shed(&mut parked).reason(), ShedReason::WaitExpired);
}

#[tokio::test(start_paused = true)]
async fn awaited_acquire_sheds_after_exactly_the_wait_budget() {
    let bulkhead = waiting_bulkhead(1);
    let _held = bulkhead.try_acquire().unwrap();
    let start = tokio::time::Instant::now();
    let expired = bulkhead.acquire().await.unwrap_err();
    assert_eq!(expired.reason(), ShedReason::WaitExpired);
    // Paused time auto-advances straight to the budget's timer: exact.
    assert_eq!(start.elapsed(), WAIT);
}

#[tokio::test(start_paused = true)]
async fn slot_freed_just_before_the_budget_ends_is_taken_not_shed() {
    let bulkhead = waiting_bulkhead(1);
    let held = bulkhead.try_acquire().unwrap();
    let mut parked = spawn(bulkhead.acquire());
    assert_parked(&mut parked);
    advance(WAIT - MS).await;
    drop(held);
    advance(MS).await; // the budget has run out too by the time it is polled
    let _permit = admitted(&mut parked);
}

#[tokio::test(start_paused = true)]
async fn slot_reclaimed_during_the_wait_is_handed_over_when_the_budget_ends() {
    let clock = ManualClock::new();
    let bulkhead = Bulkhead::new(Config::new(1, RECLAIM).wait(WAIT).clock(clock.clone()));
    std::mem::forget(bulkhead.try_acquire().unwrap());
    let mut parked = spawn(bulkhead.acquire());
    assert_parked(&mut parked);
    clock.advance(RECLAIM); // nobody releases: the slot just expires
    advance(WAIT).await;
    let permit = admitted(&mut parked);
    assert!(permit.was_reclaimed());
}

#[tokio::test(start_paused = true)]
async fn expired_waiter_passes_its_turn_to_the_next_in_line() {
    let bulkhead = waiting_bulkhead(1);
    let held = bulkhead.try_acquire().unwrap();
    let mut first = spawn(bulkhead.acquire());
    assert_parked(&mut first);
    advance(WAIT / 2).await;
    let mut second = spawn(bulkhead.acquire());
    assert_parked(&mut second);
    advance(WAIT / 2).await;
    assert_eq!(shed(&mut first).reason(), ShedReason::WaitExpired);
    assert_eq!(bulkhead.waiting(), 1);

    drop(held);
    assert!(second.is_woken());
    let _permit = admitted(&mut second);
}

#[tokio::test(start_paused = true)]
async fn slot_handed_to_a_caller_that_is_dropped_goes_to_the_next_in_line() {
    let bulkhead = waiting_bulkhead(1);
    let held = bulkhead.try_acquire().unwrap();
    let mut first = spawn(bulkhead.acquire());
    let mut second = spawn(bulkhead.acquire());
    assert_parked(&mut first);
    assert_parked(&mut second);

    drop(held);
    assert!(first.is_woken());
    drop(first); // handed the slot, never took it
    assert!(second.is_woken());
    assert_eq!(bulkhead.in_flight(), 1);
    let permit = admitted(&mut second);
    drop(permit);
    assert_eq!(bulkhead.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn reset_hands_the_freed_slots_to_parked_callers() {
    let bulkhead = waiting_bulkhead(1);
    let old = bulkhead.try_acquire().unwrap();
    let mut parked = spawn(bulkhead.acquire());
    assert_parked(&mut parked);
    bulkhead.reset();
    assert!(parked.is_woken());
    let new = admitted(&mut parked);
    drop(old);
    assert_eq!(
        bulkhead.in_flight(),
        1,
        "the stale permit freed the new one"
    );
    drop(new);
    assert_eq!(bulkhead.in_flight(), 0);
}
