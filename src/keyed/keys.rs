//! The keys a keyed bulkhead holds: a bulkhead per key, made on a key's
//! first call, and evicted once nothing holds it, so that no stream of
//! distinct keys makes memory grow past `max_keys`.

use crate::bulkhead::Bulkhead;
use crate::config::Config;
use crate::slots::MAX_SLOTS;
use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

/// How many keys one new key may look at to find one to evict, so that a
/// flood of new keys while every key is busy costs a bounded amount each.
const SWEEP: usize = 128;

/// A number per key: its own limit, from
/// [`KeyedConfig::limit_per_key`](crate::keyed::KeyedConfig::limit_per_key),
/// or its guaranteed share of the ceiling, from
/// [`KeyedConfig::guarantee_per_key`](crate::keyed::KeyedConfig::guarantee_per_key).
pub(crate) type LimitOf<K> = Arc<dyn Fn(&K) -> usize + Send + Sync>;

/// One key's bulkhead. Whoever is taking or holding a slot of it holds an
/// `Arc` of it, so a key is idle when the map holds the only one (and no
/// handle or permit shares its bulkhead).
pub(crate) struct Entry {
    pub(crate) bulkhead: Bulkhead,
    /// How many of the ceiling's slots it is promised.
    pub(crate) guarantee: usize,
    /// How many of the ceiling's slots it holds now.
    pub(crate) ceiling_held: AtomicUsize,
    /// How many of its callers are in the ceiling's line now.
    pub(crate) waiting_for_ceiling: AtomicUsize,
    /// Used since the sweep last passed it: it is passed over once more
    /// (a second chance, which makes the sweep evict the least recently
    /// used keys first, roughly).
    used: AtomicBool,
}

pub(crate) struct Keys<K> {
    map: RwLock<HashMap<K, Arc<Entry>>>,
    /// Every key in the map, once, in the order the sweep visits them.
    sweep: Mutex<VecDeque<K>>,
    template: Config,
    limit_of: Option<LimitOf<K>>,
    guarantee_of: Option<LimitOf<K>>,
    max_keys: usize,
    evicted: AtomicU64,
    refused: AtomicU64,
}

impl<K: Hash + Eq + Clone> Keys<K> {
    pub(crate) fn new(
        template: Config,
        limit_of: Option<LimitOf<K>>,
        guarantee_of: Option<LimitOf<K>>,
        max_keys: usize,
    ) -> Self {
        Self {
            map: RwLock::default(),
            sweep: Mutex::default(),
            template,
            limit_of,
            guarantee_of,
            max_keys,
            evicted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }
    }

    /// `key`'s bulkhead, made if it is new; `None` if it is new and
    /// `max_keys` keys are held, none of them idle.
    pub(crate) fn entry(&self, key: &K) -> Option<Arc<Entry>> {
        {
            let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(entry) = map.get(key) {
                // Relaxed: a hint for the sweep. Written only when it
                // changes, so that a busy key's line is not written on
                // every call.
                if !entry.used.load(Ordering::Relaxed) {
                    entry.used.store(true, Ordering::Relaxed);
                }
                return Some(entry.clone());
            }
        }
        self.insert(key)
    }

    #[cold]
    fn insert(&self, key: &K) -> Option<Arc<Entry>> {
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = map.get(key) {
            return Some(entry.clone()); // made meanwhile
        }
        let mut sweep = self.sweep.lock().unwrap_or_else(PoisonError::into_inner);
        if map.len() >= self.max_keys && !self.evict_one(&mut map, &mut sweep) {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let entry = Arc::new(Entry {
            bulkhead: self.bulkhead_for(key),
            guarantee: self
                .guarantee_of
                .as_ref()
                .map_or(0, |guarantee_of| guarantee_of(key)),
            ceiling_held: AtomicUsize::new(0),
            waiting_for_ceiling: AtomicUsize::new(0),
            used: AtomicBool::new(false),
        });
        map.insert(key.clone(), entry.clone());
        sweep.push_back(key.clone());
        Some(entry)
    }

    /// A bulkhead for `key`: the template, with the key's own limit if a
    /// function gives one (held to 1 ..= 1,048,576). The template was
    /// validated when the keyed bulkhead was built, and a limit in that
    /// range keeps it valid.
    fn bulkhead_for(&self, key: &K) -> Bulkhead {
        let mut config = self.template.clone();
        if let Some(limit_of) = &self.limit_of {
            config.limit = limit_of(key).clamp(1, MAX_SLOTS);
        }
        let make =
            || Bulkhead::try_new(config).unwrap_or_else(|_| Bulkhead::new(self.template.clone()));
        // No series per key: their number is unbounded. (The ceiling, a
        // plain bulkhead, reports as any does; per-key figures are in the
        // keyed bulkhead's status.)
        #[cfg(feature = "metrics")]
        return metrics::with_local_recorder(&metrics::NoopRecorder, make);
        #[cfg(not(feature = "metrics"))]
        make()
    }

    /// Evicts one idle key, looking at no more than `SWEEP` keys: a key
    /// that is held (a permit, or a caller taking one) goes to the back; a
    /// key used since the last pass gets a second chance.
    fn evict_one(&self, map: &mut HashMap<K, Arc<Entry>>, sweep: &mut VecDeque<K>) -> bool {
        for _ in 0..SWEEP.min(2 * sweep.len()) {
            let Some(key) = sweep.pop_front() else {
                return false;
            };
            let Some(entry) = map.get(&key) else {
                continue;
            };
            // Under the write lock no one can take a slot of it, nor an
            // `Arc` of the entry: nobody else sharing either means nobody
            // holds or is taking a slot of it.
            let idle = Arc::strong_count(entry) == 1 && entry.bulkhead.is_unshared();
            if !idle || entry.used.swap(false, Ordering::Relaxed) {
                sweep.push_back(key);
                continue;
            }
            map.remove(&key);
            self.evicted.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        false
    }

    pub(crate) fn len(&self) -> usize {
        self.map
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    pub(crate) fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// The keys with the most calls in flight (then waiting), at most
    /// `count` of them.
    pub(crate) fn busiest(&self, count: usize) -> Vec<(K, Bulkhead)> {
        let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
        let mut busy: Vec<(K, Bulkhead, usize, usize)> = map
            .iter()
            .map(|(key, entry)| {
                let bulkhead = entry.bulkhead.clone();
                let (in_flight, waiting) = (bulkhead.in_flight(), bulkhead.waiting());
                (key.clone(), bulkhead, in_flight, waiting)
            })
            .filter(|&(_, _, in_flight, waiting)| in_flight + waiting > 0)
            .collect();
        busy.sort_by_key(|&(_, _, in_flight, waiting)| std::cmp::Reverse((in_flight, waiting)));
        busy.truncate(count);
        busy.into_iter()
            .map(|(key, bulkhead, ..)| (key, bulkhead))
            .collect()
    }
}
