//! A user's own ceiling, in memory: what the bulkhead does around any
//! [`Ceiling`], whatever store keeps it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
use tower_inflight::ceiling::{Ceiling, Lease, Refused};
use tower_inflight::{BoxError, Bulkhead, ConcurrencyLayer, Config, ServiceSaturated, ShedReason};

const LONG: Duration = Duration::from_secs(30);

/// At most `limit` leases at once across every bulkhead given a clone.
/// While full, a call with a deadline waits for a lease given back.
#[derive(Clone)]
struct InMemory(Arc<State>);

struct State {
    limit: usize,
    held: AtomicUsize,
    /// Asks in progress: an ask's future counts itself out when dropped.
    asking: AtomicUsize,
    freed: Notify,
    /// While set, the store is away: every call is refused.
    away: AtomicBool,
    /// While set, every lease says it has lapsed.
    lapse: AtomicBool,
}

struct Place(Arc<State>);

impl Lease for Place {
    fn lapsed(&self) -> bool {
        self.0.lapse.load(Ordering::SeqCst)
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.0.held.fetch_sub(1, Ordering::SeqCst);
        self.0.freed.notify_waiters();
    }
}

struct Asking<'a>(&'a State);

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        self.0.asking.fetch_sub(1, Ordering::SeqCst);
    }
}

impl InMemory {
    fn new(limit: usize) -> Self {
        Self(Arc::new(State {
            limit,
            held: AtomicUsize::new(0),
            asking: AtomicUsize::new(0),
            freed: Notify::new(),
            away: AtomicBool::new(false),
            lapse: AtomicBool::new(false),
        }))
    }

    fn held(&self) -> usize {
        self.0.held.load(Ordering::SeqCst)
    }

    fn asking(&self) -> usize {
        self.0.asking.load(Ordering::SeqCst)
    }

    fn take(&self) -> Result<Place, Refused> {
        let state = &self.0;
        if state.away.load(Ordering::SeqCst) {
            return Err(Refused::Unavailable);
        }
        state
            .held
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |held| {
                (held < state.limit).then_some(held + 1)
            })
            .map(|_| Place(state.clone()))
            .map_err(|_| Refused::Full)
    }
}

impl Ceiling for InMemory {
    type Lease = Place;

    async fn acquire(&self, deadline: Option<Instant>) -> Result<Place, Refused> {
        self.0.asking.fetch_add(1, Ordering::SeqCst);
        let _asking = Asking(&self.0);
        loop {
            let freed = self.0.freed.notified();
            let mut freed = std::pin::pin!(freed);
            freed.as_mut().enable();
            match (self.take(), deadline) {
                (Err(Refused::Full), Some(deadline)) => {
                    if tokio::time::timeout_at(deadline, freed).await.is_err() {
                        return Err(Refused::Full);
                    }
                }
                (answer, _) => return answer,
            }
        }
    }

    fn try_acquire(&self) -> Result<Place, Refused> {
        self.take()
    }
}

fn bulkhead(ceiling: &InMemory, limit: usize) -> Bulkhead {
    Bulkhead::new(Config::new(limit, LONG).ceiling(ceiling.clone()))
}

fn reason(shed: Result<impl Sized, ServiceSaturated>) -> ShedReason {
    match shed {
        Ok(_) => panic!("admitted"),
        Err(shed) => shed.reason(),
    }
}

#[tokio::test]
async fn it_caps_calls_across_two_bulkheads_sharing_it() {
    let ceiling = InMemory::new(3);
    let (a, b) = (bulkhead(&ceiling, 2), bulkhead(&ceiling, 2));
    let mut held = vec![a.acquire().await.unwrap(), a.acquire().await.unwrap()];
    held.push(b.acquire().await.unwrap());
    assert_eq!(reason(b.acquire().await), ShedReason::ClusterLimit);
    assert_eq!(reason(b.try_acquire()), ShedReason::ClusterLimit);
    assert_eq!(
        reason(a.acquire().await),
        ShedReason::LimitReached,
        "a full bulkhead sheds without asking"
    );
    assert_eq!((a.in_flight(), b.in_flight(), ceiling.held()), (2, 1, 3));

    drop(held.remove(0));
    held.push(b.acquire().await.unwrap());
    assert_eq!((a.in_flight(), b.in_flight(), ceiling.held()), (1, 2, 3));
    drop(held);
    assert_eq!((a.in_flight(), b.in_flight(), ceiling.held()), (0, 0, 0));
}

