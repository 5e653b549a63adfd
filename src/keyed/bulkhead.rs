//! The keyed bulkhead: a bulkhead per key, and an optional ceiling for all
//! keys together.

use crate::bulkhead::{Acquire, Bulkhead, Granted, Permit};
use crate::config::{Config, ConfigError};
use crate::error::{ServiceSaturated, ShedReason};
use crate::keyed::key::{KeyFunctions, KeyLine, KeyMaker};
use crate::keyed::keys::Keys;
use crate::keyed::shards::shard_count;
use crate::keyed::turns::{Turn, Turns};
use crate::keyed::KeyedStatus;
use crate::slots::Claim;
use crate::sync::{Arc, AtomicUsize, Ordering};
use std::fmt;
use std::hash::Hash;
use std::pin::Pin;
use std::time::Duration;

/// How a [`KeyedBulkhead`] is built: the configuration of each key's
/// bulkhead, and optionally a ceiling for all keys together and a limit per
/// key.
///
/// ```
/// use std::time::Duration;
/// use tower_inflight::keyed::KeyedConfig;
/// use tower_inflight::Config;
///
/// // Each tenant: 4 calls at once, waiting up to 50 ms; all tenants
/// // together: 16; premium tenants: 8 each; at most 10,000 tenants held.
/// let config = KeyedConfig::new(Config::new(4, Duration::from_secs(30)).wait(Duration::from_millis(50)))
///     .ceiling(Config::new(16, Duration::from_secs(30)).name("tenants"))
///     .limit_per_key(|tenant: &String| if tenant.starts_with("premium-") { 8 } else { 4 })
///     .max_keys(10_000);
/// # let _ = tower_inflight::keyed::KeyedBulkhead::new(config);
/// ```
pub struct KeyedConfig<K> {
    per_key: Config,
    ceiling: Option<Config>,
    functions: KeyFunctions<K>,
    max_keys: usize,
}

impl<K> KeyedConfig<K> {
    /// Each key's bulkhead is built from `per_key` (its `limit`,
    /// `reclaim_after`, `wait`, ...). At most 1,000 keys are held at once
    /// unless [`max_keys`](Self::max_keys) says otherwise. A keyed bulkhead
    /// reserves no bytes: a `max_bytes` here or on the ceiling is refused
    /// at construction.
    pub fn new(per_key: Config) -> Self {
        Self {
            per_key,
            ceiling: None,
            functions: KeyFunctions::default(),
            max_keys: 1_000,
        }
    }

    /// A ceiling for all keys together: a call takes its key's slot and one
    /// of the ceiling's, both or neither. Its line is ordered in turns
    /// across keys (its `queue_order` is the keyed bulkhead's own, and one
    /// set on `ceiling` is refused at construction, naming
    /// `ceiling.queue_order`).
    ///
    /// In the ceiling's metrics, its callers waiting are counted by
    /// priority as `-1` (a key below its share) and `0` (in turn).
    ///
    /// A caller holds its key's slot while it waits for the ceiling's, so
    /// the ceiling's `wait` (with a cluster ceiling, plus its `timeout`)
    /// must be shorter than the per-key `reclaim_after`; construction
    /// refuses it otherwise, naming `ceiling.wait`. A key's slot is dated
    /// from when it was taken, so that wait comes out of its
    /// `reclaim_after`: set that above the ceiling's wait plus your longest
    /// call.
    pub fn ceiling(mut self, ceiling: Config) -> Self {
        self.ceiling = Some(ceiling);
        self
    }

    /// Each key's own limit, in place of the `limit` of the per-key
    /// configuration, held to 1 ..= the ceiling's limit (a key can never
    /// use more), or 1 ..= 1,048,576 without a ceiling. Called once, when
    /// the key's bulkhead is made, outside the keyed bulkhead's locks (so
    /// it may look at the keyed bulkhead). A key takes 16 bytes a slot
    /// beside its 1.2 KiB (and, from a limit of 8, about 50 bytes a slot in
    /// refusal lanes, up to 3 KiB): keep `max_keys` times the largest limit
    /// in mind.
    pub fn limit_per_key(mut self, limit_of: impl Fn(&K) -> usize + Send + Sync + 'static) -> Self {
        self.functions.limit_of = Some(std::sync::Arc::new(limit_of));
        self
    }

