//! The keys a keyed bulkhead holds: a bulkhead per key, made on a key's
//! first call, and evicted once nothing holds it, so that no stream of
//! distinct keys makes memory grow past `max_keys`. The keys are spread over
//! shards (see `shards`), each a map behind its own lock; `max_keys` bounds
//! them all together.

use crate::bulkhead::{Bulkhead, Clock, History};
use crate::config::Config;
use crate::error::ShedReason;
use crate::keyed::hashed::{Borrowed, Hashed, PassthroughState};
use crate::keyed::shards::shard_of;
use crate::keyed::turns::{weight, KeyTurn};
use crate::keyed::KeyStatus;
use crate::slots::Claim;
use crate::slots::MAX_SLOTS;
use crate::sync::{
    fence, read, write, Arc, AtomicBool, AtomicU64, AtomicUsize, Mutex, Ordering, RwLock,
};
use std::collections::hash_map::RandomState;
use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::BuildHasher;
use std::hash::Hash;
use std::time::Duration;

/// How many keys one search for room may look at to find one to evict, so
/// that a flood of new keys while every key is busy costs a bounded amount
/// each: its own shard's first, then the next shards', each shard's from
/// the front of its ring (where its idle keys gather: a sweep sends the busy
/// keys it looks at to the back), no key twice.
const SWEEP: usize = 128;

/// How many keys a search for room looks at, at most, within
/// `SHORT_SEARCHES_FOR` of a search that looked at `SWEEP` keys and found
/// none: under a flood of new keys while every key is busy, a refusal costs
/// a sixteenth of a full search. Each short search begins in the map after
/// the last one's, and each map's sweep goes on from where it stopped, so
/// the short searches still go round every key: one that goes idle is
/// found by a later one.
const SHORT_SEARCH: usize = 8;

/// How long after a search that looked at `SWEEP` keys and found no room
/// the searches are short: about this (from 0.98 to 1.95 ms on a clock of
/// 1,024 ticks a second).
const SHORT_SEARCHES_FOR: Duration = Duration::from_millis(1);

/// How many labels of keys ever report metrics, at most: a bound on the
/// series a keyed bulkhead adds, whatever its keys.
#[cfg(feature = "metrics")]
const MAX_REPORTED_KEYS: usize = 64;

// The functions of the configuration are `std`'s `Arc` even under loom,
// whose `Arc` cannot hold an unsized `dyn Fn`: they are read, never raced.

/// The label a key's metrics carry, if it is one of the keys to report:
/// from [`KeyedConfig::metrics_per_key`](crate::keyed::KeyedConfig::metrics_per_key).
pub(crate) type LabelOf<K> = std::sync::Arc<dyn Fn(&K) -> Option<String> + Send + Sync>;

/// A number per key: its own limit, from
/// [`KeyedConfig::limit_per_key`](crate::keyed::KeyedConfig::limit_per_key),
/// its guaranteed share of the ceiling, from
/// [`KeyedConfig::guarantee_per_key`](crate::keyed::KeyedConfig::guarantee_per_key),
/// or its weight, from
/// [`KeyedConfig::weight_per_key`](crate::keyed::KeyedConfig::weight_per_key).
pub(crate) type LimitOf<K> = std::sync::Arc<dyn Fn(&K) -> usize + Send + Sync>;

/// One key's bulkhead, in the map. A caller taking a slot of it from the
/// map holds the map's read lock; one that waits for a slot holds an `Arc`
/// of its line; a permit shares its bulkhead. What every call touches is
/// here, beside the key, rather than behind a pointer.
pub(crate) struct Entry {
    pub(crate) bulkhead: Bulkhead,
    /// Used since the sweep last passed it: it is passed over once more
    /// (a second chance, which makes the sweep evict the least recently
    /// used keys first, roughly).
    used: AtomicBool,
    /// When its latest slot was taken by a caller that did not wait, on its
    /// bulkhead's clock.
    last_taken: AtomicU64,
    pub(crate) line: Arc<KeyLine>,
}

/// What a key's callers that wait share: its place in the ceiling's line.
pub(crate) struct KeyLine {
    /// How many of the ceiling's slots it is promised.
    pub(crate) guarantee: usize,
    /// How many of its callers hold its slot and wait for the ceiling's.
    pub(crate) waiting_for_ceiling: AtomicUsize,
    /// Its place in turn at the ceiling, and its weight there (see
    /// `turns`).
    pub(crate) turn: KeyTurn,
    pub(crate) weight: u64,
    /// When its latest slot was taken by a caller that waited.
    last_taken: AtomicU64,
}

impl Entry {
    /// Marks the key used: a hint for the sweep, written only when it
    /// changes, so that a busy key's line is not written on every call.
    #[inline(always)]
    fn mark_used(&self) {
        // Relaxed: a hint to the order of eviction, read by the sweep
        // under the map's write lock.
        if !self.used.load(Ordering::Relaxed) {
            self.used.store(true, Ordering::Relaxed);
        }
    }

    /// A slot of this key's, not yet counted as admitted (see
    /// [`Bulkhead::try_claim`]), noted as taken by a caller under the map's
    /// lock.
    #[inline(always)]
    pub(crate) fn claim(&self) -> Result<Claim, ShedReason> {
        let claim = self.bulkhead.try_claim()?;
        note_taken(&self.last_taken, self.bulkhead.claimed_at(&claim));
        Ok(claim)
    }
}