#[tokio::test]
async fn a_refusal_sheds_with_the_ceiling_reason_and_gives_the_local_slot_back() {
    let ceiling = InMemory::new(1);
    let other = bulkhead(&ceiling, 1);
    let _theirs = other.try_acquire().unwrap();
    let bulkhead = bulkhead(&ceiling, 1);

    assert_eq!(reason(bulkhead.acquire().await), ShedReason::ClusterLimit);
    assert_eq!(reason(bulkhead.try_acquire()), ShedReason::ClusterLimit);
    assert_eq!(
        reason(bulkhead.try_acquire_borrowed()),
        ShedReason::ClusterLimit
    );
    assert_eq!(bulkhead.in_flight(), 0, "the local slot went back");

    ceiling.0.away.store(true, Ordering::SeqCst);
    assert_eq!(
        reason(bulkhead.acquire().await),
        ShedReason::ClusterUnavailable
    );
    assert_eq!(
        reason(bulkhead.try_acquire()),
        ShedReason::ClusterUnavailable
    );
    assert_eq!(bulkhead.in_flight(), 0);

    let totals = bulkhead.status().totals;
    assert_eq!(
        (
            totals.rejected_cluster_limit,
            totals.rejected_cluster_unavailable,
            totals.admitted
        ),
        (3, 2, 0)
    );
}

#[tokio::test]
async fn a_dropped_permit_gives_the_lease_back() {
    let ceiling = InMemory::new(1);
    let bulkhead = Bulkhead::new(Config::new(2, LONG).max_bytes(100).ceiling(ceiling.clone()));

    let permit = bulkhead.acquire().await.unwrap();
    assert_eq!(ceiling.held(), 1);
    drop(permit);
    assert_eq!(ceiling.held(), 0);

    let permit = bulkhead.try_acquire().unwrap();
    assert_eq!(ceiling.held(), 1);
    drop(permit);
    assert_eq!(ceiling.held(), 0);
    let permit = bulkhead.try_acquire_bytes(10).unwrap();
    assert_eq!(ceiling.held(), 1);
    drop(permit);
    assert_eq!(ceiling.held(), 0);
    let borrowed = bulkhead.try_acquire_borrowed().unwrap();
    assert_eq!(ceiling.held(), 1);
    drop(borrowed);
    assert_eq!((ceiling.held(), bulkhead.in_flight()), (0, 0));

    // Refused for its bytes: the lease goes back with the slot.
    assert_eq!(
        reason(bulkhead.acquire_bytes(1_000).await),
        ShedReason::Bytes
    );
    assert_eq!(reason(bulkhead.try_acquire_bytes(1_000)), ShedReason::Bytes);
    assert_eq!((ceiling.held(), bulkhead.in_flight()), (0, 0));
}

#[test]
fn a_leaked_permit_s_lease_goes_back_with_its_slot() {
    let ceiling = InMemory::new(1_000);
    let clock = tower_inflight::ManualClock::new();
    let bulkhead = Bulkhead::new(
        Config::new(1, Duration::from_secs(1))
            .clock(clock.clone())
            .ceiling(ceiling.clone()),
    );
    // Each leaked permit's slot is reclaimed by the next claim; its lease
    // goes back with it, or the ceiling would fill with leases no one holds.
    for _ in 0..100 {
        std::mem::forget(bulkhead.try_acquire().unwrap());
        clock.advance(Duration::from_secs(2));
    }
    let permit = bulkhead.try_acquire().unwrap();
    assert_eq!(ceiling.held(), 1, "the leases of the leaked permits");
    drop(permit);
    assert_eq!(ceiling.held(), 0);

    // And a reset frees a leaked permit's lease with its slot.
    std::mem::forget(bulkhead.try_acquire().unwrap());
    assert_eq!(ceiling.held(), 1);
    bulkhead.reset();
    assert_eq!(ceiling.held(), 0);
    assert_eq!(bulkhead.in_flight(), 0);
}