    /// How many of the ceiling's slots each key is promised. A caller that
    /// comes to the ceiling's line while its key holds fewer than its share
    /// (its calls holding a slot of the ceiling, and its callers already in
    /// line; not its callers on their way there with its key's slot, though
    /// a permit of its that was leaked counts among its calls while they
    /// are) gets the next slot freed, before every caller of a key that did
    /// not (nothing running is preempted). Whether a key is below its share
    /// is judged as its caller comes to the line: a caller that came while
    /// its key was at its share takes its turn like any, even if its key's
    /// calls end meanwhile. A caller that goes first takes none of its
    /// key's turns: what a key was promised does not count against what it
    /// borrows. While others are idle, any key may use more than its share,
    /// up to its own limit. Called once, when the key's bulkhead is made.
    /// Keep the shares' sum within the ceiling: only then can each be met.
    ///
    /// The count is read without a lock, so callers of one key coming to
    /// the line on several threads at once, as another's call is admitted,
    /// may find it one off. The ceiling's own shedding (its `max_waiting`,
    /// a saturation signal) refuses a caller below its share as it does
    /// any caller.
    pub fn guarantee_per_key(
        mut self,
        guarantee_of: impl Fn(&K) -> usize + Send + Sync + 'static,
    ) -> Self {
        self.functions.guarantee_of = Some(std::sync::Arc::new(guarantee_of));
        self
    }

    /// Each key's weight in the ceiling's line (held to 1 ..= 64; 1 unless
    /// set): while keys have callers waiting for the ceiling, a key of
    /// weight 2 is given two freed slots for each one a key of weight 1 is
    /// given. Called once, when the key's bulkhead is made, outside the
    /// keyed bulkhead's locks.
    pub fn weight_per_key(
        mut self,
        weight_of: impl Fn(&K) -> usize + Send + Sync + 'static,
    ) -> Self {
        self.functions.weight_of = Some(std::sync::Arc::new(weight_of));
        self
    }

    /// Metrics for the keys `label_of` names (with feature `metrics`): a
    /// key given a label reports as a bulkhead named `{name}/{label}` (the
    /// per-key configuration's name, if it has one, then the label), with
    /// every series a bulkhead has. Keys given no label report nothing, as
    /// every key does without this. At most 64 labels ever report (a bound
    /// on the series, whatever the keys): past that, a new label reports
    /// nothing. Called once, when the key's bulkhead is made.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_inflight::keyed::KeyedConfig;
    /// use tower_inflight::Config;
    ///
    /// // Series for the three largest tenants only, as `tenants/acme`, ...
    /// let config = KeyedConfig::new(Config::new(4, Duration::from_secs(30)).name("tenants"))
    ///     .metrics_per_key(|tenant: &String| {
    ///         ["acme", "globex", "initech"].contains(&tenant.as_str()).then(|| tenant.clone())
    ///     });
    /// # let _ = config;
    /// ```
    pub fn metrics_per_key(
        mut self,
        label_of: impl Fn(&K) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.functions.label_of = Some(std::sync::Arc::new(label_of));
        self
    }

