//! The keys a keyed bulkhead holds: a bulkhead per key, made on a key's
//! first call, and evicted once nothing holds it, so that no stream of
//! distinct keys makes memory grow past `max_keys`.

use crate::bulkhead::{Bulkhead, History};
use crate::config::Config;
use crate::error::ShedReason;
use crate::keyed::turns::{weight, KeyTurn};
use crate::keyed::KeyStatus;
use crate::slots::Claim;
use crate::slots::MAX_SLOTS;
use crate::sync::{
    fence, read, write, Arc, AtomicBool, AtomicU64, AtomicUsize, Mutex, Ordering, RwLock,
};
use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::BuildHasher;
use std::hash::Hash;

/// How many keys one new key may look at to find one to evict, so that a
/// flood of new keys while every key is busy costs a bounded amount each.
const SWEEP: usize = 128;

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
    /// slots held, less its callers still waiting for the ceiling's. (A
    /// hint: a leaked permit counts until its slot is reclaimed.)
    pub(crate) fn ceiling_held(&self, bulkhead: &Bulkhead) -> usize {
        bulkhead
            .in_flight()
            .saturating_sub(self.waiting_for_ceiling.load(Ordering::Relaxed))
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

struct Map<K> {
    entries: HashMap<K, Entry>,
    /// Every key in `entries`, once, in the order the sweep visits them.
    ring: VecDeque<K>,
    /// The hashes of the keys being made outside the lock, each holding a
    /// place. Hashes, not keys: a place is found and given back without a
    /// call to the key's own `Hash` or `Eq`, either of which may panic. (Two
    /// keys of one hash made at once share a place, and the second to come
    /// back may find no room: a call shed, never a key past `max_keys`.)
    making: Vec<u64>,
}

impl<K> Map<K> {
    /// Takes the place held for a key of `hash` being made, if there is one.
    fn take_place(&mut self, hash: u64) -> bool {
        match self.making.iter().position(|&made| made == hash) {
            Some(at) => {
                self.making.swap_remove(at);
                true
            }
            None => false,
        }
    }
}

pub(crate) struct Keys<K> {
    map: RwLock<Map<K>>,
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
    refused: AtomicU64,
}

impl<K: Hash + Eq + Clone> Keys<K> {
    pub(crate) fn new(
        template: Config,
        max_limit: Option<usize>,
        limit_of: Option<LimitOf<K>>,
        guarantee_of: Option<LimitOf<K>>,
        weight_of: Option<LimitOf<K>>,
        label_of: Option<LabelOf<K>>,
        max_keys: usize,
    ) -> Self {
        Self {
            map: RwLock::new(Map {
                entries: HashMap::new(),
                ring: VecDeque::new(),
                making: Vec::new(),
            }),
            template,
            max_limit: max_limit.unwrap_or(MAX_SLOTS).clamp(1, MAX_SLOTS),
            limit_of,
            guarantee_of,
            weight_of,
            label_of,
            reported: Mutex::default(),
            max_keys,
            evicted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }

    /// `found` of `key`'s entry, made if it is new; `None` if it is new
    /// and `max_keys` keys are held, none of them idle.
    ///
    /// `found` runs under the map's lock: the sweep, under the write lock,
    /// never sees a caller between finding the key and taking its slot (or
    /// the `Arc` of its line, for a caller that waits).
    // `always`: what `found` returns (a permit) must reach the caller in
    // registers; returned through memory, a call cost about 10 ns more
    // (benches/keyed.rs).
    #[inline(always)]
    pub(crate) fn find<R>(&self, key: &K, found: impl FnOnce(&Entry) -> R) -> Option<R> {
        {
            let map = read(&self.map);
            if let Some(entry) = map.entries.get(key) {
                entry.mark_used();
                return Some(found(entry));
            }
        }
        self.insert(key, found)
    }

    /// `found` of `key`'s entry if it is held; nothing is made.
    pub(crate) fn get<R>(&self, key: &K, found: impl FnOnce(&Entry) -> R) -> Option<R> {
        let map = read(&self.map);
        map.entries.get(key).map(found)
    }

    #[cold]
    fn insert<R>(&self, key: &K, found: impl FnOnce(&Entry) -> R) -> Option<R> {
        // Room first: a key refused allocates nothing. One place a key, held
        // while its hash is in `making`: a second caller of a key being made
        // takes none.
        let (maker, hash) = {
            let mut map = write(&self.map);
            if let Some(entry) = map.entries.get(key) {
                return Some(found(entry)); // made meanwhile
            }
            let hash = map.entries.hasher().hash_one(key);
            if map.making.contains(&hash) {
                (None, hash)
            } else if self.make_room(&mut map) {
                map.making.push(hash);
                // The place is given back however this ends, a panicking
                // limit function included.
                (Some(Maker { keys: self, hash }), hash)
            } else {
                self.refused.fetch_add(1, Ordering::Relaxed);
                return None;
            }
        };
        // Made outside the lock: a key with a large limit takes a while to
        // build, and the limit functions may look at this keyed bulkhead.
        let entry = self.make_entry(key);
        let mut map = write(&self.map);
        if let Some(maker) = maker {
            maker.done();
        }
        // A place: the one held for the key, whoever holds it (a second
        // caller takes the place of a maker not back yet, who then finds the
        // key made, or, if it was evicted meanwhile, needs room again), or
        // room now. Taken before the key's own code runs again: if its
        // `Hash`, `Eq` or `Clone` panics below, no place is left held.
        let placed = map.take_place(hash);
        if map.entries.contains_key(key) {
            if placed {
                // Another key's, of the same hash: not ours to take.
                map.making.push(hash);
            }
            return map.entries.get(key).map(found); // made meanwhile: ours is dropped
        }
        if !placed && !self.make_room(&mut map) {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let found = found(&entry);
        // The ring first: a key in the ring and not in the map (a `Clone`
        // or `Hash` that panicked) is passed over by the sweep, while a key
        // in the map and not in the ring could never be evicted.
        map.ring.push_back(key.clone());
        map.entries.insert(key.clone(), entry);
        Some(found)
    }

    /// Whether a new key fits: fewer than `max_keys` are held or being
    /// made, or one was evicted.
    fn make_room(&self, map: &mut Map<K>) -> bool {
        map.entries.len() + map.making.len() < self.max_keys || self.evict_one(map)
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

    /// Evicts one idle key, looking at no more than `SWEEP` keys, each once:
    /// a key that is busy goes to the back; an idle key used since the last
    /// pass gets a second chance, unless no idle key unused since is found,
    /// and then the first idle one seen is evicted.
    fn evict_one(&self, map: &mut Map<K>) -> bool {
        let Map { entries, ring, .. } = map;
        let mut second_chance = None;
        for _ in 0..SWEEP.min(ring.len()) {
            let Some(key) = ring.front() else {
                break;
            };
            // Looked up before it leaves the ring: a `Hash` that panics
            // leaves it where it was.
            let entry = entries.get(key);
            let key = ring.pop_front().expect("the ring's front was there");
            let Some(entry) = entry else {
                continue;
            };
            let used = entry.used.swap(false, Ordering::Relaxed);
            if !Self::is_idle(entry) {
                ring.push_back(key);
            } else if !used {
                if let Some(spared) = second_chance.take() {
                    ring.push_back(spared);
                }
                return self.evict(entries, &key);
            } else if second_chance.is_none() {
                second_chance = Some(key);
            } else {
                ring.push_back(key);
            }
        }
        second_chance.is_some_and(|key| self.evict(entries, &key))
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
        // the next call.
        let last_taken = entry
            .last_taken
            .load(Ordering::Relaxed)
            .max(entry.line.last_taken.load(Ordering::Relaxed));
        entry.bulkhead.is_unshared() || entry.bulkhead.reclaimable_since(last_taken)
    }

    fn evict(&self, entries: &mut HashMap<K, Entry>, key: &K) -> bool {
        if let Some(entry) = entries.remove(key) {
            // Slots still held are past their deadlines (leaked): forgotten,
            // so that a key that reports metrics shows none in flight.
            if entry.bulkhead.in_flight() > 0 {
                entry.bulkhead.reset();
            }
        }
        self.evicted.fetch_add(1, Ordering::Relaxed);
        true
    }

    pub(crate) fn len(&self) -> usize {
        read(&self.map).entries.len()
    }

    pub(crate) fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// The keys with the most calls in flight (then waiting), at most
    /// `count` of them. Read under the map's read lock: a copy of every
    /// key's bulkhead would make each look busy to a sweep meanwhile.
    pub(crate) fn busiest(&self, count: usize) -> Vec<KeyStatus<K>> {
        let map = read(&self.map);
        let mut busy: Vec<(&K, &Entry, usize, usize)> = map
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
        busy.into_iter()
            .map(|(key, entry, in_flight, waiting)| KeyStatus {
                key: key.clone(),
                limit: entry.bulkhead.limit(),
                in_flight,
                waiting,
                totals: entry.bulkhead.status().totals,
            })
            .collect()
    }
}

/// A caller making a key outside the lock: if it panics (in a limit
/// function), its key's place is given back.
struct Maker<'a, K> {
    keys: &'a Keys<K>,
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
        write(&self.keys.map).take_place(self.hash);
    }
}
