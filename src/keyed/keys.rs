//! The keys a keyed bulkhead holds: a bulkhead per key, made on a key's
//! first call, and evicted once nothing holds it, so that no stream of
//! distinct keys makes memory grow past `max_keys`.
//!
//! The keys are spread over shards (see `shards`), each behind its own lock;
//! `max_keys` bounds them all together. A shard keeps its keys in a `Vec`
//! of slots, and a `HashMap` from each key's hash (computed once, as a call
//! comes in) to the first slot of that hash, the slots of one hash chained:
//! the map never runs a key's own `Hash`, and the eviction sweep walks the
//! slots in place, going on from where the last search stopped.
//!
//! A key's `Hash`, `Eq`, `Clone` or `Drop` that panics is its owner's bug,
//! held to the standard of `std`'s `HashMap`: that key may be lost, but no
//! other key, no place among the `max_keys` and no slot.

use crate::bulkhead::Clock;
use crate::keyed::key::{Entry, KeyMaker};
use crate::keyed::shards::{shard_of, ShardHasher};
use crate::keyed::KeyStatus;
use crate::sync::{read, write, AtomicU64, AtomicUsize, Ordering, RwLock};
use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hash};
use std::time::Duration;

/// How many keys one search for room may look at to find one to evict, so
/// that a flood of new keys while every key is busy costs a bounded amount
/// each. No key twice: a search looks at no more keys than are held.
const SWEEP: usize = 128;

/// How many keys a search for room looks at, at most, within
/// `SHORT_SEARCHES_FOR` of a search that looked at `SWEEP` keys or more and
/// found none: under a flood of new keys while every key is busy, a refusal
/// costs a sixteenth of a full search. Each search goes on from where the
/// last one stopped, so the short searches still go round every key: one
/// that goes idle is found by a later one.
const SHORT_SEARCH: usize = 8;

/// How long after a full search that found no room the searches are short.
const SHORT_SEARCHES_FOR: Duration = Duration::from_millis(1);

/// The end of a chain of slots of one hash.
const NONE: usize = usize::MAX;

/// A key in its shard.
struct Slot<K> {
    hash: u64,
    key: K,
    entry: Entry,
    /// The next slot of the same hash (`NONE`: this is the last).
    next: usize,
}

/// One shard's keys, behind the shard's lock. Aligned to two cache lines,
/// so that a shard's lock word, which every call writes (a reader too),
/// is on lines of its own, apart from the map every call reads and from
/// the other shards'.
#[repr(align(128))]
struct Map<K> {
    /// The first slot of each hash. Its keys are hashes already, hashed
    /// again by the cheap shard hasher: the map runs no key's own code.
    first: HashMap<u64, usize, BuildHasherDefault<ShardHasher>>,
    slots: Vec<Slot<K>>,
    /// The hashes of the keys being made outside the lock, each holding a
    /// place (counted in `Keys::places`). A second caller of a key being
    /// made takes no place, and the first caller back with the key takes the
    /// maker's; two keys of one hash made at once share one, and the later
    /// back looks for room again.
    making: Vec<u64>,
}

impl<K: Eq> Map<K> {
    fn find(&self, hash: u64, key: &K) -> Option<&Entry> {
        let mut at = *self.first.get(&hash)?;
        while self.slots[at].key != *key {
            at = self.slots[at].next;
            if at == NONE {
                return None;
            }
        }
        Some(&self.slots[at].entry)
    }
}

impl<K> Map<K> {
    fn push(&mut self, hash: u64, key: K, entry: Entry) {
        let next = self.first.insert(hash, self.slots.len()).unwrap_or(NONE);
        self.slots.push(Slot {
            hash,
            key,
            entry,
            next,
        });
    }

    /// Takes out the slot at `at`; the last slot moves into its place.
    fn remove(&mut self, at: usize) -> Slot<K> {
        let (hash, next) = (self.slots[at].hash, self.slots[at].next);
        self.relink(hash, at, next);
        let last = self.slots.len() - 1;
        if last != at {
            self.relink(self.slots[last].hash, last, at);
        }
        let slot = self.slots.swap_remove(at);
        // Keys moving from shard to shard leave no room behind in each
        // (without it, `max_keys` keys could keep the room of `max_keys` in
        // every shard). The map's rehash runs no key's code.
        if let Some(room) = room_to_keep(self.slots.capacity(), self.slots.len()) {
            self.slots.shrink_to(room);
            self.first.shrink_to(room);
        }
        slot
    }