    /// How many keys are held at once (a key of a small limit takes about
    /// 1.2 KiB, so 1,000 keys take about 1.2 MB). A key with nothing in flight and nobody waiting
    /// is evicted to make room for a new one (roughly the least recently
    /// used first); a key with slots held never is, until they could be
    /// reclaimed. With `max_keys` keys held and none of them idle, a call
    /// with a new key is shed with [`ShedReason::TooManyKeys`], also while
    /// the ceiling is full. A new key looks at no more than 128 keys for one
    /// to evict, no key twice, going on from where the last search stopped
    /// (a caller that raced others to make the same key may look a second
    /// time), so with 128 or more busy at once, a new key may be shed while
    /// an idle key lies further on. For about a millisecond after a new key
    /// is shed so (having looked at 128 busy keys, with more held), a new
    /// key looks at 8, so that a flood of new keys while every key is busy
    /// costs little each; the searches go on from where each stopped, over
    /// every map in turn, so an idle key is found by a later one.
    ///
    /// The keys are spread over up to one map for every 64 of `max_keys`
    /// (and up to four for each core), each behind its own lock, so that
    /// calls of different keys on different cores rarely write one lock's
    /// word. A search for room looks under the maps' read locks, and so
    /// holds up no call of an existing key.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    fn validate(&self) -> Result<(), ConfigError> {
        self.per_key.validate()?;
        // Every key's bulkhead would ask the one ceiling: a ceiling for all
        // keys together, which is the keyed ceiling's to have.
        if self.per_key.ceiling.is_some() {
            return Err(ConfigError::new(
                "cluster_ceiling",
                "is not supported per key: every key would share one set of leases; give the \
                 cluster ceiling to the keyed bulkhead's ceiling instead",
            ));
        }
        if let Some(ceiling) = &self.ceiling {
            ceiling.validate().map_err(ConfigError::of_ceiling)?;
            // The ceiling's line is ordered in turns across keys; an order
            // of its own would be overridden without a word.
            if !matches!(ceiling.queue_order, crate::QueueOrder::Fifo) {
                return Err(ConfigError::new(
                    "ceiling.queue_order",
                    "is the keyed bulkhead's own: its callers take turns across keys (leave it \
                     unset; order a key's own callers with the per-key queue_order)",
                ));
            }
            // A caller keeps its key's slot while it waits for the
            // ceiling's: the wait must end before the slot could be
            // reclaimed from under it.
            let longest = ceiling_hold(ceiling);
            if longest >= self.per_key.reclaim_after {
                return Err(ConfigError::new(
                    "ceiling.wait",
                    format!(
                        "{longest:?} (the ceiling's wait, with a cluster ceiling's round trip if \
                         any) must be shorter than the per-key reclaim_after ({:?}): a caller \
                         holds its key's slot while it waits for the ceiling's",
                        self.per_key.reclaim_after
                    ),
                ));
            }
        }
        // The keyed bulkhead and its layers reserve no bytes: a budget would
        // be accepted and never kept.
        for (field, config) in [
            ("max_bytes", Some(&self.per_key)),
            ("ceiling.max_bytes", self.ceiling.as_ref()),
        ] {
            if config.is_some_and(|config| config.max_bytes.is_some()) {
                return Err(ConfigError::new(
                    field,
                    "is not supported by a keyed bulkhead, which reserves no bytes: put a byte \
                     budget on a plain HttpConcurrencyLayer in front of it",
                ));
            }
        }
        if self.max_keys == 0 {
            return Err(ConfigError::new(
                "max_keys",
                "must be at least 1: a keyed bulkhead of no keys would shed every call",
            ));
        }
        Ok(())
    }
}

/// The longest a caller may wait for the ceiling's slot, holding its key's:
/// the ceiling's `wait`, and with a cluster ceiling the round trip of a
/// lease asked for at its end.
fn ceiling_hold(ceiling: &Config) -> Duration {
    let wait = ceiling.wait.unwrap_or_default();
    let first_ask = ceiling
        .ceiling
        .as_ref()
        .map_or(Duration::ZERO, |ceiling| ceiling.first_ask());
    wait.saturating_add(first_ask)
}

impl<K> fmt::Debug for KeyedConfig<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedConfig")
            .field("per_key", &self.per_key)
            .field("ceiling", &self.ceiling)
            .field("limit_per_key", &self.functions.limit_of.is_some())
            .field("max_keys", &self.max_keys)
            .finish()
    }
}

/// A bulkhead per key (a tenant, a route, a host), so that one key's burst
/// cannot take every slot, and optionally a ceiling for all keys together.
///
/// Every promise of a [`Bulkhead`] holds per key: leaked slots are reclaimed
/// after `reclaim_after`, a late release never frees another's slot, a
/// slot is free the instant it is released. Clones share the keys.
///
/// ```
/// use std::time::Duration;
/// use tower_inflight::keyed::{KeyedBulkhead, KeyedConfig};
/// use tower_inflight::{Config, ShedReason};
///
/// let tenants = KeyedBulkhead::new(
///     KeyedConfig::new(Config::new(2, Duration::from_secs(30)))
///         .ceiling(Config::new(3, Duration::from_secs(30))),
/// );
/// let a = (tenants.try_acquire(&"a").unwrap(), tenants.try_acquire(&"a").unwrap());
/// // Tenant a has its two: a third call of a's is shed, b's is not.
/// assert_eq!(tenants.try_acquire(&"a").unwrap_err().reason(), ShedReason::LimitReached);
/// let b = tenants.try_acquire(&"b").unwrap();
/// // The ceiling of three is full: c is shed though it holds nothing.
/// assert_eq!(tenants.try_acquire(&"c").unwrap_err().reason(), ShedReason::LimitReached);
/// drop(a);
/// assert!(tenants.try_acquire(&"c").is_ok());
/// # drop(b);
/// ```
pub struct KeyedBulkhead<K> {
    inner: Arc<Inner<K>>,
}