impl KeyLine {
    /// Notes that a slot of this key's, taken at tick `at`, was taken by a
    /// caller that holds this line's `Arc`.
    pub(crate) fn taken_at(&self, at: u64) {
        note_taken(&self.last_taken, at);
    }

    /// How many of the ceiling's slots the key of `bulkhead` holds: its
    /// permits that hold one. Not its slots held less its callers waiting
    /// for the ceiling's: a caller handed its key's slot, on its way to the
    /// ceiling's line, would count as holding one. (A hint: a leaked permit
    /// is counted for good, bounded by the key's slots held less its callers
    /// in line: once its slot is reclaimed it counts no more, but while
    /// callers of its key are on their way to the line.)
    pub(crate) fn ceiling_held(&self, bulkhead: &Bulkhead) -> usize {
        let held = bulkhead
            .in_flight()
            .saturating_sub(self.waiting_for_ceiling.load(Ordering::Relaxed));
        bulkhead.held_with_ceiling().min(held)
    }
}

/// Notes in `last_taken` the tick `at` which a slot was taken, by a caller
/// that holds the map's read lock or the key line's `Arc`, so that no sweep
/// looks at the key before it is noted.
#[inline(always)]
fn note_taken(last_taken: &AtomicU64, at: u64) {
    // Relaxed: read by the sweep under the map's write lock, after the lock
    // or the `Arc` is given up. Written only when the tick moves (at most
    // 1,024 times a second), and never backwards.
    if last_taken.load(Ordering::Relaxed) < at {
        last_taken.fetch_max(at, Ordering::Relaxed);
    }
}

/// One shard of the keys, on a cache line of its own: calls of keys of
/// different shards write different lines.
#[repr(align(128))]
struct Shard<K> {
    map: RwLock<Map<K>>,
}

struct Map<K> {
    /// Keys with their hash (see `hashed`): the map never runs a key's own
    /// `Hash`, so a key's `Hash` that panics cannot make it drop keys.
    entries: HashMap<Hashed<K>, Entry, PassthroughState>,
    /// Every key in `entries`, once, in the order the sweep visits them.
    ring: VecDeque<Hashed<K>>,
    /// The hashes of the keys being made outside the lock, each holding a
    /// place. Hashes, not keys: a place is found and given back without a
    /// call to the key's own `Hash` or `Eq`, either of which may panic. (Two
    /// keys of one hash made at once share a place, and the second to come
    /// back may find no room: a call shed, never a key past `max_keys`.)
    /// Each place is counted in `Keys::places`.
    making: Vec<u64>,
    /// The room `entries` keeps, in keys: the most its `capacity()` was
    /// since it last gave room back. (Its `capacity()` now is not: a key
    /// taken out of a crowded stretch of the table leaves a mark that counts
    /// as neither a key nor room, and lowers it for good. Right after the
    /// table grows or shrinks, it is exact.)
    most: usize,
}

impl<K> Drop for Map<K> {
    fn drop(&mut self) {
        // Every copy of every key apart (see `FirstPanic`): a map's own
        // drop stops at the first that panics, and leaks the rest. Their
        // panics, reported by the panic hook as they happen, go no further:
        // raised here, one would unwind through the drop of all the keyed
        // bulkhead holds besides (its other maps, its ceiling, the
        // configuration's functions), where any other panic would abort the
        // process.
        let mut panics = FirstPanic::default();
        for (key, entry) in self.entries.drain() {
            panics.drop_apart(key);
            panics.drop_apart(entry);
        }
        for key in self.ring.drain(..) {
            panics.drop_apart(key);
        }
        panics.ignore();
    }
}

impl<K: Eq> Map<K> {
    /// Room for one more key, counted in `most` before the key goes in:
    /// `insert` grows the table before it compares keys, and a key's `Eq`
    /// that panics there would leave a table grown and not counted.
    fn reserve_one(&mut self) {
        self.entries.reserve(1);
        self.most = self.most.max(self.entries.capacity());
    }

    /// Gives back the room of the map and the ring once they hold a quarter
    /// of it, so that keys moving from shard to shard leave no room behind
    /// in each (without it, `max_keys` keys could keep the room of
    /// `max_keys` in every shard). A map's rehash runs no key's own code
    /// (see `hashed`).
    fn give_back_room(&mut self) {
        if let Some(room) = room_to_keep(self.most, self.entries.len()) {
            self.entries.shrink_to(room);
            self.most = self.entries.capacity();
        }
        if let Some(room) = room_to_keep(self.ring.capacity(), self.entries.len()) {
            self.ring.shrink_to(room);
        }
    }
}

impl<K> Map<K> {
    /// Takes the place held for a key of `hash` being made, if there is one.
    fn take_place(&mut self, hash: u64) -> bool {
        match self.making.iter().position(|&made| made == hash) {
            Some(at) => {
                self.making.swap_remove(at);
                // Many keys made at once (callers in a slow limit function)
                // leave no room behind.
                if let Some(room) = room_to_keep(self.making.capacity(), self.making.len()) {
                    self.making.shrink_to(room);
                }
                true
            }
            None => false,
        }
    }
}