    /// Points the link to slot `from`, in the chain of `hash`, at `to`.
    fn relink(&mut self, hash: u64, from: usize, to: usize) {
        let Map { first, slots, .. } = self;
        let head = first.get_mut(&hash).expect("a slot is in its hash's chain");
        if *head != from {
            let mut at = *head;
            while slots[at].next != from {
                at = slots[at].next;
            }
            slots[at].next = to;
        } else if to == NONE {
            first.remove(&hash);
        } else {
            *head = to;
        }
    }

    /// Takes the place held for a key of `hash` being made, if there is one.
    fn take_making(&mut self, hash: u64) -> bool {
        let Some(at) = self.making.iter().position(|&made| made == hash) else {
            return false;
        };
        self.making.swap_remove(at);
        // Many keys made at once (callers in a slow limit function) leave no
        // room behind.
        if let Some(room) = room_to_keep(self.making.capacity(), self.making.len()) {
            self.making.shrink_to(room);
        }
        true
    }
}

pub(crate) struct Keys<K> {
    /// A power of two of them.
    shards: Box<[RwLock<Map<K>>]>,
    /// Hashes every key once, as it comes in.
    hasher: RandomState,
    /// The keys held and being made, in every shard: never past `max_keys`.
    places: AtomicUsize,
    /// The keys held, in every shard: counted as each goes in and out of its
    /// shard.
    held: AtomicUsize,
    max_keys: usize,
    evicted: AtomicU64,
    /// How each key's bulkhead and line are made.
    make: KeyMaker<K>,
    /// The keys' manual clock (in tests), or a precise one, for the while
    /// the searches are short.
    clock: Clock,
    sweep: Sweep,
}

/// What the searches for room write, on a cache line of its own: a flood of
/// new keys writes here, and not on the line of the fields every call reads
/// (the shards, the hasher).
#[repr(align(128))]
#[derive(Default)]
struct Sweep {
    /// Where the next search looks first: a shard (the high 32 bits) and a
    /// slot of it.
    at: AtomicU64,
    /// Until when the searches are short, on `Keys::clock` (0: never).
    short_until: AtomicU64,
    /// New keys refused.
    refused: AtomicU64,
}

impl<K: Hash + Eq + Clone> Keys<K> {
    /// Keys made by `make`, at most `max_keys` of them, spread over `shards`
    /// shards, a power of two (see
    /// [`shard_count`](crate::keyed::shards::shard_count)).
    pub(crate) fn new(make: KeyMaker<K>, max_keys: usize, shards: usize) -> Self {
        // Not the coarse system clock: it moves once a scheduler tick (up to
        // 10 ms), longer than the while it would time. Read only as a search
        // for room begins or finds none.
        let clock = make
            .manual_clock()
            .map_or_else(Clock::precise, Clock::Manual);
        Self {
            shards: (0..shards)
                .map(|_| {
                    RwLock::new(Map {
                        first: HashMap::default(),
                        slots: Vec::new(),
                        making: Vec::new(),
                    })
                })
                .collect(),
            hasher: RandomState::new(),
            places: AtomicUsize::new(0),
            held: AtomicUsize::new(0),
            max_keys,
            evicted: AtomicU64::new(0),
            make,
            clock,
            sweep: Sweep::default(),
        }
    }

    /// The shard of `key`, and its hash.
    #[inline(always)]
    fn locate(&self, key: &K) -> (&RwLock<Map<K>>, u64) {
        let shard = &self.shards[shard_of(key, self.shards.len())];
        (shard, self.hasher.hash_one(key))
    }

    /// `found` of `key`'s entry, made if it is new; `None` if it is new
    /// and `max_keys` keys are held, none of them idle.
    ///
    /// `found` runs under the shard's lock: the sweep, under the write lock,
    /// never sees a caller between finding the key and taking its slot (or
    /// the `Arc` of its line, for a caller that waits).
    // `always`: what `found` returns (a permit) must reach the caller in
    // registers; returned through memory, a call cost about 10 ns more
    // (benches/keyed.rs).
    #[inline(always)]
    pub(crate) fn find<R>(&self, key: &K, found: impl FnOnce(&Entry) -> R) -> Option<R> {
        let (shard, hash) = self.locate(key);
        {
            let map = read(shard);
            if let Some(entry) = map.find(hash, key) {
                entry.mark_used();
                return Some(found(entry));
            }
        }
        self.insert(shard, hash, key, found)
    }

