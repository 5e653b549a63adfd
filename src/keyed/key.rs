//! A key of a keyed bulkhead: its bulkhead, made from the per-key
//! configuration with the key's own limit, and what its callers that wait
//! for the ceiling share.

use crate::bulkhead::{Bulkhead, History};
use crate::config::Config;
use crate::keyed::turns::{weight, KeyTurn};
use crate::slots::MAX_SLOTS;
use crate::sync::{fence, Arc, AtomicBool, AtomicUsize, Mutex, Ordering};
use std::collections::HashSet;

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

/// One key's bulkhead, in its shard. A caller taking a slot of it from the
/// map holds the shard's read lock; one that waits for a slot holds an
/// `Arc` of its line; a permit shares its bulkhead. What every call touches
/// is here, beside the key, rather than behind a pointer.
pub(crate) struct Entry {
    pub(crate) bulkhead: Bulkhead,
    /// Used since a sweep last found it idle: it is passed over once more
    /// (a second chance, which makes the sweep evict the least recently
    /// used keys first, roughly).
    pub(super) used: AtomicBool,
    pub(crate) line: Arc<KeyLine>,
}

impl Entry {
    /// Marks the key used: a hint for the sweep, written only when it
    /// changes, so that a busy key's entry is not written on every call.
    #[inline(always)]
    pub(super) fn mark_used(&self) {
        // Relaxed: a hint to the order of eviction.
        if !self.used.load(Ordering::Relaxed) {
            self.used.store(true, Ordering::Relaxed);
        }
    }

    /// Whether nobody holds or is taking a slot of this key, but for permits
    /// that were leaked, or that outlived their hold. Exact under the
    /// shard's write lock (nobody can find the key then); under its read
    /// lock, a hint.
    pub(super) fn is_idle(&self) -> bool {
        // No caller waits for a slot of it (holding its line's `Arc`).
        if Arc::strong_count(&self.line) > 1 {
            return false;
        }
        // Whatever the last caller to hold the line did with the key's slots
        // happens before this: that `Arc`'s drop released it.
        fence(Ordering::Acquire);
        // No permit shares its bulkhead, or every slot held is past its
        // deadline: held by a permit that was leaked, however often the key
        // was called since. Its eviction resets its bulkhead.
        self.bulkhead.is_unshared() || self.bulkhead.holds_nothing_unexpired()
    }
}

/// What a key's callers that wait share: its place in the ceiling's line.
pub(crate) struct KeyLine {
    /// How many of the ceiling's slots it is promised.
    pub(crate) guarantee: usize,
    /// How many of its callers hold its slot and wait for the ceiling's.
    pub(crate) waiting_for_ceiling: AtomicUsize,
    /// How many of its slots are held by permits that hold a slot of the
    /// ceiling too, each permit counting itself in and out. An `Arc` of its
    /// own: a leaked permit must not pin the key, as the line's `Arc` does.
    /// None without a ceiling.
    pub(crate) held_with_ceiling: Option<Arc<AtomicUsize>>,
    /// Its place in turn at the ceiling, and its weight there (see
    /// `turns`).
    pub(crate) turn: KeyTurn,
    pub(crate) weight: u64,
}

impl KeyLine {
    /// How many of the ceiling's slots the key of `bulkhead` holds: its
    /// permits that hold one. Not its slots held less its callers waiting
    /// for the ceiling's: a caller handed its key's slot, on its way to the
    /// ceiling's line, would count as holding one. (A hint: a leaked permit
    /// is counted for good, bounded by the key's slots held less its callers
    /// in line: once its slot is reclaimed it counts no more, but while
    /// callers of its key are on their way to the line.)
    pub(crate) fn ceiling_held(&self, bulkhead: &Bulkhead) -> usize {
        // Relaxed, both: hints to the order of the ceiling's line.
        let held = bulkhead
            .in_flight()
            .saturating_sub(self.waiting_for_ceiling.load(Ordering::Relaxed));
        self.held_with_ceiling
            .as_ref()
            .map_or(0, |count| count.load(Ordering::Relaxed))
            .min(held)
    }
}

/// Makes each key's bulkhead and line.
pub(crate) struct KeyMaker<K> {
    /// Every key's configuration but for its limit (and a reported key's
    /// name): one for all of them.
    template: std::sync::Arc<Config>,
    /// The most slots a key may have: the ceiling's limit (a key can never
    /// use more), or the most any bulkhead has.
    max_limit: usize,
    /// Whether there is a ceiling, whose slots the keys' permits count.
    with_ceiling: bool,
    functions: KeyFunctions<K>,
    /// The labels of the keys that reported metrics so far.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    reported: Mutex<HashSet<String>>,
}