struct Inner<K> {
    keys: Keys<K>,
    ceiling: Option<Bulkhead>,
    /// The turns of the keys waiting for the ceiling.
    turns: Turns,
    /// For the sheds of new keys: the per-key configuration's name, limit
    /// and `retry_after`.
    per_key: Config,
    /// Whether a call goes by the future that may wait: the per-key
    /// configuration or the ceiling's has a `wait` budget, or the ceiling
    /// asks a cluster ceiling for a lease (a round trip, which a call that
    /// may not wait cannot make).
    may_wait: bool,
}

/// A key's slot of a [`KeyedBulkhead`], and the ceiling's slot if it has a
/// ceiling, held until dropped.
#[must_use = "the slots are released as soon as the permit is dropped"]
pub struct KeyedPermit {
    key: Permit,
    /// The ceiling's slot, and the key's count of its slots held with one of
    /// the ceiling's (see `KeyLine::ceiling_held`), this one counted while
    /// it lives. The key's permit shares its bulkhead, which keeps the key
    /// from eviction.
    ceiling: Option<(Permit, Arc<AtomicUsize>)>,
}

impl Drop for KeyedPermit {
    fn drop(&mut self) {
        // Before the slots go (the key's, then the ceiling's).
        if let Some((_, count)) = &self.ceiling {
            // Relaxed: as it was counted (see `with_ceiling`).
            count.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl<K: Hash + Eq + Clone> KeyedBulkhead<K> {
    /// Builds a keyed bulkhead.
    ///
    /// # Panics
    ///
    /// If the configuration is invalid; the message names the field. Use
    /// [`try_new`](Self::try_new) to get the error instead.
    #[track_caller]
    pub fn new(config: KeyedConfig<K>) -> Self {
        ConfigError::unwrap(Self::try_new(config))
    }

    /// Builds a keyed bulkhead, or says which field of the configuration is
    /// wrong.
    pub fn try_new(config: KeyedConfig<K>) -> Result<Self, ConfigError> {
        config.validate()?;
        // The ceiling's line is ordered by priority: a key below its share
        // first, then the keys' turns (see `turns`).
        let ceiling = config
            .ceiling
            .map(|ceiling| Bulkhead::try_new(ceiling.queue_order(crate::QueueOrder::PriorityFifo)))
            .transpose()?;
        Ok(Self {
            inner: Arc::new(Inner {
                keys: Keys::new(
                    KeyMaker::new(
                        config.per_key.clone(),
                        // A key can never hold more slots than the ceiling
                        // has. (The configured one: an adaptive ceiling's
                        // limit in force moves.)
                        ceiling
                            .as_ref()
                            .map(|ceiling| ceiling.shared().config().limit),
                        config.functions,
                    ),
                    config.max_keys,
                    shard_count(config.max_keys),
                ),
                may_wait: config.per_key.wait.is_some()
                    || ceiling
                        .as_ref()
                        .is_some_and(|ceiling| ceiling.shared().may_wait()),
                ceiling,
                turns: Turns::default(),
                per_key: config.per_key,
            }),
        })
    }

    /// Takes a slot of `key`'s and one of the ceiling's, both or neither;
    /// never waits.
    pub fn try_acquire(&self, key: &K) -> Result<KeyedPermit, ServiceSaturated> {
        // A full ceiling sheds before the key's slot is taken: under
        // overload, the cheapest refusal (and no idle key is evicted for a
        // new key the ceiling would refuse).
        // A new key with no room is shed for that all the same (nothing is
        // evicted for it): what a caller can mend is the keys it uses.
        if let Some(ceiling) = &self.inner.ceiling {
            if ceiling.is_saturated() {
                if !self.inner.keys.holds_or_has_room(key) {
                    return Err(self.too_many_keys());
                }
                return Err(ceiling.shed_now(ShedReason::LimitReached));
            }
        }
        // The key's slot is counted as admitted once the ceiling's is held
        // too: a call either refuses is not admitted by the other.
        let with_ceiling = self.inner.ceiling.is_some();
        let claimed = self.inner.keys.find(key, |entry| {
            let claim = entry.bulkhead.try_claim()?;
            let count = with_ceiling.then(|| entry.line.held_with_ceiling.clone());
            Ok((entry.bulkhead.clone(), claim, count.flatten()))
        });
        let (bulkhead, claim, count) = match claimed {
            Some(Ok(claimed)) => claimed,
            Some(Err(reason)) => return Err(self.key_shed(key, reason)),
            None => return Err(self.too_many_keys()),
        };
        let Some(ceiling) = &self.inner.ceiling else {
            return Ok(KeyedPermit::alone(bulkhead.admit(claim)));
        };
        // Given back if the ceiling refuses (or a hook of its panics).
        let key = ClaimedKey {
            claimed: Some((bulkhead, claim)),
        };
        let ceiling = ceiling.try_acquire()?;
        Ok(KeyedPermit::with_ceiling(key.admit(), ceiling, count))
    }

    /// How a layer's call starts: admitted at once, shed, or left to wait
    /// (only with a `wait` budget, or a cluster ceiling to ask for a lease).
    /// Before waiting,
    /// a refusal for want of a slot is not recorded, since the wait records
    /// what comes of the call, and a key's slot taken is kept for the wait
    /// for the ceiling's.
    pub(crate) fn start(&self, key: &K) -> Start {
        if !self.inner.may_wait {
            return match self.try_acquire(key) {
                Ok(permit) => Start::Admitted(permit),
                Err(shed) => Start::Shed(shed),
            };
        }
        let ceiling = self.inner.ceiling.as_ref();
        if ceiling.is_some_and(Bulkhead::is_saturated) {
            return Start::Wait(None);
        }
        // The key's slot is claimed under the map's lock and made a permit
        // (counted, its event heard) outside it: a hook may look at this
        // keyed bulkhead.
        let found = self.inner.keys.find(key, |entry| {
            let claim = entry.bulkhead.try_claim().ok()?;
            Some((entry.bulkhead.clone(), claim, entry.line.clone()))
        });
        let (bulkhead, claim, line) = match found {
            Some(Some(found)) => found,
            Some(None) => return Start::Wait(None),
            None => return Start::Shed(self.too_many_keys()),
        };
        let Some(ceiling) = ceiling else {
            return Start::Admitted(KeyedPermit::alone(bulkhead.admit(claim)));
        };
        // Counted as admitted by the key once the ceiling's slot is held.
        let key = ClaimedKey {
            claimed: Some((bulkhead, claim)),
        };
        match ceiling.try_acquire_unrecorded() {
            Some(ceiling) => Start::Admitted(KeyedPermit::with_ceiling(
                key.admit(),
                ceiling,
                line.held_with_ceiling.clone(),
            )),
            None => Start::Wait(Some(key.hold(line))),
        }
    }

    /// Takes a slot of `key`'s, waiting for one up to the `wait` budget of
    /// the per-key configuration, then one of the ceiling's, waiting up to
    /// the ceiling's budget; if the ceiling's does not come, the key's is
    /// given back.
    ///
    /// In the ceiling's line, a key's callers take turns with the other
    /// keys', weighted by [`KeyedConfig::weight_per_key`], and a key below
    /// its guaranteed share when its caller comes to the line goes before
    /// all. So a key with a thousand callers waiting and a key with one are
    /// served alternately.
    ///
    /// Each bulkhead records its own part: the key's wait for its slot ends
    /// admitted (its `Waited` event) once the key grants it, and the call is
    /// counted admitted by both once both slots are held; a call the ceiling
    /// then sheds is recorded as shed by the ceiling alone, and its key's
    /// slot goes back uncounted.
    pub async fn acquire(&self, key: &K) -> Result<KeyedPermit, ServiceSaturated> {
        self.acquire_after(key, None).await
    }

    /// [`acquire`](Self::acquire) for a caller that may hold its key's slot
    /// already, from [`start`](Self::start).
    pub(crate) async fn acquire_after(
        &self,
        key: &K,
        held: Option<HeldKey>,
    ) -> Result<KeyedPermit, ServiceSaturated> {
        let mut held = match held {
            Some(held) => held,
            None => {
                // The line's `Arc` keeps the key from eviction until its
                // slot is taken.
                let (bulkhead, line) = self
                    .inner
                    .keys
                    .find(key, |entry| (entry.bulkhead.clone(), entry.line.clone()))
                    .ok_or_else(|| self.too_many_keys())?;
                // Granted, not yet admitted: the key counts the call once
                // the ceiling's slot is held too.
                let granted = granted(std::pin::pin!(bulkhead.acquire()))
                    .await
                    .map_err(|shed| self.by_key(shed))?;
                HeldKey {
                    granted,
                    bulkhead,
                    line,
                }
            }
        };
        let Some(ceiling) = &self.inner.ceiling else {
            let key = held.granted.into_permit(0);
            return key
                .map(KeyedPermit::alone)
                .map_err(|shed| self.by_key(shed));
        };
        // The ceiling's slot outlives the caller's turn, so that a caller
        // who gives up (or is shed below) leaves its place in turn before a
        // slot it was handed goes on to the line's head.
        let mut ceiling_slot;
        let renewed;
        {
            let waiting =
                WaitingForCeiling::enter(&held.line, &held.bulkhead, &self.inner.turns, ceiling);
            let turn = &waiting.turn;
            let acquire = ceiling.acquire_in_place(turn.priority(), turn.place, turn.movable());
            let mut in_line = std::pin::pin!(InCeilingLine { waiting, acquire });
            ceiling_slot = granted(in_line.as_mut().project().acquire).await?;
            // Both still hold their slots, or neither is counted: a slot
            // taken up late (a busy runtime) may have been reclaimed
            // meanwhile, and its call then claims a fresh one, or is shed by
            // that bulkhead. Served only then: a caller shed here gives its
            // turn back.
            renewed = held
                .granted
                .renew()
                .map_err(|shed| self.by_key(shed))
                .and_then(|()| ceiling_slot.renew());
            in_line.as_mut().project().waiting.served = renewed.is_ok();
        }
        renewed?;
        // The key's permit is made before the line's `Arc`, which kept the
        // key from eviction, goes.
        let key = held
            .granted
            .into_renewed_permit(0)
            .map_err(|shed| self.by_key(shed))?;
        let ceiling = ceiling_slot.into_renewed_permit(0)?;
        let count = held.line.held_with_ceiling.clone();
        Ok(KeyedPermit::with_ceiling(key, ceiling, count))
    }

    /// `key`'s refusal for `reason`, recorded by its bulkhead (found again:
    /// the refusal came out of the map's lock as its reason alone).
    #[cold]
    fn key_shed(&self, key: &K, reason: ShedReason) -> ServiceSaturated {
        // Recorded outside the map's lock: a hook may look at this keyed
        // bulkhead.
        self.inner
            .keys
            .get(key, |entry| entry.bulkhead.clone())
            .map(|bulkhead| self.by_key(bulkhead.shed_now(reason)))
            // Evicted meanwhile: its bulkhead is gone, and so is its record.
            .unwrap_or_else(|| self.by_key(self.unrecorded(reason)))
    }

    /// A refusal for `reason` that no bulkhead records, named as the
    /// per-key configuration names its keys.
    fn unrecorded(&self, reason: ShedReason) -> ServiceSaturated {
        let per_key = &self.inner.per_key;
        let (name, retry_after) = (per_key.name.clone(), per_key.retry_after);
        ServiceSaturated::new(name, per_key.limit, reason, retry_after)
    }

    /// `shed`, made by a key's own bulkhead: marked so, and named after
    /// the ceiling if the per-key configuration has no name.
    fn by_key(&self, shed: ServiceSaturated) -> ServiceSaturated {
        let ceiling = self.inner.ceiling.as_ref();
        shed.by_key(ceiling.and_then(|ceiling| ceiling.config().name.as_ref()))
    }

    #[cold]
    fn too_many_keys(&self) -> ServiceSaturated {
        // Recorded by the ceiling (counts, event, metrics, tracing), if
        // there is one: no key has a bulkhead to record it.
        match &self.inner.ceiling {
            Some(ceiling) => ceiling.shed_now(ShedReason::TooManyKeys),
            // The keyed bulkhead's own refusal, not a key's.
            None => self.unrecorded(ShedReason::TooManyKeys),
        }
    }

    /// The ceiling for all keys together, if there is one. A caller that
    /// acquires it directly, not through a key, goes to its line by its own
    /// priority: behind the keys below their share, ahead of every key
    /// taking turns.
    pub fn ceiling(&self) -> Option<&Bulkhead> {
        self.inner.ceiling.as_ref()
    }

    /// How many keys are held now (each with its bulkhead).
    pub fn keys(&self) -> usize {
        self.inner.keys.len()
    }

    /// The slots `key` holds now (0 for a key not held), without making it
    /// or looking at any other key.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_inflight::keyed::{KeyedBulkhead, KeyedConfig};
    /// use tower_inflight::Config;
    ///
    /// let keyed = KeyedBulkhead::new(KeyedConfig::new(Config::new(4, Duration::from_secs(30))));
    /// let _permit = keyed.try_acquire(&"tenant-a").unwrap();
    /// assert_eq!(keyed.in_flight(&"tenant-a"), 1);
    /// assert_eq!(keyed.in_flight(&"tenant-b"), 0);
    /// assert_eq!(keyed.keys(), 1);
    /// ```
    pub fn in_flight(&self, key: &K) -> usize {
        self.inner
            .keys
            .get(key, |entry| entry.bulkhead.in_flight())
            .unwrap_or(0)
    }

    /// A snapshot: the keys held, evicted and refused, and the busiest keys
    /// (at most `busiest` of them, those with calls in flight or waiting,
    /// the most first).
    pub fn status(&self, busiest: usize) -> KeyedStatus<K> {
        let keys = &self.inner.keys;
        KeyedStatus {
            keys: keys.len(),
            evicted: keys.evicted(),
            refused_new_keys: keys.refused(),
            ceiling: self.inner.ceiling.as_ref().map(Bulkhead::status),
            busiest: keys.busiest(busiest),
        }
    }
}

impl<K> Clone for KeyedBulkhead<K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<K> fmt::Debug for KeyedBulkhead<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedBulkhead")
            .field("per_key", &self.inner.per_key)
            .field("ceiling", &self.inner.ceiling)
            .finish_non_exhaustive()
    }
}

/// A key's slot claimed, not yet counted as admitted: given back if the
/// call goes no further (the ceiling refused, or a hook panicked).
struct ClaimedKey {
    /// Both taken by `admit`.
    claimed: Option<(Bulkhead, Claim)>,
}

impl ClaimedKey {
    #[inline(always)]
    fn admit(mut self) -> Permit {
        let (bulkhead, claim) = self.claimed.take().expect("admitted once");
        bulkhead.admit(claim)
    }