    /// `found` of `key`'s entry if it is held; nothing is made.
    pub(crate) fn get<R>(&self, key: &K, found: impl FnOnce(&Entry) -> R) -> Option<R> {
        let (shard, hash) = self.locate(key);
        read(shard).find(hash, key).map(found)
    }

    /// Whether `key` is held, or a new key would find room (nothing is
    /// evicted): for a call refused anyway, by a full ceiling. Counted as
    /// refused if not.
    pub(crate) fn holds_or_has_room(&self, key: &K) -> bool {
        // Relaxed: a count, which publishes nothing.
        let room = self.get(key, |_| ()).is_some()
            || self.places.load(Ordering::Relaxed) < self.max_keys
            || self.idle_key().is_some();
        if !room {
            self.sweep.refused.fetch_add(1, Ordering::Relaxed);
        }
        room
    }

    #[cold]
    fn insert<R>(
        &self,
        shard: &RwLock<Map<K>>,
        hash: u64,
        key: &K,
        found: impl FnOnce(&Entry) -> R,
    ) -> Option<R> {
        loop {
            // Room first, allocating nothing for a key refused, and under no
            // write lock: under a flood of new keys while every key is busy,
            // calls of other keys go on. A key being made holds a place: a
            // second caller takes none.
            let being_made = read(shard).making.contains(&hash);
            let place = if being_made { None } else { Some(self.room()?) };
            let maker = {
                let mut map = write(shard);
                if let Some(entry) = map.find(hash, key) {
                    return Some(found(entry)); // made meanwhile
                }
                match place {
                    Some(place) if !map.making.contains(&hash) => {
                        map.making.push(hash);
                        place.keep();
                        Some(Maker {
                            keys: self,
                            shard,
                            hash,
                        })
                    }
                    _ => None,
                }
            };
            // Made outside the lock: a key with a large limit takes a while
            // to build, and the limit functions may look at this keyed
            // bulkhead. If they panic, the maker gives its place back.
            let (entry, copy) = (self.make.entry(key), key.clone());
            let mut map = write(shard);
            let made_meanwhile = map.find(hash, key);
            // Back under the lock: the maker's place is settled here.
            std::mem::forget(maker);
            if let Some(entry) = made_meanwhile {
                // Made on the place held for its hash: ours goes.
                return Some(found(entry));
            }
            // The place held for the key, whoever holds it (a second caller
            // takes the place of a maker not back yet, which then finds the
            // key made); if another caller took it for another key of the
            // same hash, or took it and the key was evicted since, this one
            // looks for room again.
            if !map.take_making(hash) {
                continue;
            }
            let place = Place { keys: self };
            let found = found(&entry);
            map.push(hash, copy, entry);
            // Relaxed: a count; the key itself is published by the lock.
            self.held.fetch_add(1, Ordering::Relaxed);
            place.keep();
            return Some(found);
        }
    }