pub(crate) struct Keys<K> {
    /// A power of two of them.
    shards: Box<[Shard<K>]>,
    /// Hashes every key once, as it comes in (see `hashed`).
    hasher: RandomState,
    /// The keys held and being made, in every shard: never past `max_keys`.
    places: AtomicUsize,
    /// The keys held, in every shard: counted as each goes in and out of
    /// its shard's map (a sum over the shards, read one after another,
    /// could count a key evicted from one and the key that took its place
    /// in another).
    held: AtomicUsize,
    template: Config,
    /// The most slots a key may have: the ceiling's limit (a key can never
    /// use more), or the most any bulkhead has.
    max_limit: usize,
    limit_of: Option<LimitOf<K>>,
    guarantee_of: Option<LimitOf<K>>,
    weight_of: Option<LimitOf<K>>,
    /// Without feature `metrics`, nothing reports.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    label_of: Option<LabelOf<K>>,
    /// The labels of the keys that reported metrics so far.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    reported: Mutex<HashSet<String>>,
    max_keys: usize,
    evicted: AtomicU64,
    /// The template's manual clock (in tests), or a precise one, for
    /// `Refusals::found_none_at`.
    clock: Clock,
    /// `SHORT_SEARCHES_FOR`, in ticks of `clock`.
    short_searches_for: u64,
    refusals: Refusals,
}

/// What the searches for room that find none write, on a cache line of its
/// own: a flood of new keys refused writes here, and not on the line of the
/// fields every call reads (the shards, the hasher).
#[repr(align(128))]
#[derive(Default)]
struct Refusals {
    /// New keys refused.
    refused: AtomicU64,
    /// When the latest search that looked at `SWEEP` keys found none (0:
    /// never), on `Keys::clock`.
    found_none_at: AtomicU64,
    /// The map the next short search begins in (modulo the maps).
    next_map: AtomicUsize,
}

