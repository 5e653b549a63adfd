//! Helpers shared by the integration tests.

// Each test crate uses its own part of this module.
#![allow(dead_code)]

pub(crate) mod turns;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// xorshift64*: a tiny deterministic generator, one per task.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

/// Counts the inner service's concurrent calls and the most it ever saw.
#[derive(Clone, Default)]
pub(crate) struct Meter {
    pub(crate) current: Arc<AtomicUsize>,
    pub(crate) peak: Arc<AtomicUsize>,
    pub(crate) completed: Arc<AtomicUsize>,
}

/// One call inside the inner service, counted out when dropped.
pub(crate) struct Inside(Meter);

impl Meter {
    pub(crate) fn enter(&self) -> Inside {
        let now = self.current.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        Inside(self.clone())
    }

    pub(crate) fn peak(&self) -> usize {
        self.peak.load(Ordering::SeqCst)
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        self.0.current.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Waits (up to a generous bound) until `condition` holds.
pub(crate) async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    for _ in 0..500 {
        if condition() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never happened: {what}");
}

/// Waits until every slot and byte of `bulkhead` is back, and nobody waits.
pub(crate) async fn assert_all_returned(bulkhead: &tower_inflight::Bulkhead) {
    eventually("slots and bytes return to zero", || {
        bulkhead.in_flight() == 0 && bulkhead.bytes_reserved() == 0
    })
    .await;
    assert_eq!(bulkhead.waiting(), 0);
}

/// Handlers wait at the gate until the test lets them through.
#[derive(Clone)]
pub(crate) struct Gate(Arc<tokio::sync::Semaphore>);

impl Gate {
    pub(crate) fn new() -> Self {
        Gate(Arc::new(tokio::sync::Semaphore::new(0)))
    }

    pub(crate) async fn pass(&self) {
        self.0.acquire().await.expect("gate open").forget();
    }

    pub(crate) fn open(&self, n: usize) {
        self.0.add_permits(n);
    }
}

/// Spawns a caller that waits for the slots `ticket` asks for (up to the
/// bulkhead's `wait` budget) and lets them go at once.
pub(crate) fn spawn_acquire(
    bulkhead: &tower_inflight::Bulkhead,
    ticket: tower_inflight::Ticket,
) -> tokio::task::JoinHandle<Result<(), tower_inflight::ServiceSaturated>> {
    let bulkhead = bulkhead.clone();
    tokio::spawn(async move { bulkhead.acquire_with(ticket).await.map(drop) })
}

#[cfg(feature = "redis")]
pub(crate) mod redis_server;

#[cfg(feature = "redis")]
pub(crate) mod redis_topology;