    /// A place for a new key: one of the `max_keys` free, or the place of an
    /// idle key, evicted. `None`, counted as refused, if there is neither.
    fn room(&self) -> Option<Place<'_, K>> {
        // A search whose key was evicted by a racing search, or taken up
        // by a caller, meanwhile looks again from where the searches
        // stopped: each such loss is another caller's progress. (The racing
        // search's key may have gone for good, freeing a place.)
        loop {
            // One of the `max_keys` places, if one is free. Relaxed: a count,
            // which publishes nothing; what a place guards is under a
            // shard's lock.
            let free = |places| (places < self.max_keys).then_some(places + 1);
            let taken = self
                .places
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, free);
            if taken.is_ok() {
                return Some(Place { keys: self });
            }
            let Some((at, slot, hash)) = self.idle_key() else {
                break;
            };
            let mut map = write(&self.shards[at]);
            // Still there, and idle now that nobody can find it: a caller
            // that found it under the read lock has taken its slot, or its
            // line's `Arc`.
            let still_idle = |slot: &Slot<K>| slot.hash == hash && slot.entry.is_idle();
            if map.slots.get(slot).is_some_and(still_idle) {
                let slot = map.remove(slot);
                drop(map);
                // Relaxed: counts.
                self.held.fetch_sub(1, Ordering::Relaxed);
                self.evicted.fetch_add(1, Ordering::Relaxed);
                // The place is this caller's, given back if the teardown
                // panics (a key's `Drop`, a metrics hook). Slots still held
                // are past their deadlines (leaked): forgotten, so that a
                // key that reports metrics shows none in flight.
                let place = Place { keys: self };
                if slot.entry.bulkhead.in_flight() > 0 {
                    slot.entry.bulkhead.reset();
                }
                drop(slot);
                return Some(place);
            }
        }
        // Relaxed: a count.
        self.sweep.refused.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// An idle key to evict, as its shard, slot and hash: the first found
    /// not used since a sweep last found it idle, or else the first found
    /// idle. Looked for under the shards' read locks, so that calls of other
    /// keys go on meanwhile, from where the last search stopped: no more than
    /// `SWEEP` keys, nor `SHORT_SEARCH` while the searches are short, and
    /// no key twice.
    fn idle_key(&self) -> Option<(usize, usize, u64)> {
        // Relaxed: a hint to the cost of a search, which publishes nothing.
        let short_until = self.sweep.short_until.load(Ordering::Relaxed);
        let full = short_until == 0 || self.clock.now() >= short_until;
        // Not bounded by the keys held: counted apart from the shards, the
        // count may lag them.
        let most = if full { SWEEP } else { SHORT_SEARCH };
        let count = self.shards.len();
        // Relaxed: where to look first is a hint; racing searches may look
        // at the same keys.
        let from = self.sweep.at.load(Ordering::Relaxed);
        let (mut at, mut slot) = ((from >> 32) as usize % count, from as u32 as usize);
        let (mut looks, mut found, mut spared) = (0, None, None);
        let stop = slot;
        // Every shard, and the first once more for the slots before `stop`.
        for round in 0..=count {
            let map = read(&self.shards[at]);
            let len = map.slots.len();
            let end = if round < count { len } else { stop.min(len) };
            while let Some(next) = map.slots[..end].get(slot).filter(|_| looks < most) {
                looks += 1;
                slot += 1;
                if next.entry.is_idle() {
                    let idle = Some((at, slot - 1, next.hash));
                    // Relaxed: a hint to the order of eviction.
                    if !next.entry.used.swap(false, Ordering::Relaxed) {
                        found = idle;
                        break;
                    }
                    spared = spared.or(idle);
                }
            }
            drop(map);
            if looks == most || found.is_some() {
                break;
            }
            (at, slot) = ((at + 1) % count, 0);
        }
        self.sweep
            .at
            .store(((at as u64) << 32) | slot as u64, Ordering::Relaxed);
        // A full search that found none with keys left unlooked at: the
        // searches are short for a while. A short one does not make the
        // while longer: however long a flood lasts, a full search comes
        // about every `SHORT_SEARCHES_FOR`.
        let found = found.or(spared);
        if found.is_none() && full && looks < self.len() {
            let now = self.clock.now();
            // A clock at its last tick reads the same for good: no while.
            if !Clock::has_stopped(now) {
                let until = now.saturating_add(self.clock.ticks(SHORT_SEARCHES_FOR));
                self.sweep.short_until.store(until, Ordering::Relaxed);
            }
        }
        found
    }

    pub(crate) fn len(&self) -> usize {
        // Relaxed: a count.
        self.held.load(Ordering::Relaxed)
    }

    pub(crate) fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    pub(crate) fn refused(&self) -> u64 {
        self.sweep.refused.load(Ordering::Relaxed)
    }

    /// The keys with the most calls in flight (then waiting), at most
    /// `count` of them: the busiest of each shard, then of those. Each shard
    /// is read under its read lock: a copy of every key's bulkhead would make
    /// each look busy to a sweep meanwhile.
    pub(crate) fn busiest(&self, count: usize) -> Vec<KeyStatus<K>> {
        let mut busiest = Vec::new();
        for shard in self.shards.iter() {
            let map = read(shard);
            // Only the keys kept are copied, their totals read.
            let mut busy = Vec::new();
            for slot in &map.slots {
                let bulkhead = &slot.entry.bulkhead;
                let (in_flight, waiting) = (bulkhead.in_flight(), bulkhead.waiting());
                if in_flight + waiting > 0 {
                    busy.push((std::cmp::Reverse((in_flight, waiting)), slot));
                }
            }
            busy.sort_by_key(|&(load, _)| load);
            for (std::cmp::Reverse((in_flight, waiting)), slot) in busy.into_iter().take(count) {
                let bulkhead = &slot.entry.bulkhead;
                let (key, limit) = (slot.key.clone(), bulkhead.limit());
                let totals = bulkhead.status().totals;
                busiest.push(KeyStatus {
                    key,
                    limit,
                    in_flight,
                    waiting,
                    totals,
                });
            }
        }
        busiest.sort_by_key(|status| std::cmp::Reverse((status.in_flight, status.waiting)));
        busiest.truncate(count);
        busiest
    }
}

