//! Loom models of the keys' eviction: every interleaving of a caller taking
//! a key's slot and a new key looking for room, with a manual clock standing
//! past `reclaim_after` so that a key whose slots were dated at its start
//! would look reclaimable. Run with the crate's other models:
//!
//! ```text
//! RUSTFLAGS="--cfg tower_inflight_loom" LOOM_MAX_PREEMPTIONS=3 cargo test --release --lib loom
//! ```

use super::keys::Keys;
use super::{KeyedBulkhead, KeyedConfig};
use crate::bulkhead::ManualClock;
use crate::sync::Arc;
use crate::{Config, ShedReason};
use loom::thread;
use std::time::Duration;

const RECLAIM_AFTER: Duration = Duration::from_millis(10);

/// A key's configuration on `clock`, one slot a key.
fn per_key(clock: &ManualClock) -> Config {
    Config::new(1, RECLAIM_AFTER).clock(clock.clone())
}

/// A caller that waits takes its key's slot holding only the line's `Arc`
/// (not the map's lock), and lets the `Arc` go while it keeps the slot. A
/// new key looking for room meanwhile must see the key as held: either the
/// `Arc` is still out, or its permit shares the key's bulkhead with a slot
/// not past its deadline (which the `Arc`'s drop publishes). The model
/// fails if a key whose permit holds a slot not past its deadline is taken
/// as idle. (It cannot
/// check the `Acquire` fence beside the count: loom's `Arc::strong_count`
/// synchronizes by itself, where `std`'s is a relaxed load.)
#[test]
fn loom_a_slot_taken_by_a_waiting_caller_keeps_its_key() {
    loom::model(|| {
        let clock = ManualClock::new();
        let keys = Arc::new(Keys::<u32>::plain(per_key(&clock), 1, 1));
        // Past `reclaim_after` since the clock began: a slot dated at tick 0
        // would look reclaimable.
        clock.advance(Duration::from_secs(1));
        let (bulkhead, line) = keys
            .find(&1, |entry| (entry.bulkhead.clone(), entry.line.clone()))
            .expect("room for the first key");
        let waiter = thread::spawn(move || {
            // As a caller granted the key's slot after waiting for it: the
            // grant made a permit, kept after the line's `Arc` goes.
            let claim = bulkhead.try_claim().expect("the key's slot is free");
            let permit = bulkhead
                .grant(claim)
                .into_permit(0)
                .expect("the grant holds its slot");
            drop((line, bulkhead));
            permit
        });
        let newcomer = {
            let keys = keys.clone();
            thread::spawn(move || keys.find(&2, |_| ()).is_some())
        };
        let permit = waiter.join().unwrap();
        assert!(
            !newcomer.join().unwrap(),
            "a new key evicted a key whose slot is held"
        );
        assert_eq!(keys.len(), 1);
        drop(permit);
    });
}

/// Two first calls of two keys under `max_keys` 1, each keeping its permit:
/// exactly one is admitted (never two keys held past the cap, and never both
/// shed while one could have had room), and the other is shed for too many
/// keys. The model fails if a key being made outside the map's lock holds
/// no place.
#[test]
fn loom_two_new_keys_under_a_cap_of_one_admit_exactly_one() {
    loom::model(|| {
        let clock = ManualClock::new();
        let keyed = KeyedBulkhead::<u32>::new(KeyedConfig::new(per_key(&clock)).max_keys(1));
        let calls: Vec<_> = [1, 2]
            .into_iter()
            .map(|key| {
                let keyed = keyed.clone();
                thread::spawn(move || keyed.try_acquire(&key))
            })
            .collect();
        let outcomes: Vec<_> = calls.into_iter().map(|call| call.join().unwrap()).collect();
        let admitted = outcomes.iter().filter(|outcome| outcome.is_ok()).count();
        assert_eq!(admitted, 1, "{outcomes:?}");
        for outcome in &outcomes {
            if let Err(shed) = outcome {
                assert_eq!(shed.reason(), ShedReason::TooManyKeys);
            }
        }
        assert_eq!(keyed.keys(), 1);
    });
}

/// A caller of `key` on a thread of its own, taking its slot (making the
/// key if it is new) and keeping the permit; `None` if it found no room.
fn hold(keys: &Arc<Keys<u32>>, key: u32) -> thread::JoinHandle<Option<crate::bulkhead::Permit>> {
    let keys = keys.clone();
    thread::spawn(move || {
        keys.find(&key, |entry| {
            let claim = entry.bulkhead.try_claim().expect("one caller a key");
            entry.bulkhead.clone().admit(claim)
        })
    })
}