#[test]
fn a_ceiling_whose_code_panics_leaves_the_slots_right() {
    /// Panics in `try_acquire` while `fail` is set; its lease panics when
    /// dropped.
    struct Panicking {
        fail: AtomicBool,
    }
    struct Bomb;
    impl Lease for Bomb {}
    impl Drop for Bomb {
        fn drop(&mut self) {
            panic!("the ceiling's lease panics");
        }
    }
    impl Ceiling for Panicking {
        type Lease = Bomb;
        async fn acquire(&self, _: Option<Instant>) -> Result<Bomb, Refused> {
            Ok(Bomb)
        }
        fn try_acquire(&self) -> Result<Bomb, Refused> {
            if self.fail.load(Ordering::SeqCst) {
                panic!("the ceiling's try_acquire panics");
            }
            Ok(Bomb)
        }
    }
    let ceiling = Arc::new(Panicking {
        fail: AtomicBool::new(true),
    });
    let bulkhead = Bulkhead::new(Config::new(1, LONG).ceiling(ceiling.clone()));
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        bulkhead.try_acquire().map(drop)
    }));
    assert!(panicked.is_err());
    assert_eq!(bulkhead.in_flight(), 0, "the slot came back");

    ceiling.fail.store(false, Ordering::SeqCst);
    let permit = bulkhead.try_acquire().unwrap();
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(permit)));
    assert!(panicked.is_err());
    assert_eq!(bulkhead.in_flight(), 0, "the slot came back");
}

#[tokio::test(start_paused = true)]
async fn a_caller_with_a_wait_budget_asks_until_it_runs_out() {
    let ceiling = InMemory::new(1);
    let bulkhead = Bulkhead::new(
        Config::new(2, LONG)
            .wait(Duration::from_millis(100))
            .ceiling(ceiling.clone()),
    );
    let held = bulkhead.acquire().await.unwrap();

    let started = Instant::now();
    assert_eq!(reason(bulkhead.acquire().await), ShedReason::ClusterLimit);
    assert_eq!(started.elapsed(), Duration::from_millis(100));
    assert_eq!(bulkhead.in_flight(), 1, "its local slot went back");

    let waiter = tokio::spawn({
        let bulkhead = bulkhead.clone();
        async move { bulkhead.acquire().await.map(drop) }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(bulkhead.in_flight(), 2, "it holds its local slot meanwhile");
    drop(held);
    waiter.await.unwrap().unwrap();
    assert_eq!((ceiling.held(), bulkhead.in_flight()), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn close_and_cancel_turn_away_a_caller_asking() {
    for close in [true, false] {
        let ceiling = InMemory::new(1);
        let bulkhead = Bulkhead::new(
            Config::new(2, LONG)
                .wait(Duration::from_secs(10))
                .ceiling(ceiling.clone()),
        );
        let _held = bulkhead.acquire().await.unwrap();
        let asking = tokio::spawn({
            let bulkhead = bulkhead.clone();
            async move { reason(bulkhead.acquire().await) }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(ceiling.asking(), 1);

        if close {
            bulkhead.close();
        } else {
            bulkhead.cancel_waiting();
        }
        let expected = if close {
            ShedReason::Closed
        } else {
            ShedReason::Cancelled
        };
        assert_eq!(asking.await.unwrap(), expected);
        assert_eq!(ceiling.asking(), 0, "its ask was dropped");
        assert_eq!((ceiling.held(), bulkhead.in_flight()), (1, 1));
    }
}

#[tokio::test]
async fn a_layer_takes_the_lease_in_poll_ready_and_sheds_on_a_lapsed_one() {
    let ceiling = InMemory::new(1);
    let layer = ConcurrencyLayer::new(Config::new(2, LONG).ceiling(ceiling.clone()));
    let bulkhead = layer.bulkhead();
    let mut service = ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(|n: u32| async move { Ok::<_, BoxError>(n) }));

    service.ready().await.unwrap();
    assert_eq!((ceiling.held(), bulkhead.in_flight()), (1, 1));
    assert_eq!(service.call(7).await.unwrap(), 7);
    assert_eq!((ceiling.held(), bulkhead.in_flight()), (0, 0));

    // Kept ready past its lease: the call is shed and both go back.
    service.ready().await.unwrap();
    ceiling.0.lapse.store(true, Ordering::SeqCst);
    let shed = service.call(8).await.unwrap_err();
    let shed = shed.downcast_ref::<ServiceSaturated>().unwrap();
    assert_eq!(shed.reason(), ShedReason::ClusterLimit);
    assert_eq!((ceiling.held(), bulkhead.in_flight()), (0, 0));
}

/// A lease is kept beside its claim, not in the permit.
#[cfg(target_pointer_width = "64")]
#[test]
fn a_permit_is_no_larger_for_a_ceiling() {
    assert_eq!(std::mem::size_of::<tower_inflight::Permit>(), 40);
}
