//! Loom models of the tower services' readiness: a slot handed to a
//! service while it waited in `poll_ready` is held in its readiness until
//! `call`, and goes on to the line if the service is dropped first. Run
//! with the crate's other models:
//!
//! ```text
//! RUSTFLAGS="--cfg tower_inflight_loom" LOOM_MAX_PREEMPTIONS=3 cargo test --release --lib loom
//! ```

use super::Readiness;
use crate::bulkhead::{Bulkhead, Granted, ManualClock, Shared};
use crate::sync::Ordering;
use crate::wait::{Arrival, Left};
use crate::{Config, Ticket};
use loom::thread;
use std::time::Duration;

/// A bulkhead of one slot with a wait budget, the slot handed to a service
/// that waited for it in `poll_ready` (parked while another held it, and
/// granted it as that one let it go): its readiness holds it, made ready.
fn ready_service_holding_the_slot() -> (Bulkhead, Readiness) {
    let bulkhead = Bulkhead::new(
        Config::new(1, Duration::from_secs(10))
            .wait(Duration::from_secs(1))
            .clock(ManualClock::new()),
    );
    let shared = bulkhead.shared().clone();
    let held = shared
        .slots()
        .try_claim(1, Ordering::Relaxed)
        .expect("the only slot is free");
    let Arrival::Parked(node) = arrive(&shared) else {
        panic!("the only slot is held: the service waits");
    };
    shared.release_permit(&held);
    // As the waiting service's `Acquire` takes the slot handed to it.
    let Left::Granted(claim) = shared
        .waiters()
        .leave(&node, shared.slots(), shared.clock(), false)
    else {
        panic!("the slot let go is handed to the service waiting");
    };
    (bulkhead, Readiness::Admitted(Granted::new(shared, claim)))
}

/// A caller of `shared` comes to the line, as a waiting caller does.
fn arrive(shared: &Shared) -> Arrival {
    shared.waiters().arrive(
        shared.slots(),
        shared.clock(),
        None,
        &shared.config().queue_order,
        Ticket::new(),
        None,
    )
}

/// A service made ready with a slot is dropped before its call, while
/// another caller comes to the line: the caller is admitted, or parks and
/// is handed the slot; never parked beside it. The model fails if a slot
/// given back unused does not go on to the line.
#[test]
fn loom_a_ready_service_dropped_before_its_call_hands_its_slot_on() {
    loom::model(|| {
        let (bulkhead, readiness) = ready_service_holding_the_slot();
        let dropped = thread::spawn(move || drop(readiness));
        let shared = bulkhead.shared();
        let arrival = arrive(shared);
        dropped.join().unwrap();
        let got_the_slot = match &arrival {
            Arrival::Admitted(_) => true,
            Arrival::Parked(node) => node.is_granted(),
            Arrival::QueueFull | Arrival::Closed => false,
        };
        assert!(got_the_slot, "the caller parked beside the slot given back");
        assert_eq!(shared.slots().in_flight(), 1);
    });
}

/// A ready service calls with the slot it was handed while another caller
/// comes to the line: the call is admitted on that slot (never shed, never
/// a second slot), and the other caller parks.
#[test]
fn loom_a_ready_service_calls_on_the_slot_it_was_handed() {
    loom::model(|| {
        let (bulkhead, mut readiness) = ready_service_holding_the_slot();
        let caller = {
            let bulkhead = bulkhead.clone();
            thread::spawn(move || readiness.call(&bulkhead, 0, Ok, Err))
        };
        let shared = bulkhead.shared();
        let arrival = arrive(shared);
        let permit = caller
            .join()
            .unwrap()
            .expect("the call is admitted on the slot it was handed");
        assert!(
            matches!(&arrival, Arrival::Parked(node) if !node.is_granted()),
            "the other caller got a slot while the call held the only one"
        );
        assert_eq!(shared.slots().in_flight(), 1);
        drop(permit);
        let Arrival::Parked(node) = &arrival else {
            unreachable!()
        };
        assert!(node.is_granted(), "the slot did not go on after the call");
    });
}