/// The room to shrink to, if a collection with room for `room` holds half
/// of it or less (`len`): half as much again as it holds, so that a few more
/// going in do not grow it again at once (a shrink costs as much as what it
/// moves, and a third of that goes out before the next).
fn room_to_keep(room: usize, len: usize) -> Option<usize> {
    /// Room for this many is never worth giving back.
    const KEPT: usize = 16;
    let held = len.max(KEPT);
    (room > 2 * held).then_some(held + held / 2)
}

/// One of the `max_keys` places, taken for a new key: given back when
/// dropped, unless kept (by a key being made, or the key made).
#[must_use = "a place is given back when dropped"]
struct Place<'a, K> {
    keys: &'a Keys<K>,
}

impl<K> Place<'_, K> {
    fn keep(self) {
        std::mem::forget(self);
    }
}

impl<K> Drop for Place<'_, K> {
    fn drop(&mut self) {
        // Relaxed: a count.
        self.keys.places.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A caller making a key outside the lock, its place held in its shard's
/// `making`: given back if the making panics (in a limit function).
struct Maker<'a, K> {
    keys: &'a Keys<K>,
    shard: &'a RwLock<Map<K>>,
    hash: u64,
}

impl<K> Drop for Maker<'_, K> {
    fn drop(&mut self) {
        if write(self.shard).take_making(self.hash) {
            drop(Place { keys: self.keys });
        }
    }
}

#[cfg(test)]
impl<K: Hash + Eq + Clone> Keys<K> {
    /// Keys of `template` alone, with no function per key.
    pub(crate) fn plain(template: crate::Config, max_keys: usize, shards: usize) -> Self {
        let make = KeyMaker::new(template, None, crate::keyed::key::KeyFunctions::default());
        Self::new(make, max_keys, shards)
    }

    /// The places taken: keys held, being made, or about to be.
    pub(crate) fn places(&self) -> usize {
        self.places.load(Ordering::Relaxed)
    }
}

#[cfg(all(test, not(tower_inflight_loom)))]
mod tests {
    use super::*;
    use crate::bulkhead::Permit;
    use crate::Config;
    use std::time::Duration;

    /// Keys of one slot each, `max_keys` of them over `shards` shards.
    fn keys(max_keys: usize, shards: usize) -> Keys<u64> {
        Keys::plain(Config::new(1, Duration::from_secs(3_600)), max_keys, shards)
    }

    /// The first `count` keys that shard `at` of `shards` holds.
    fn keys_of_shard(at: usize, shards: usize, count: usize) -> Vec<u64> {
        (0..)
            .filter(|key| shard_of(key, shards) == at)
            .take(count)
            .collect()
    }

    /// `key`'s slot, held; `None` if the key was refused.
    fn hold(keys: &Keys<u64>, key: u64) -> Option<Permit> {
        keys.find(&key, |entry| {
            let claim = entry.bulkhead.try_claim().expect("the key's slot is free");
            entry.bulkhead.clone().admit(claim)
        })
    }

    /// Every place taken is a key held or being made, the count of keys
    /// held is the keys in the shards, and every slot is found by its key.
    fn assert_places_match(keys: &Keys<u64>) {
        let (mut held, mut making) = (0, 0);
        for shard in keys.shards.iter() {
            let map = read(shard);
            held += map.slots.len();
            making += map.making.len();
            for slot in &map.slots {
                let found = map.find(slot.hash, &slot.key).expect("found by its key");
                assert!(std::ptr::eq(found, &slot.entry), "{} found", slot.key);
            }
        }
        assert_eq!(keys.len(), held, "the count of keys held is off");
        assert_eq!(keys.places(), held + making, "places and keys disagree");
    }

