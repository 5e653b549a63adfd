//! Queue orders: who gets a freed slot first, and that nobody jumps the line.

use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower_inflight::{Bulkhead, Config, QueueOrder};

/// Parks callers named `a`, `b`, ... with the given priorities, in that
/// order, behind a held slot, then frees one slot at a time and returns the
/// order in which they were served.
async fn served(order: QueueOrder, priorities: &[i32]) -> String {
    let bulkhead = Bulkhead::new(
        Config::new(1, Duration::from_secs(30))
            .wait(Duration::from_secs(10))
            .queue_order(order),
    );
    let held = bulkhead.try_acquire().unwrap();
    let log = Arc::new(Mutex::new(String::new()));
    let mut callers = Vec::new();
    for (i, &priority) in priorities.iter().enumerate() {
        let name = char::from(b'a' + i as u8);
        let (bulkhead, log) = (bulkhead.clone(), log.clone());
        callers.push(tokio::spawn(async move {
            let permit = bulkhead.acquire_with_priority(priority).await.unwrap();
            log.lock().unwrap().push(name);
            // Hold the slot a moment, so the next is served only after.
            tokio::time::sleep(Duration::from_millis(1)).await;
            drop(permit);
        }));
        tokio::task::yield_now().await;
    }
    assert_eq!(bulkhead.waiting(), priorities.len());
    drop(held);
    for caller in callers {
        caller.await.unwrap();
    }
    let served = log.lock().unwrap().clone();
    served
}

#[tokio::test(start_paused = true)]
async fn fifo_serves_the_longest_waiting_first() {
    assert_eq!(served(QueueOrder::Fifo, &[1, 0, 1, 0]).await, "abcd");
}

#[tokio::test(start_paused = true)]
async fn lifo_serves_the_newest_first() {
    assert_eq!(served(QueueOrder::Lifo, &[1, 0, 1, 0]).await, "dcba");
}

#[tokio::test(start_paused = true)]
async fn priority_fifo_serves_lower_priorities_first_then_oldest() {
    assert_eq!(
        served(QueueOrder::PriorityFifo, &[1, 0, 1, 0]).await,
        "bdac"
    );
}

#[tokio::test(start_paused = true)]
async fn priority_lifo_serves_lower_priorities_first_then_newest() {
    assert_eq!(
        served(QueueOrder::PriorityLifo, &[1, 0, 1, 0]).await,
        "dbca"
    );
}

#[tokio::test(start_paused = true)]
async fn adaptive_lifo_is_lifo_while_the_line_is_long_then_fifo() {
    // Five wait; past 2 waiting the newest go first (e, d, c), then the
    // last two oldest first (a, b).
    assert_eq!(
        served(QueueOrder::AdaptiveLifo { after: 2 }, &[0; 5]).await,
        "edcab"
    );
}

#[tokio::test(start_paused = true)]
async fn a_priority_never_lets_a_new_arrival_take_a_slot_from_the_line() {
    let bulkhead = Bulkhead::new(
        Config::new(1, Duration::from_secs(30))
            .wait(Duration::from_secs(10))
            .queue_order(QueueOrder::PriorityFifo),
    );
    let held = bulkhead.try_acquire().unwrap();
    let parked = tokio::spawn({
        let bulkhead = bulkhead.clone();
        async move { bulkhead.acquire_with_priority(5).await.map(drop) }
    });
    tokio::task::yield_now().await;
    drop(held);
    // The slot went to the parked caller; an urgent newcomer does not get it.
    assert!(bulkhead.try_acquire().is_err());
    assert!(parked.await.unwrap().is_ok());
}