/// The functions of a key that a [`KeyedConfig`](crate::keyed::KeyedConfig)
/// may set.
pub(crate) struct KeyFunctions<K> {
    pub(crate) limit_of: Option<LimitOf<K>>,
    pub(crate) guarantee_of: Option<LimitOf<K>>,
    pub(crate) weight_of: Option<LimitOf<K>>,
    /// Without feature `metrics`, nothing reports.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) label_of: Option<LabelOf<K>>,
}

impl<K> Default for KeyFunctions<K> {
    fn default() -> Self {
        Self {
            limit_of: None,
            guarantee_of: None,
            weight_of: None,
            label_of: None,
        }
    }
}

impl<K> KeyMaker<K> {
    /// Keys of `template` and `functions`, under a ceiling of
    /// `ceiling_limit` slots if there is one.
    pub(crate) fn new(
        template: Config,
        ceiling_limit: Option<usize>,
        functions: KeyFunctions<K>,
    ) -> Self {
        Self {
            template: std::sync::Arc::new(template),
            max_limit: ceiling_limit.unwrap_or(MAX_SLOTS).clamp(1, MAX_SLOTS),
            with_ceiling: ceiling_limit.is_some(),
            functions,
            reported: Mutex::default(),
        }
    }

    /// The keys' manual clock, if they have one (in tests).
    pub(crate) fn manual_clock(&self) -> Option<crate::bulkhead::ManualClock> {
        self.template.clock.clone()
    }

    pub(crate) fn entry(&self, key: &K) -> Entry {
        Entry {
            bulkhead: self.bulkhead_for(key),
            // Used: a key just made has its first call coming.
            used: AtomicBool::new(true),
            line: Arc::new(KeyLine {
                guarantee: self.functions.guarantee_of.as_ref().map_or(0, |of| of(key)),
                waiting_for_ceiling: AtomicUsize::new(0),
                held_with_ceiling: self.with_ceiling.then(|| Arc::new(AtomicUsize::new(0))),
                turn: KeyTurn::default(),
                weight: weight(self.functions.weight_of.as_ref().map_or(1, |of| of(key))),
            }),
        }
    }

    /// A bulkhead for `key`: the template, with the key's own limit if a
    /// function gives one (held to 1 ..= `max_limit`; an adaptive limit's
    /// bounds are kept within it). The template was validated when the
    /// keyed bulkhead was built, and a limit in that range keeps it valid.
    fn bulkhead_for(&self, key: &K) -> Bulkhead {
        let limit = match &self.functions.limit_of {
            Some(limit_of) => limit_of(key),
            None => self.template.limit,
        }
        .clamp(1, self.max_limit);
        // No series per key unless the key is one to report: their number
        // is unbounded. (The ceiling, a plain bulkhead, reports as any does;
        // per-key figures are in the keyed bulkhead's status.)
        #[cfg(feature = "metrics")]
        if let Some(label) = self.label_to_report(key) {
            let mut config = Config::clone(&self.template);
            config.name = Some(match &config.name {
                Some(name) => format!("{name}/{label}").into(),
                None => label.into(),
            });
            return self.make(std::sync::Arc::new(config), limit);
        }
        #[cfg(feature = "metrics")]
        return metrics::with_local_recorder(&metrics::NoopRecorder, || {
            self.make(self.template.clone(), limit)
        });
        #[cfg(not(feature = "metrics"))]
        self.make(self.template.clone(), limit)
    }

    /// A key's bulkhead, keeping no history of minutes: a key reports its
    /// totals alone, and the history would grow each busy key by about
    /// 270 KiB a day.
    fn make(&self, config: std::sync::Arc<Config>, limit: usize) -> Bulkhead {
        Bulkhead::try_new_keeping(config, limit, History::None)
            .expect("the template was validated when the keyed bulkhead was built")
    }

    /// `key`'s label, if the configuration names it one to report and no
    /// more than `MAX_REPORTED_KEYS` labels have reported (this one among
    /// them).
    #[cfg(feature = "metrics")]
    fn label_to_report(&self, key: &K) -> Option<String> {
        let label = self.functions.label_of.as_ref()?(key)?;
        let mut reported = crate::sync::lock(&self.reported);
        if !reported.contains(&label) && reported.len() >= MAX_REPORTED_KEYS {
            return None;
        }
        reported.insert(label.clone());
        Some(label)
    }
}