impl<K: Hash + Eq + Clone> Keys<K> {
    /// Keys spread over `shards` shards, a power of two (see
    /// [`shard_count`](crate::keyed::shards::shard_count)).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        template: Config,
        max_limit: Option<usize>,
        limit_of: Option<LimitOf<K>>,
        guarantee_of: Option<LimitOf<K>>,
        weight_of: Option<LimitOf<K>>,
        label_of: Option<LabelOf<K>>,
        max_keys: usize,
        shards: usize,
    ) -> Self {
        debug_assert!(shards.is_power_of_two());
        // Not the coarse system clock: it moves once a scheduler tick (up to
        // 10 ms), longer than the while it would time. Read only as a search
        // for room begins or finds none.
        let clock = template
            .clock
            .clone()
            .map_or_else(Clock::precise, Clock::Manual);
        let short_searches_for = clock.ticks(SHORT_SEARCHES_FOR);
        Self {
            shards: (0..shards)
                .map(|_| Shard {
                    map: RwLock::new(Map {
                        entries: HashMap::default(),
                        ring: VecDeque::new(),
                        making: Vec::new(),
                        most: 0,
                    }),
                })
                .collect(),
            hasher: RandomState::new(),
            places: AtomicUsize::new(0),
            held: AtomicUsize::new(0),
            template,
            max_limit: max_limit.unwrap_or(MAX_SLOTS).clamp(1, MAX_SLOTS),
            limit_of,
            guarantee_of,
            weight_of,
            label_of,
            reported: Mutex::default(),
            max_keys,
            evicted: AtomicU64::new(0),
            clock,
            short_searches_for,
            refusals: Refusals::default(),
        }
    }

    /// The shard that holds `key`.
    #[inline(always)]
    fn shard(&self, key: &K) -> usize {
        shard_of(key, self.shards.len())
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
        let at = self.shard(key);
        let key = Borrowed {
            hash: self.hasher.hash_one(key),
            key,
        };
        {
            let map = read(&self.shards[at].map);
            if let Some(entry) = map.entries.get(key.lookup()) {
                entry.mark_used();
                return Some(found(entry));
            }
        }
        self.insert(at, key, found)
    }

    /// `found` of `key`'s entry if it is held; nothing is made.
    pub(crate) fn get<R>(&self, key: &K, found: impl FnOnce(&Entry) -> R) -> Option<R> {
        let at = self.shard(key);
        let key = Borrowed {
            hash: self.hasher.hash_one(key),
            key,
        };
        let map = read(&self.shards[at].map);
        map.entries.get(key.lookup()).map(found)
    }

    #[cold]
    fn insert<R>(
        &self,
        at: usize,
        hashed: Borrowed<'_, K>,
        found: impl FnOnce(&Entry) -> R,
    ) -> Option<R> {
        let shard = &self.shards[at].map;
        let (key, hash, lookup) = (hashed.key, hashed.hash, hashed.lookup());
        // Room first: a key refused allocates nothing. One place a key, held
        // while its hash is in `making`: a second caller of a key being made
        // takes none.
        let mut elsewhere = None;
        let mut search = self.search();
        let (maker, hash) = loop {
            let mut map = write(shard);
            if let Some(entry) = map.entries.get(lookup) {
                return Some(found(entry)); // made meanwhile
            }
            if map.making.contains(&hash) {
                drop(elsewhere.take());
                break (None, hash);
            }
            let place = match elsewhere.take() {
                Some(place) => Some(place),
                None => self.room_here(&mut map, &mut search),
            };
            if let Some(place) = place {
                map.making.push(hash);
                place.keep();
                // The place is given back however this ends, a panicking
                // limit function included.
                break (
                    Some(Maker {
                        keys: self,
                        at,
                        hash,
                    }),
                    hash,
                );
            }
            // Another shard's lock is never taken under this one's: with
            // two held, two new keys could each wait for the other's.
            drop(map);
            elsewhere = Some(self.room_elsewhere(at, &mut search)?);
        };
        // Made outside the lock: a key with a large limit takes a while to
        // build, and the limit functions may look at this keyed bulkhead.
        let entry = self.make_entry(key);
        let mut map = write(shard);
        if let Some(maker) = maker {
            maker.done();
        }
        // A place: the one held for the key, whoever holds it (a second
        // caller takes the place of a maker not back yet, who then finds the
        // key made, or, if it was evicted meanwhile, needs room again), or
        // room now. Taken before the key's own code runs again: if its
        // `Eq` or `Clone` panics below, the place is given back.
        let mut place = map.take_place(hash).then(|| Place { keys: self });
        if map.entries.contains_key(lookup) {
            if let Some(place) = place {
                // Another key's, of the same hash: not ours to take.
                map.making.push(hash);
                place.keep();
            }
            return map.entries.get(lookup).map(found); // made meanwhile: ours is dropped
        }
        // A search of its own, if its place was taken while it made the key
        // (or it found the key being made and took none).
        let mut search = self.search();
        if place.is_none() {
            place = self.room_here(&mut map, &mut search);
        }
        let place = match place {
            Some(place) => place,
            None => {
                drop(map);
                let elsewhere = self.room_elsewhere(at, &mut search)?;
                map = write(shard);
                if map.entries.contains_key(lookup) {
                    return map.entries.get(lookup).map(found); // made meanwhile
                }
                // Being made meanwhile, by a caller that found it absent:
                // that caller's place is the key's, taken as above, and the
                // one found elsewhere goes back (kept as well, one key
                // would hold two places).
                if map.take_place(hash) {
                    drop(elsewhere);
                    Place { keys: self }
                } else {
                    elsewhere
                }
            }
        };
        let found = found(&entry);
        // Both clones before either goes in: a `Clone` that panics leaves
        // neither, while a key in the map and not in the ring could never
        // be evicted, and one in the ring twice would be looked at twice.
        let (in_ring, in_map) = (
            Hashed {
                hash,
                key: key.clone(),
            },
            Hashed {
                hash,
                key: key.clone(),
            },
        );
        // The map runs no `Hash` of a key's (see `hashed`), and a key's
        // `Eq` that panics as it goes in leaves nothing in.
        map.reserve_one();
        map.entries.insert(in_map, entry);
        // Relaxed: a count; the key itself is published by the lock.
        self.held.fetch_add(1, Ordering::Relaxed);
        map.ring.push_back(in_ring);
        place.keep();
        Some(found)
    }

    /// A place for a new key in the shard of `map`: one of the `max_keys`
    /// not taken, or, unless `search` is a short one, that of an idle key of
    /// the shard evicted (see `SWEEP`).
    fn room_here(&self, map: &mut Map<K>, search: &mut Search) -> Option<Place<'_, K>> {
        if search.short {
            // A short search begins in the map its turn gives it (see
            // `room_elsewhere`), not in its own.
            return self.take_free_place().then(|| Place { keys: self });
        }
        self.room_in(map, &mut search.budget)
    }

    /// A place for a new key of shard `at`, which found none in its own
    /// shard: one given back meanwhile, or that of an idle key of another
    /// shard evicted, looking at no more than `search.budget` keys: a full
    /// search looks in the shards after its own; a short one (see
    /// `SHORT_SEARCH`) in each shard from the one after the last short
    /// search's, its own among them. `None`, counted as refused, if there is
    /// none.
    #[cold]
    fn room_elsewhere(&self, at: usize, search: &mut Search) -> Option<Place<'_, K>> {
        let count = self.shards.len();
        let (first, shards) = if search.short {
            // Relaxed: which map a short search begins in spreads the short
            // searches over the maps, and publishes nothing.
            let first = self.refusals.next_map.fetch_add(1, Ordering::Relaxed);
            (first % count, count)
        } else {
            ((at + 1) % count, count - 1)
        };
        for step in 0..shards {
            if self.take_free_place() {
                return Some(Place { keys: self });
            }
            if search.budget == 0 {
                break;
            }
            let mut map = write(&self.shards[(first + step) % count].map);
            if let Some(place) = self.room_in(&mut map, &mut search.budget) {
                return Some(place);
            }
        }
        // A full search that found none with its budget spent (keys may be
        // left unlooked at): the searches are short for a while. (With
        // every key looked at, the next would look at them all again.) A
        // short one does not make the while longer: however long a flood
        // lasts, a full search comes about every millisecond.
        if search.budget == 0 && !search.short {
            self.found_none();
        }
        self.refusals.refused.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// A place in the shard of `map`: one of the `max_keys` not taken, or
    /// that of an idle key of the shard evicted, looking at no more than
    /// `budget` keys (less those it looks at).
    fn room_in(&self, map: &mut Map<K>, budget: &mut usize) -> Option<Place<'_, K>> {
        if self.take_free_place() {
            return Some(Place { keys: self });
        }
        self.evict_one(map, budget)
    }

    /// A search for room, as it begins: a full one, or a short one within
    /// `SHORT_SEARCHES_FOR` of a search that found none with keys left
    /// unlooked at.
    fn search(&self) -> Search {
        // Relaxed: a hint to the cost of a search, which publishes nothing.
        let found_none_at = self.refusals.found_none_at.load(Ordering::Relaxed);
        let short = found_none_at != 0 && {
            let now = self.clock.now();
            // A clock at its last tick reads the same for good: no window.
            !Clock::has_stopped(now) && now < found_none_at.saturating_add(self.short_searches_for)
        };
        Search {
            budget: if short { SHORT_SEARCH } else { SWEEP },
            short,
        }
    }

    /// Notes that a search for room found none, now.
    #[cold]
    fn found_none(&self) {
        let now = self.clock.now();
        let found_none_at = &self.refusals.found_none_at;
        // Written only when the tick moves: under a flood of new keys, the
        // refusals of one tick write this line once.
        if found_none_at.load(Ordering::Relaxed) != now {
            found_none_at.store(now, Ordering::Relaxed);
        }
    }

    /// Takes one of the `max_keys` places if one is free.
    fn take_free_place(&self) -> bool {
        // Relaxed: a count, which publishes nothing; what a place guards is
        // under a shard's lock.
        self.places
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |places| {
                (places < self.max_keys).then_some(places + 1)
            })
            .is_ok()
    }

    fn make_entry(&self, key: &K) -> Entry {
        Entry {
            bulkhead: self.bulkhead_for(key),
            // Used: a key just made has its first call coming.
            used: AtomicBool::new(true),
            last_taken: AtomicU64::new(0),
            line: Arc::new(KeyLine {
                guarantee: self
                    .guarantee_of
                    .as_ref()
                    .map_or(0, |guarantee_of| guarantee_of(key)),
                waiting_for_ceiling: AtomicUsize::new(0),
                turn: KeyTurn::default(),
                weight: weight(
                    self.weight_of
                        .as_ref()
                        .map_or(1, |weight_of| weight_of(key)),
                ),
                last_taken: AtomicU64::new(0),
            }),
        }
    }

    /// A bulkhead for `key`: the template, with the key's own limit if a
    /// function gives one (held to 1 ..= `max_limit`). The template was
    /// validated when the keyed bulkhead was built, and a limit in that
    /// range keeps it valid.
    fn bulkhead_for(&self, key: &K) -> Bulkhead {
        let mut config = self.template.clone();
        config.limit = match &self.limit_of {
            Some(limit_of) => limit_of(key),
            None => config.limit,
        }
        .clamp(1, self.max_limit);
        // An adaptive limit's bounds are kept within the key's own limit.
        if let Some(adaptive) = &mut config.adaptive {
            adaptive.min = adaptive.min.min(config.limit);
            adaptive.initial = adaptive
                .initial
                .map(|initial| initial.clamp(adaptive.min, config.limit));
        }
        // No series per key unless the key is one to report: their number
        // is unbounded. (The ceiling, a plain bulkhead, reports as any does;
        // per-key figures are in the keyed bulkhead's status.)
        #[cfg(feature = "metrics")]
        if let Some(label) = self.label_to_report(key) {
            config.name = Some(match &config.name {
                Some(name) => format!("{name}/{label}").into(),
                None => label.into(),
            });
            return self.make(config);
        }
        #[cfg(feature = "metrics")]
        return metrics::with_local_recorder(&metrics::NoopRecorder, || self.make(config));
        #[cfg(not(feature = "metrics"))]
        self.make(config)
    }

    /// A key's bulkhead, keeping no history of minutes: a key reports its
    /// totals alone, and the history would grow each busy key by about
    /// 270 KiB a day.
    fn make(&self, config: Config) -> Bulkhead {
        Bulkhead::try_new_keeping(config, History::None).unwrap_or_else(|_| {
            Bulkhead::try_new_keeping(self.template.clone(), History::None)
                .expect("the template was validated when the keyed bulkhead was built")
        })
    }

    /// `key`'s label, if the configuration names it one to report and no
    /// more than `MAX_REPORTED_KEYS` labels have reported (this one among
    /// them).
    #[cfg(feature = "metrics")]
    fn label_to_report(&self, key: &K) -> Option<String> {
        let label = self.label_of.as_ref()?(key)?;
        let mut reported = crate::sync::lock(&self.reported);
        if reported.contains(&label) {
            return Some(label);
        }
        if reported.len() >= MAX_REPORTED_KEYS {
            return None;
        }
        reported.insert(label.clone());
        Some(label)
    }

    /// Evicts one idle key of the shard of `map`, looking at no more than
    /// `budget` keys (less those it looks at), each once: a key that is busy
    /// goes to the back; an idle key used since the last pass gets a second
    /// chance, unless no idle key unused since is found, and then the first
    /// idle one seen is evicted. Its place is the caller's.
    fn evict_one(&self, map: &mut Map<K>, budget: &mut usize) -> Option<Place<'_, K>> {
        let Map { entries, ring, .. } = map;
        // Each key once: a busy key goes to the back, where the sweep would
        // come to it again.
        let in_ring = ring.len();
        let mut aside = Aside { ring, key: None };
        for _ in 0..in_ring {
            if *budget == 0 {
                break;
            }
            let Some(key) = aside.ring.front() else {
                break;
            };
            // Looked up before it leaves the ring: an `Eq` that panics
            // leaves it where it was.
            let entry = entries.get(key.lookup());
            let key = aside.ring.pop_front().expect("the ring's front was there");
            // A key in the ring and not in the map would leave it, costing
            // no look. (None should be: a key goes in the map, then in the
            // ring, and a sweep takes it out of both.)
            let Some(entry) = entry else {
                continue;
            };
            *budget -= 1;
            let used = entry.used.swap(false, Ordering::Relaxed);
            if !Self::is_idle(entry) {
                aside.ring.push_back(key);
            } else if !used {
                // This one goes, and the one spared stays.
                if let Some(spared) = aside.key.replace(key) {
                    aside.ring.push_back(spared);
                }
                break;
            } else if aside.key.is_none() {
                aside.key = Some(key);
            } else {
                aside.ring.push_back(key);
            }
        }
        // Not found again only if the key's `Eq` changed its answer (or
        // it panics): back in the ring, and no place handed on for it.
        let (in_map, entry) = entries.remove_entry(aside.key.as_ref()?.lookup())?;
        // Out of the ring for good before any copy of the key is dropped:
        // were a `Drop` to panic, it would not go back.
        let in_ring = aside.key.take();
        drop(aside);
        let place = self.count_out();
        // Each part of the teardown runs whatever the others do: a key's
        // `Drop` that panics, or a metrics recorder, panics once all are
        // done, and the place goes back as it unwinds.
        let mut panics = FirstPanic::default();
        panics.drop_apart(in_map);
        panics.drop_apart(in_ring);
        // Slots still held are past their deadlines (leaked): forgotten,
        // so that a key that reports metrics shows none in flight.
        if entry.bulkhead.in_flight() > 0 {
            panics.run(|| entry.bulkhead.reset());
        }
        panics.drop_apart(entry);
        map.give_back_room();
        panics.resume();
        Some(place)
    }

    /// Whether nobody holds or is taking a slot of `entry` (under the map's
    /// write lock: nobody can start to), but for permits that were leaked.
    fn is_idle(entry: &Entry) -> bool {
        // No caller waits for a slot of it (holding its line's `Arc`), and
        // no permit shares its bulkhead.
        if Arc::strong_count(&entry.line) > 1 {
            return false;
        }
        // Whatever the last caller to hold the line wrote (when it took its
        // slot) happens before this: that `Arc`'s drop released it.
        fence(Ordering::Acquire);
        // A permit shares it: if its latest slot was taken `reclaim_after`
        // ago, every slot held is past its deadline, held by a permit that
        // was leaked (or that outlived its hold), and would be reclaimed by
        // the next call. Else, if the slots held now are all past their
        // deadlines (a permit leaked long ago, the key in use since), the
        // key is as idle: its eviction resets its bulkhead.
        let last_taken = entry
            .last_taken
            .load(Ordering::Relaxed)
            .max(entry.line.last_taken.load(Ordering::Relaxed));
        entry.bulkhead.is_unshared()
            || entry.bulkhead.reclaimable_since(last_taken)
            || entry.bulkhead.holds_nothing_unexpired()
    }

    /// Counts out a key taken out of its map: its place is the caller's.
    fn count_out(&self) -> Place<'_, K> {
        self.held.fetch_sub(1, Ordering::Relaxed);
        self.evicted.fetch_add(1, Ordering::Relaxed);
        Place { keys: self }
    }

    pub(crate) fn len(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// Keys of `template` alone, with no function per key.
    #[cfg(test)]
    pub(crate) fn plain(template: Config, max_keys: usize, shards: usize) -> Self {
        Self::new(template, None, None, None, None, None, max_keys, shards)
    }

    /// The places taken: keys held, being made, or about to be.
    #[cfg(test)]
    pub(crate) fn places(&self) -> usize {
        self.places.load(Ordering::Relaxed)
    }

    pub(crate) fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    pub(crate) fn refused(&self) -> u64 {
        self.refusals.refused.load(Ordering::Relaxed)
    }

    /// The keys with the most calls in flight (then waiting), at most
    /// `count` of them: the busiest of each shard, then of those. Each
    /// shard is read under its read lock: a copy of every key's bulkhead
    /// would make each look busy to a sweep meanwhile.
    pub(crate) fn busiest(&self, count: usize) -> Vec<KeyStatus<K>> {
        let mut busiest = Vec::new();
        for shard in self.shards.iter() {
            let map = read(&shard.map);
            let mut busy: Vec<(&Hashed<K>, &Entry, usize, usize)> = map
                .entries
                .iter()
                .map(|(key, entry)| {
                    let bulkhead = &entry.bulkhead;
                    (key, entry, bulkhead.in_flight(), bulkhead.waiting())
                })
                .filter(|&(_, _, in_flight, waiting)| in_flight + waiting > 0)
                .collect();
            busy.sort_by_key(|&(_, _, in_flight, waiting)| std::cmp::Reverse((in_flight, waiting)));
            busy.truncate(count);
            busiest.extend(
                busy.into_iter()
                    .map(|(key, entry, in_flight, waiting)| KeyStatus {
                        key: key.key.clone(),
                        limit: entry.bulkhead.limit(),
                        in_flight,
                        waiting,
                        totals: entry.bulkhead.status().totals,
                    }),
            );
        }
        busiest.sort_by_key(|status| std::cmp::Reverse((status.in_flight, status.waiting)));
        busiest.truncate(count);
        busiest
    }
}