    /// Kept for a wait for the ceiling's slot, still not counted.
    fn hold(mut self, line: Arc<KeyLine>) -> HeldKey {
        let (bulkhead, claim) = self.claimed.take().expect("held once");
        HeldKey {
            granted: bulkhead.grant(claim),
            bulkhead,
            line,
        }
    }
}

impl Drop for ClaimedKey {
    fn drop(&mut self) {
        if let Some((bulkhead, claim)) = self.claimed.take() {
            bulkhead.give_back(&claim);
        }
    }
}

/// How a layer's call starts, from [`KeyedBulkhead::start`].
pub(crate) enum Start {
    Admitted(KeyedPermit),
    /// Waiting cannot mend it, or the configuration has no `wait` budget.
    Shed(ServiceSaturated),
    /// Wait for the key's slot (`None`) and the ceiling's, or for the
    /// ceiling's alone, holding the key's.
    Wait(Option<HeldKey>),
}

/// A key's slot held by a caller that waits for the ceiling's, with what
/// it needs of the key meanwhile (its line's `Arc` keeps the key from
/// eviction).
pub(crate) struct HeldKey {
    /// Counted as admitted once the ceiling's slot is held; given back if
    /// it never is.
    granted: Granted,
    bulkhead: Bulkhead,
    line: Arc<KeyLine>,
}

/// The slots `acquire` waits for, granted but not yet made a permit.
async fn granted(mut acquire: Pin<&mut Acquire>) -> Result<Granted, ServiceSaturated> {
    std::future::poll_fn(|cx| acquire.as_mut().poll_granted(cx)).await
}

pin_project_lite::pin_project! {
    /// A caller of a key waiting for the ceiling's slot. Its turn is left
    /// (given to its key's next caller in line, if it was not served) before
    /// the wait is dropped (passing on a slot handed to it but not taken):
    /// fields drop in order.
    struct InCeilingLine<'a> {
        waiting: WaitingForCeiling<'a>,
        #[pin]
        acquire: Acquire,
    }
}

