//! Loom models of the keys' eviction: every interleaving of a caller taking
//! a key's slot and a new key looking for room, with a manual clock standing
//! past `reclaim_after` so that a key whose latest slot is not noted would
//! look reclaimable. Run with the crate's other models:
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
/// (not the map's lock), notes when, and lets the `Arc` go while it keeps
/// the slot. A new key looking for room meanwhile must see the key as
/// held: either the `Arc` is still out, or the note of the slot taken
/// (which the `Arc`'s drop publishes) says it is not reclaimable. The
/// model fails if the slot taken is not noted. (It cannot check the
/// `Acquire` fence beside the count: loom's `Arc::strong_count`
/// synchronizes by itself, where `std`'s is a relaxed load.)
#[test]
fn loom_a_slot_taken_by_a_waiting_caller_keeps_its_key() {
    loom::model(|| {
        let clock = ManualClock::new();
        let keys = Arc::new(Keys::<u32>::plain(per_key(&clock), 1, 1));
        // Past `reclaim_after` since the clock began: a key noted at tick 0
        // looks reclaimable.
        clock.advance(Duration::from_secs(1));
        let (bulkhead, line) = keys
            .find(&1, |entry| (entry.bulkhead.clone(), entry.line.clone()))
            .expect("room for the first key");
        let waiter = thread::spawn(move || {
            // As a caller granted the key's slot after waiting for it: the
            // grant made a permit, noted, and kept after the line's `Arc`
            // goes.
            let claim = bulkhead.try_claim().expect("the key's slot is free");
            let permit = bulkhead
                .grant(claim)
                .into_permit(0)
                .expect("the grant holds its slot");
            line.taken_at(permit.claimed_at());
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
            let claim = entry.claim().expect("one caller a key");
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