    #[test]
    fn a_new_key_evicts_an_idle_key_of_another_shard_when_its_own_has_none() {
        let keys = keys(2, 4);
        for key in keys_of_shard(0, 4, 2) {
            drop(hold(&keys, key).expect("room for two keys"));
        }
        let newcomer = keys_of_shard(1, 4, 1)[0];
        let held = hold(&keys, newcomer).expect("an idle key of shard 0 made room");
        assert_eq!((keys.len(), keys.evicted()), (2, 1));
        assert_places_match(&keys);
        drop(held);
    }

    #[test]
    fn max_keys_bounds_the_keys_of_every_shard_together() {
        let keys = keys(3, 4);
        let mut held: Vec<_> = (0..3)
            .map(|at| hold(&keys, keys_of_shard(at, 4, 1)[0]).expect("room for three keys"))
            .collect();
        for at in [3, 0] {
            let key = keys_of_shard(at, 4, 2)[1];
            assert!(hold(&keys, key).is_none(), "a fourth key, in shard {at}");
        }
        assert_eq!((keys.refused(), keys.len()), (2, 3));
        assert_places_match(&keys);
        // One key idle, in shard 1: a key of shard 3 takes its place.
        drop(held.remove(1));
        held.push(hold(&keys, keys_of_shard(3, 4, 1)[0]).expect("the idle key made room"));
        assert_eq!((keys.len(), keys.evicted()), (3, 1));
        assert_places_match(&keys);
    }

    /// A shard's lock word and its map are on cache lines apart, and each
    /// shard on lines of its own.
    #[test]
    fn a_shards_lock_word_and_map_are_on_cache_lines_apart() {
        let keys = keys(1_000, 4);
        for shard in keys.shards.iter() {
            let lock = shard as *const RwLock<Map<u64>> as usize;
            let map = &*read(shard) as *const Map<u64> as usize;
            assert_eq!(lock % 128, 0, "a shard starts a pair of cache lines");
            assert!(
                map - lock >= 64,
                "the map is {} bytes past the lock word",
                map - lock
            );
        }
    }

    /// Keys of one hash are chained: evicted from the front, the middle and
    /// the back of their chain, and moved into an evicted key's slot, every
    /// key left is found by its own key.
    #[test]
    fn keys_of_one_hash_stay_found_as_slots_move() {
        let mut map = Map {
            first: HashMap::default(),
            slots: Vec::new(),
            making: Vec::new(),
        };
        let keys = keys(1, 1);
        for key in 0..8u64 {
            map.push(key % 2, key, keys.make.entry(&key));
        }
        for at in [0, 3, 5, 0] {
            map.remove(at);
            for slot in &map.slots {
                assert!(std::ptr::eq(
                    map.find(slot.hash, &slot.key).unwrap(),
                    &slot.entry
                ));
            }
        }
        assert_eq!(map.slots.len(), 4);
        assert!(map.find(0, &1).is_none(), "a key under another hash");
        while !map.slots.is_empty() {
            map.remove(map.slots.len() - 1);
        }
        assert!(map.first.is_empty());
    }

    /// A search goes on from where the last one stopped, over every shard,
    /// looking at no key twice: within a millisecond of a search that looked
    /// at 128 keys of more and found none, at 8.
    #[test]
    fn searches_go_on_from_where_the_last_stopped_and_are_short_after_a_flood() {
        let clock = crate::ManualClock::new();
        let template = Config::new(1, Duration::from_secs(3_600)).clock(clock.clone());
        let keys = Keys::plain(template, 136, 1);
        let mut held: Vec<_> = (0..136).map(|key| hold(&keys, key)).collect();
        assert!(held.iter().all(Option::is_some));
        // Every key busy: a full search looks at 0 to 127 and finds none.
        assert!(hold(&keys, 1_000).is_none());
        // Key 12 goes idle: short searches look at 128 to 135, 0 to 7, then
        // 8 to 15, and find it.
        held[12] = None;
        assert!(hold(&keys, 1_001).is_none(), "a short search looked past 8");
        assert!(hold(&keys, 1_002).is_none(), "a short search looked past 8");
        let found = hold(&keys, 1_003).expect("the third short search finds key 12");
        assert_eq!((keys.evicted(), keys.refused()), (1, 3));
        // A millisecond on, a search is a full one again.
        held[40] = None;
        clock.advance(Duration::from_millis(1));
        let again = hold(&keys, 1_004).expect("a full search finds key 40");
        assert_eq!((keys.evicted(), keys.refused()), (2, 3));
        assert_places_match(&keys);
        drop((found, again, held));
    }
}