/// A caller of a key in the ceiling's line, with its turn there: counted
/// among its key's waiting callers while it waits.
struct WaitingForCeiling<'a> {
    line: &'a KeyLine,
    turns: &'a Turns,
    ceiling: &'a Bulkhead,
    turn: Turn,
    served: bool,
}

impl<'a> WaitingForCeiling<'a> {
    fn enter(
        line: &'a KeyLine,
        bulkhead: &Bulkhead,
        turns: &'a Turns,
        ceiling: &'a Bulkhead,
    ) -> Self {
        // Relaxed: a hint to the order of the line; a race between two
        // callers of one key only swaps their turns.
        let place = line.waiting_for_ceiling.fetch_add(1, Ordering::Relaxed);
        // Below its share: ahead of every key at or past its own.
        let below_share = line.ceiling_held(bulkhead).saturating_add(place) < line.guarantee;
        let turn = turns.enter(&line.turn, line.weight, below_share);
        Self {
            line,
            turns,
            ceiling,
            turn,
            served: false,
        }
    }
}

impl Drop for WaitingForCeiling<'_> {
    fn drop(&mut self) {
        self.turns
            .leave(&self.line.turn, &self.turn, self.served, self.ceiling);
        self.line
            .waiting_for_ceiling
            .fetch_sub(1, Ordering::Relaxed);
    }
}