/// The room to shrink to, if a collection with room for `room` holds a
/// quarter of it or less (`len`): twice what it holds, so that a few more
/// going in do not grow it again at once (a shrink costs as much as the
/// keys it moves, and half of them go in or out before the next).
fn room_to_keep(room: usize, len: usize) -> Option<usize> {
    /// Room for this many is never worth giving back.
    const KEPT: usize = 16;
    let held = len.max(KEPT);
    (room > 4 * held).then_some(2 * held)
}

/// The key a sweep set aside: spared for a second chance, or to be evicted.
/// Back at the end of the ring unless evicted, also when a key's `Eq`
/// panics in the sweep: out of the ring, a key in the map could never be
/// evicted.
struct Aside<'a, K> {
    ring: &'a mut VecDeque<Hashed<K>>,
    key: Option<Hashed<K>>,
}

impl<K> Drop for Aside<'_, K> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.ring.push_back(key);
        }
    }
}

/// The first panic of the parts of a teardown, held until all have run:
/// the copies of keys (a key's `Drop` may panic each time, and the keyed
/// bulkhead holds two copies of each). Were a part run while another's
/// panic unwinds, a second panic would abort the process; were it skipped,
/// its memory would be leaked.
#[derive(Default)]
struct FirstPanic(Option<Box<dyn std::any::Any + Send>>);

