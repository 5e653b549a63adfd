//! Weighted permits: a call that takes several slots takes all of them or
//! none, gives all of them back, and, waiting at the head of the line, is
//! never bypassed by lighter callers.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::Rng;
use tower_inflight::{Bulkhead, Config, ManualClock, QueueOrder, ShedReason, Ticket};

const RECLAIM: Duration = Duration::from_secs(30);

fn waiting(limit: usize, order: QueueOrder) -> Bulkhead {
    Bulkhead::new(
        Config::new(limit, RECLAIM)
            .wait(Duration::from_secs(10))
            .queue_order(order),
    )
}

/// Takes `slots` slots, one permit each.
fn hold(bulkhead: &Bulkhead, slots: usize) -> Vec<tower_inflight::Permit> {
    (0..slots)
        .map(|_| bulkhead.try_acquire().unwrap())
        .collect()
}

/// Spawns a caller that waits for `weight` slots and lets them go at once.
fn spawn_weighted(
    bulkhead: &Bulkhead,
    weight: usize,
) -> tokio::task::JoinHandle<Result<(), tower_inflight::ServiceSaturated>> {
    support::spawn_acquire(bulkhead, Ticket::new().weight(weight))
}

/// Spawns callers named and weighted as given, one after the other, each
/// waiting for its slots, logging its name once it has them and holding
/// them a millisecond; returns the log and the tasks.
async fn park_in_turn(
    bulkhead: &Bulkhead,
    callers: &[(char, usize)],
) -> (Arc<Mutex<String>>, Vec<tokio::task::JoinHandle<()>>) {
    let log = Arc::new(Mutex::new(String::new()));
    let mut tasks = Vec::new();
    for &(name, weight) in callers {
        let (bulkhead, log) = (bulkhead.clone(), log.clone());
        tasks.push(tokio::spawn(async move {
            let permit = bulkhead
                .acquire_with(Ticket::new().weight(weight))
                .await
                .unwrap();
            log.lock().unwrap().push(name);
            tokio::time::sleep(Duration::from_millis(1)).await;
            drop(permit);
        }));
        tokio::task::yield_now().await;
    }
    (log, tasks)
}

#[test]
fn a_weighted_permit_takes_its_slots_together_and_gives_them_all_back() {
    let bulkhead = Bulkhead::new(Config::new(5, RECLAIM));
    let heavy = bulkhead.try_acquire_weighted(3).unwrap();
    assert_eq!(bulkhead.in_flight(), 3);
    let light = bulkhead.try_acquire_weighted(2).unwrap();
    assert_eq!(bulkhead.available(), 0);
    drop(heavy);
    assert_eq!(bulkhead.in_flight(), 2);
    drop(light);
    assert_eq!(bulkhead.in_flight(), 0);
    assert_eq!(bulkhead.status().totals.admitted, 2, "a permit counts once");
}

#[test]
fn a_weight_that_does_not_fit_takes_nothing() {
    let bulkhead = Bulkhead::new(Config::new(4, RECLAIM));
    let _held = bulkhead.try_acquire_weighted(2).unwrap();
    let shed = bulkhead.try_acquire_weighted(3).unwrap_err();
    assert_eq!(shed.reason(), ShedReason::LimitReached);
    assert_eq!(
        bulkhead.in_flight(),
        2,
        "no slot of the refused call stays held"
    );
    assert!(bulkhead.try_acquire_weighted(2).is_ok());
}

#[test]
fn a_weight_of_zero_or_over_the_limit_is_refused_as_invalid() {
    let bulkhead = Bulkhead::new(Config::new(4, RECLAIM));
    for weight in [0, 5, usize::MAX] {
        let shed = bulkhead.try_acquire_weighted(weight).unwrap_err();
        assert_eq!(shed.reason(), ShedReason::InvalidWeight, "weight {weight}");
    }
    assert_eq!(bulkhead.in_flight(), 0);
    assert_eq!(bulkhead.status().totals.rejected_invalid_weight, 3);
    assert_eq!(bulkhead.status().totals.rejected(), 3);
    assert!(
        bulkhead.try_acquire_weighted(4).is_ok(),
        "the whole limit is a valid weight"
    );
}

#[tokio::test(start_paused = true)]
async fn an_invalid_weight_is_refused_at_once_even_with_a_wait_budget() {
    let bulkhead = waiting(2, QueueOrder::Fifo);
    let shed = bulkhead
        .acquire_with(Ticket::new().weight(3))
        .await
        .unwrap_err();
    assert_eq!(shed.reason(), ShedReason::InvalidWeight);
    assert_eq!(bulkhead.waiting(), 0);
}

