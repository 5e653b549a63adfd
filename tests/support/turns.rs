//! Helpers for the tests of keyed bulkheads: the order in which callers of
//! several keys are served at the ceiling.

use std::time::Duration;
use tower_inflight::keyed::KeyedBulkhead;

/// Records the keys in the order their callers got the ceiling's slot.
pub(crate) async fn order_served(
    keyed: &KeyedBulkhead<&'static str>,
    callers: &[&'static str],
    free: impl FnOnce(),
) -> Vec<&'static str> {
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for &key in callers {
        let (keyed, order) = (keyed.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let permit = keyed.acquire(&key).await.unwrap();
            order.lock().unwrap().push(key);
            tokio::time::sleep(Duration::from_millis(1)).await;
            drop(permit);
        }));
        tokio::task::yield_now().await;
    }
    free();
    for task in tasks {
        task.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    order
}

/// Serves `rounds` callers at a ceiling of 4 (each key's limit is 4 too),
/// each key sending a new caller whenever one of its own is served, and
/// each call holding its slots until 3 more have been served; says whose
/// each was.
pub(crate) async fn served_in_turns(
    keyed: &KeyedBulkhead<&'static str>,
    backlogs: &[(&'static str, usize)],
    rounds: usize,
) -> Vec<&'static str> {
    let held: Vec<_> = (0..4)
        .map(|_| keyed.try_acquire(&"holder").unwrap())
        .collect();
    let (served, mut order) = tokio::sync::mpsc::unbounded_channel();
    let caller = |key: &'static str| {
        let (keyed, served) = (keyed.clone(), served.clone());
        tokio::spawn(async move {
            let permit = keyed.acquire(&key).await.unwrap();
            served.send((key, permit)).unwrap();
        })
    };
    for &(key, backlog) in backlogs {
        for _ in 0..backlog {
            caller(key);
            tokio::task::yield_now().await;
        }
    }
    drop(held);
    let mut holding = std::collections::VecDeque::new();
    let mut keys = Vec::new();
    for _ in 0..rounds {
        let (key, permit) = order.recv().await.unwrap();
        keys.push(key);
        holding.push_back(permit);
        // The key sends another caller, then the oldest call ends.
        caller(key);
        tokio::task::yield_now().await;
        if holding.len() == 4 {
            holding.pop_front();
        }
    }
    keys
}