impl FirstPanic {
    /// Runs `part`, keeping its panic if it is the first.
    fn run(&mut self, part: impl FnOnce()) {
        if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(part)) {
            self.0.get_or_insert(panic);
        }
    }

    fn drop_apart<T>(&mut self, value: T) {
        self.run(move || drop(value));
    }

    /// Goes on with the first panic, as a call would have raised it: a
    /// caller that catches panics sees it.
    fn resume(self) {
        if let Some(panic) = self.0 {
            std::panic::resume_unwind(panic);
        }
    }

    /// Lets the first panic go, for a teardown that must finish: it was
    /// reported by the panic hook as it happened.
    fn ignore(self) {
        drop(self.0);
    }
}

/// A search for room for a new key.
struct Search {
    /// How many more keys it may look at.
    budget: usize,
    /// A short one (see `SHORT_SEARCH`).
    short: bool,
}

/// One of the `max_keys` places, taken for a new key: given back when
/// dropped, unless kept (in a shard's `making`, or by the key made).
#[must_use = "a place is given back when dropped"]
struct Place<'a, K> {
    keys: &'a Keys<K>,
}

impl<K> Place<'_, K> {
    /// Kept: a shard now holds it.
    fn keep(self) {
        std::mem::forget(self);
    }
}

impl<K> Drop for Place<'_, K> {
    fn drop(&mut self) {
        self.keys.places.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A caller making a key outside the lock: if it panics (in a limit
/// function), its key's place is given back.
struct Maker<'a, K> {
    keys: &'a Keys<K>,
    /// The key's shard.
    at: usize,
    /// The key's hash, by which its place is known.
    hash: u64,
}

impl<K> Maker<'_, K> {
    /// Back with the key made, under the lock: the place is settled there.
    fn done(self) {
        std::mem::forget(self);
    }
}