#[test]
fn a_forgotten_weighted_permit_is_reclaimed_whole_and_its_late_drop_frees_nothing() {
    let clock = ManualClock::new();
    let bulkhead = Bulkhead::new(Config::new(3, RECLAIM).clock(clock.clone()));
    let leaked = bulkhead.try_acquire_weighted(3).unwrap();
    assert!(bulkhead.try_acquire().is_err());
    clock.advance(RECLAIM);
    let newer = bulkhead.try_acquire_weighted(3).unwrap();
    assert!(newer.was_reclaimed());
    drop(leaked); // late: its slots belong to `newer` now
    assert_eq!(bulkhead.in_flight(), 3);
    assert!(bulkhead.try_acquire().is_err());
    drop(newer);
    assert_eq!(bulkhead.in_flight(), 0);
}

#[test]
fn a_weighted_permit_dropped_after_reset_frees_nothing_of_the_new_holders() {
    let bulkhead = Bulkhead::new(Config::new(2, RECLAIM));
    let before = bulkhead.try_acquire_weighted(2).unwrap();
    bulkhead.reset();
    let after = bulkhead.try_acquire_weighted(2).unwrap();
    drop(before);
    assert_eq!(bulkhead.in_flight(), 2);
    drop(after);
    assert_eq!(bulkhead.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_heavy_head_of_the_line_is_not_bypassed_by_lighter_callers() {
    let bulkhead = waiting(3, QueueOrder::Fifo);
    let held: Vec<_> = (0..3).map(|_| bulkhead.try_acquire().unwrap()).collect();
    let (log, callers) = park_in_turn(&bulkhead, &[('h', 3), ('l', 1)]).await;
    let mut held = held.into_iter();
    held.next();
    held.next();
    // Two slots free: enough for the light caller, not for the heavy head.
    // They stay free for the head; nobody (parked or new) takes them.
    tokio::task::yield_now().await;
    assert_eq!(bulkhead.in_flight(), 1);
    assert_eq!(bulkhead.waiting(), 2);
    assert!(bulkhead.try_acquire().is_err());
    assert_eq!(log.lock().unwrap().as_str(), "");
    held.next();
    for caller in callers {
        caller.await.unwrap();
    }
    assert_eq!(log.lock().unwrap().as_str(), "hl");
    assert_eq!(bulkhead.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn lightest_first_lets_light_work_drain_while_slots_gather_for_heavy_work() {
    let lightest_first = QueueOrder::custom(|a, b| a.weight().cmp(&b.weight()));
    let bulkhead = waiting(3, lightest_first);
    let held: Vec<_> = (0..3).map(|_| bulkhead.try_acquire().unwrap()).collect();
    let (log, callers) = park_in_turn(&bulkhead, &[('h', 3), ('l', 1), ('m', 1)]).await;
    drop(held);
    for caller in callers {
        caller.await.unwrap();
    }
    assert_eq!(log.lock().unwrap().as_str(), "lmh");
}

#[tokio::test(start_paused = true)]
async fn a_heavy_caller_that_gives_up_at_the_head_lets_the_line_move() {
    let bulkhead = Bulkhead::new(Config::new(2, RECLAIM).wait(Duration::from_millis(50)));
    let first = bulkhead.try_acquire().unwrap();
    let heavy = spawn_weighted(&bulkhead, 2);
    tokio::task::yield_now().await;
    let light = spawn_weighted(&bulkhead, 1);
    tokio::task::yield_now().await;
    let aborted_at = tokio::time::Instant::now();
    heavy.abort();
    assert!(heavy.await.unwrap_err().is_cancelled());
    // The light caller is at the head now, beside a free slot: it is served
    // at once, not when its own budget runs out.
    light.await.unwrap().unwrap();
    assert!(aborted_at.elapsed() < Duration::from_millis(50));
    drop(first);
    assert_eq!(bulkhead.in_flight(), 0);
    assert_eq!(bulkhead.waiting(), 0);
}

#[tokio::test(start_paused = true)]
async fn status_counts_waiting_callers_by_priority() {
    let bulkhead = waiting(1, QueueOrder::PriorityFifo);
    let held = bulkhead.try_acquire().unwrap();
    let mut callers = Vec::new();
    for priority in [0, 5, 5] {
        let bulkhead = bulkhead.clone();
        callers.push(tokio::spawn(async move {
            bulkhead.acquire_with_priority(priority).await.map(drop)
        }));
        tokio::task::yield_now().await;
    }
    let by_priority = bulkhead.status().waiting_by_priority;
    assert_eq!(
        by_priority.into_iter().collect::<Vec<_>>(),
        [(0, 1), (5, 2)]
    );
    callers.pop().unwrap().abort();
    tokio::task::yield_now().await;
    let by_priority = bulkhead.status().waiting_by_priority;
    assert_eq!(
        by_priority.into_iter().collect::<Vec<_>>(),
        [(0, 1), (5, 1)]
    );
    drop(held);
    for caller in callers {
        caller.await.unwrap().unwrap();
    }
    assert!(bulkhead.status().waiting_by_priority.is_empty());
}

/// Threads take permits of random weights (waiting or not) and drop them at
/// random, counting the slots they hold: the count never passes the limit,
/// and everything comes back.
#[test]
fn weighted_acquisition_under_contention_never_oversubscribes() {
    const LIMIT: usize = 6;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    let bulkhead = Bulkhead::new(
        Config::new(LIMIT, RECLAIM)
            .wait(Duration::from_millis(20))
            .queue_order(QueueOrder::PriorityFifo),
    );
    let holding = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let admitted = Arc::new(AtomicUsize::new(0));
    runtime.block_on(async {
        let tasks: Vec<_> = (0..8u64)
            .map(|seed| {
                let (bulkhead, holding, peak, admitted) = (
                    bulkhead.clone(),
                    holding.clone(),
                    peak.clone(),
                    admitted.clone(),
                );
                tokio::spawn(async move {
                    let mut rng = Rng::new(seed + 1);
                    for _ in 0..2_000 {
                        let weight = 1 + rng.below(3) as usize;
                        let ticket = Ticket::new().weight(weight).priority(rng.below(3) as i32);
                        let permit = if rng.below(2) == 0 {
                            bulkhead.try_acquire_weighted(weight)
                        } else {
                            bulkhead.acquire_with(ticket).await
                        };
                        let Ok(permit) = permit else { continue };
                        admitted.fetch_add(1, Ordering::Relaxed);
                        let now = holding.fetch_add(weight, Ordering::SeqCst) + weight;
                        peak.fetch_max(now, Ordering::SeqCst);
                        if rng.below(4) == 0 {
                            tokio::task::yield_now().await;
                        }
                        holding.fetch_sub(weight, Ordering::SeqCst);
                        drop(permit);
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
    });
    assert!(
        peak.load(Ordering::SeqCst) <= LIMIT,
        "peak {}",
        peak.load(Ordering::SeqCst)
    );
    assert!(admitted.load(Ordering::Relaxed) > 1_000);
    assert_eq!(bulkhead.in_flight(), 0);
    assert_eq!(bulkhead.waiting(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_heavy_head_whose_budget_runs_out_hands_the_free_slots_to_the_caller_behind() {
    let bulkhead = Bulkhead::new(Config::new(2, RECLAIM).wait(Duration::from_millis(50)));
    let first = bulkhead.try_acquire().unwrap();
    let started = tokio::time::Instant::now();
    let heavy = spawn_weighted(&bulkhead, 2);
    tokio::time::sleep(Duration::from_millis(30)).await;
    let light = spawn_weighted(&bulkhead, 1);
    let shed = heavy.await.unwrap().unwrap_err();
    assert_eq!(shed.reason(), ShedReason::WaitExpired);
    // The light caller, which arrived 30 ms in, gets the free slot when the
    // heavy head gives up at 50 ms, not when its own budget ends at 80 ms.
    light.await.unwrap().unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(80),
        "{:?}",
        started.elapsed()
    );
    drop(first);
    assert_eq!(bulkhead.in_flight(), 0);
}

#[test]
fn a_weighted_refusal_records_the_slots_actually_held_as_the_peak() {
    let bulkhead = Bulkhead::new(Config::new(4, RECLAIM));
    let _held = hold(&bulkhead, 2);

    let shed = bulkhead.try_acquire_weighted(3).unwrap_err();

    assert_eq!(shed.reason(), ShedReason::LimitReached);
    // Two slots stood free: the minute's peak is the two held, not the limit.
    assert_eq!(bulkhead.status().last_minute.peak_in_flight, 2);
}

#[tokio::test(start_paused = true)]
async fn a_weighted_caller_parked_beside_free_slots_records_the_slots_actually_held() {
    let bulkhead = waiting(4, QueueOrder::Fifo);
    let held = hold(&bulkhead, 2);

    let heavy = spawn_weighted(&bulkhead, 3);
    while bulkhead.waiting() == 0 {
        tokio::task::yield_now().await;
    }

    assert_eq!(bulkhead.status().last_minute.peak_in_flight, 2);
    drop(held);
    heavy.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_caller_refused_beside_slots_set_aside_for_a_weighted_head_records_the_slots_held() {
    let bulkhead = Bulkhead::new(Config::new(4, RECLAIM).wait(Duration::from_secs(10)));
    let held = hold(&bulkhead, 2);
    let heavy = spawn_weighted(&bulkhead, 3);
    while bulkhead.waiting() == 0 {
        tokio::task::yield_now().await;
    }

    // Two slots are free, but they wait for the heavy caller at the head.
    let shed = bulkhead.try_acquire().unwrap_err();

    assert_eq!(shed.reason(), ShedReason::LimitReached);
    assert_eq!(bulkhead.status().last_minute.peak_in_flight, 2);
    drop(held);
    heavy.await.unwrap().unwrap();
}