/// A new key of one shard, with no room in its own, and a caller of an
/// idle key of another shard, under `max_keys` 1: either the caller takes
/// its key's slot first, and the new key finds nothing to evict, or the new
/// key evicts the idle one, and the caller's key, made again, finds no
/// room. Exactly one is admitted, and the places taken match the keys held.
/// The model fails if a place taken in another shard is lost or counted
/// twice, or if a key is evicted under a caller taking its slot.
#[test]
fn loom_a_new_key_and_a_caller_of_an_idle_key_of_another_shard_admit_exactly_one() {
    use crate::keyed::shards::shard_of;
    loom::model(|| {
        let clock = ManualClock::new();
        let keys = Arc::new(Keys::<u32>::plain(per_key(&clock), 1, 2));
        let of_shard = |at| (0..).find(|key| shard_of(key, 2) == at).unwrap();
        let (idle, newcomer) = (of_shard(0), of_shard(1));
        assert!(keys.find(&idle, |_| ()).is_some(), "room for the first key");
        let calls = [hold(&keys, newcomer), hold(&keys, idle)];
        let permits: Vec<_> = calls.into_iter().map(|call| call.join().unwrap()).collect();
        assert_eq!(
            permits.iter().filter(|permit| permit.is_some()).count(),
            1,
            "not exactly one admitted"
        );
        assert_eq!(keys.len(), 1);
        assert_eq!(keys.places(), 1);
    });
}

/// Two new keys under `max_keys` 2, both keys held idle: racing searches
/// may pick the same idle key, and the one that loses it to the other's
/// eviction looks again, so both new keys are admitted. The model fails if
/// a search gives up when its key is taken from under it, or if it is cut
/// short by a count of keys that lags the shards.
#[test]
fn loom_two_new_keys_racing_for_two_idle_keys_are_both_admitted() {
    loom::model(|| {
        let clock = ManualClock::new();
        let keys = Arc::new(Keys::<u32>::plain(per_key(&clock), 2, 1));
        for key in [1, 2] {
            assert!(keys.find(&key, |_| ()).is_some(), "room for a first key");
        }
        let calls = [hold(&keys, 3), hold(&keys, 4)];
        let permits: Vec<_> = calls.into_iter().map(|call| call.join().unwrap()).collect();
        assert!(
            permits.iter().all(Option::is_some),
            "a new key shed with an idle key left"
        );
        assert_eq!((keys.len(), keys.places()), (2, 2));
    });
}

/// Turns across keys at a full ceiling of one slot. Key B's caller waits
/// at tag 64 (a call of B was served before); key A's first caller waits
/// at tag 0, its second at 64, after B's. A's first gives up, as a caller
/// of a key leaves the ceiling's line: its turn first (A's second is moved
/// into its place), then its place in the line (a slot handed to it
/// meanwhile goes on). The ceiling's slot is released meanwhile. Whichever
/// goes first, the slot ends with A's second, whose key kept tag 0: never
/// lost, never with B's caller. The model fails if a caller leaves the
/// line before its turn (a slot handed to it then goes on to B, ahead of
/// the place A keeps), or if a slot handed to a caller who gives up is not
/// passed on.
#[test]
fn loom_a_turn_given_up_racing_a_release_hands_the_slot_to_its_key_s_next() {
    use super::turns::{KeyTurn, Turn, Turns};
    use crate::bulkhead::Bulkhead;
    use crate::wait::{Arrival, Left, Node};
    use crate::{QueueOrder, Ticket};

    loom::model(|| {
        let clock = ManualClock::new();
        let ceiling = Arc::new(Bulkhead::new(
            Config::new(1, RECLAIM_AFTER)
                .clock(clock)
                .queue_order(QueueOrder::PriorityFifo),
        ));
        let shared = ceiling.shared();
        let held = shared
            .slots()
            .try_claim(1, crate::sync::Ordering::Relaxed)
            .expect("the ceiling's slot is free");
        let turns = Arc::new(Turns::default());
        let (a, b) = (Arc::new(KeyTurn::default()), Arc::new(KeyTurn::default()));
        // A call of B served: B's next caller is at tag 64.
        let served = turns.enter(&b, 1, false);
        turns.leave(&b, &served, true, &ceiling);
        let park = |key: &KeyTurn| -> (Turn, Arc<Node>) {
            let turn = turns.enter(key, 1, false);
            let ticket = Ticket::new()
                .priority(turn.priority())
                .place_in_line(turn.place);
            let movable = turn.movable();
            let Arrival::Parked(node) = shared.waiters().arrive(
                shared.slots(),
                shared.clock(),
                None,
                &shared.config().queue_order,
                ticket,
                movable.as_deref(),
            ) else {
                panic!("the ceiling's only slot is held: the caller parks");
            };
            (turn, node)
        };
        let (a_first_turn, a_first) = park(&a);
        let (_b_turn, b_caller) = park(&b);
        let (_a_second_turn, a_second) = park(&a);
        let leaver = {
            let (ceiling, turns, a) = (ceiling.clone(), turns.clone(), a.clone());
            thread::spawn(move || {
                // As `InCeilingLine` drops: the turn, then the place.
                turns.leave(&a, &a_first_turn, false, &ceiling);
                let shared = ceiling.shared();
                let left = shared
                    .waiters()
                    .leave(&a_first, shared.slots(), shared.clock(), false);
                if let Left::Granted(claim) = left {
                    shared.give_back_unused(&claim);
                }
            })
        };
        shared.release_permit(&held);
        leaver.join().unwrap();
        assert!(
            a_second.is_granted(),
            "the slot did not go to the caller that took A's place"
        );
        assert!(!b_caller.is_granted(), "B's caller went ahead of A's turn");
        assert_eq!(shared.slots().in_flight(), 1);
    });
}