impl<K> Drop for Maker<'_, K> {
    fn drop(&mut self) {
        let mut map = write(&self.keys.shards[self.at].map);
        if map.take_place(self.hash) {
            drop(Place { keys: self.keys });
        }
    }
}

#[cfg(all(test, not(tower_inflight_loom)))]
mod tests {
    use super::*;
    use crate::bulkhead::Permit;
    use std::time::Duration;

    /// Keys of one slot each, `max_keys` of them over `shards` shards.
    fn keys(max_keys: usize, shards: usize) -> Keys<u64> {
        Keys::plain(Config::new(1, Duration::from_secs(3_600)), max_keys, shards)
    }

    /// [`keys`], on `clock`.
    fn keys_on(clock: &crate::ManualClock, max_keys: usize, shards: usize) -> Keys<u64> {
        let template = Config::new(1, Duration::from_secs(3_600)).clock(clock.clone());
        Keys::plain(template, max_keys, shards)
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
            let claim = entry.claim().expect("the key's slot is free");
            entry.bulkhead.clone().admit(claim)
        })
    }

    /// Every place taken is a key held or being made, and the count of keys
    /// held is the keys in the shards.
    fn assert_places_match(keys: &Keys<u64>) {
        let (mut held, mut making) = (0, 0);
        for shard in keys.shards.iter() {
            let map = read(&shard.map);
            held += map.entries.len();
            making += map.making.len();
        }
        assert_eq!(keys.len(), held, "the count of keys held is off");
        assert_eq!(
            keys.places(),
            keys.len() + making,
            "places taken and keys held disagree"
        );
    }

    #[test]
    fn a_new_key_evicts_an_idle_key_of_another_shard_when_its_own_has_none() {
        let keys = keys(2, 4);
        for key in keys_of_shard(0, 4, 2) {
            drop(hold(&keys, key).expect("room for two keys"));
        }
        let newcomer = keys_of_shard(1, 4, 1)[0];
        let held = hold(&keys, newcomer).expect("an idle key of shard 0 made room");
        assert_eq!(keys.len(), 2);
        assert_eq!(keys.evicted(), 1);
        assert_places_match(&keys);
        drop(held);
    }

    #[test]
    fn max_keys_bounds_the_keys_of_every_shard_together() {
        let keys = keys(3, 4);
        let held: Vec<_> = (0..3)
            .map(|at| {
                let key = keys_of_shard(at, 4, 1)[0];
                hold(&keys, key).expect("room for three keys")
            })
            .collect();
        for at in [3, 0] {
            let key = keys_of_shard(at, 4, 2)[1];
            assert!(hold(&keys, key).is_none(), "a fourth key, in shard {at}");
        }
        assert_eq!(keys.refused(), 2);
        assert_eq!(keys.len(), 3);
        assert_places_match(&keys);
        // One key idle, in shard 1: a key of shard 3 takes its place.
        let mut held = held;
        drop(held.remove(1));
        let newcomer = keys_of_shard(3, 4, 1)[0];
        held.push(hold(&keys, newcomer).expect("the idle key of shard 1 made room"));
        assert_eq!(keys.len(), 3);
        assert_eq!(keys.evicted(), 1);
        assert_places_match(&keys);
    }

    #[test]
    fn a_search_looks_at_its_own_shard_then_the_next_128_keys_in_all() {
        // 4 shards. Shard 0 holds 130 busy keys ahead of an idle one, the
        // last in its ring; shards 1 to 3 an idle key each.
        let clock = crate::ManualClock::new();
        let keys = keys_on(&clock, 134, 4);
        let of_shard_0 = keys_of_shard(0, 4, 133);
        let mut held: Vec<_> = of_shard_0[..130]
            .iter()
            .map(|&key| hold(&keys, key).expect("room"))
            .collect();
        drop(hold(&keys, of_shard_0[130]).expect("room"));
        let idle: Vec<_> = (1..4).map(|at| keys_of_shard(at, 4, 3)).collect();
        for keys_of in &idle {
            drop(hold(&keys, keys_of[0]).expect("room"));
        }
        // A new key of shard 0 looks at 128 busy keys of its own: refused,
        // though shards 1 to 3 have idle keys.
        assert!(hold(&keys, of_shard_0[131]).is_none());
        assert_eq!(keys.refused(), 1);
        // Past the millisecond of short searches that follows, the next goes
        // on from where it stopped: 2 busy keys, then the idle one.
        clock.advance(Duration::from_millis(1));
        held.push(hold(&keys, of_shard_0[131]).expect("the idle key of shard 0"));
        assert_eq!(keys.evicted(), 1);
        // A new key of shard 2 evicts the idle key of its own shard; the
        // next, with none idle in its own, that of shard 3.
        held.push(hold(&keys, idle[1][1]).expect("the idle key of shard 2"));
        held.push(hold(&keys, idle[1][2]).expect("the idle key of shard 3"));
        assert_eq!(keys.evicted(), 3);
        assert!(
            hold(&keys, idle[2][0]).is_none(),
            "shard 3's key was evicted"
        );
        assert_eq!(keys.len(), 134);
        assert_places_match(&keys);
    }

    #[test]
    fn within_a_millisecond_of_a_search_that_found_none_among_128_keys_a_search_looks_at_8() {
        let clock = crate::ManualClock::new();
        let keys = keys_on(&clock, 136, 1);
        let mut held: Vec<_> = (0..136).map(|key| hold(&keys, key)).collect();
        assert!(held.iter().all(Option::is_some));
        // Every key busy: a full search looks at 0 to 127 and finds none.
        assert!(hold(&keys, 1_000).is_none());
        // The ring is 128 to 135, 0 to 127: key 12, the 21st, goes idle.
        held[12] = None;
        // Within the millisecond, a search looks at 128 to 135 alone, the
        // next at 0 to 7, the next at 8 to 11, then finds key 12.
        assert!(
            hold(&keys, 1_001).is_none(),
            "a short search looked past 8 keys"
        );
        assert!(
            hold(&keys, 1_002).is_none(),
            "a short search looked past 8 keys"
        );
        let found = hold(&keys, 1_003).expect("the third short search goes on to key 12");
        assert_eq!(keys.evicted(), 1);
        assert_eq!(keys.refused(), 3);
        // The ring is 13 to 135, 0 to 11, 1,003: every key busy again.
        assert!(hold(&keys, 1_004).is_none());
        // The ring is 21 to 135, 0 to 11, 1,003, 13 to 20: key 40, the 20th,
        // goes idle, beyond the next short search.
        held[40] = None;
        clock.advance(Duration::from_micros(999));
        assert!(hold(&keys, 1_005).is_none(), "still within the millisecond");
        // The ring is 29 to 135, ...: key 40 is the 12th. A millisecond after
        // the latest full search that found none, a search is a full one
        // again, though short ones found none since.
        clock.advance(Duration::from_micros(1));
        let found_again = hold(&keys, 1_006).expect("a full search finds key 40");
        assert_eq!(keys.evicted(), 2);
        assert_eq!(keys.refused(), 5);
        assert_places_match(&keys);
        drop((found, found_again, held));
    }
}