impl KeyedPermit {
    /// Tells the key's adaptive limit, and the ceiling's, how the call
    /// went: as [`Permit::record`].
    pub fn record(&mut self, outcome: crate::adaptive::Outcome) {
        self.each(|permit| permit.record(outcome));
    }

    /// As [`Permit::ignore_unless_recorded`], for both slots.
    pub(crate) fn ignore_unless_recorded(&mut self) {
        self.each(Permit::ignore_unless_recorded);
    }

    /// As [`Permit::record_error`], for both slots.
    #[cfg(feature = "http")]
    pub(crate) fn record_error(&mut self, error: &dyn std::any::Any) {
        self.each(|permit| permit.record_error(error));
    }

    /// As [`Permit::record_result`], for both slots.
    pub(crate) fn record_result<T>(&mut self, result: Result<&T, &crate::BoxError>) {
        self.each(|permit| permit.record_result(result));
    }

    /// Does `to_each` to the key's permit, then to the ceiling's.
    fn each(&mut self, mut to_each: impl FnMut(&mut Permit)) {
        to_each(&mut self.key);
        if let Some((ceiling, _)) = &mut self.ceiling {
            to_each(ceiling);
        }
    }

    /// A key's slot, of a keyed bulkhead with no ceiling.
    fn alone(key: Permit) -> Self {
        Self { key, ceiling: None }
    }

    /// Counted among the key's slots held with a slot of the ceiling, by
    /// which a caller of the key coming to the ceiling's line finds whether
    /// its key is below its guaranteed share.
    fn with_ceiling(key: Permit, ceiling: Permit, count: Option<Arc<AtomicUsize>>) -> Self {
        let count = count.expect("a key of a keyed bulkhead with a ceiling has a count");
        // Relaxed: a count read as a hint to the order of the ceiling's line.
        count.fetch_add(1, Ordering::Relaxed);
        Self {
            key,
            ceiling: Some((ceiling, count)),
        }
    }

    /// The key's slot.
    pub fn key_permit(&self) -> &Permit {
        &self.key
    }

    /// The ceiling's slot, if the keyed bulkhead has a ceiling.
    pub fn ceiling_permit(&self) -> Option<&Permit> {
        self.ceiling.as_ref().map(|(ceiling, _)| ceiling)
    }
}

impl fmt::Debug for KeyedPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedPermit")
            .field("key", &self.key)
            .field("ceiling", &self.ceiling_permit())
            .finish()
    }
}
