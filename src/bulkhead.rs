//! The bulkhead: the slot table, the waiter queue and the queries on them.

use crate::acquire::Acquire;
use crate::clock::Clock;
use crate::config::{Config, ConfigError};
use crate::error::{ServiceSaturated, ShedReason};
use crate::permit::Permit;
use crate::slots::{Claim, SlotTable};
use crate::sync::{Arc, Ordering};
use crate::waiters::Waiters;
use std::fmt;

/// A cap on how many calls are in flight at once, shared by every clone.
///
/// A bulkhead is a table of `limit` slots. A call takes a slot (a [`Permit`])
/// before it starts and gives it back when the permit is dropped; when every
/// slot is held, the call is refused with [`ServiceSaturated`] instead of
/// being started. A slot whose holder vanished without giving it back (a
/// leaked future, a forgotten permit) counts as free again once it has been
/// held for `reclaim_after`.
///
/// It needs neither tower nor a background task: [`ConcurrencyLayer`]
/// wraps one around a service, and plain async code can use it directly.
///
/// [`ConcurrencyLayer`]: crate::ConcurrencyLayer
///
/// ```
/// use std::time::Duration;
/// use tower_inflight::{Bulkhead, Config};
///
/// let bulkhead = Bulkhead::new(Config::new(2, Duration::from_secs(30)));
/// let first = bulkhead.try_acquire().unwrap();
/// let _second = bulkhead.try_acquire().unwrap();
/// assert!(bulkhead.is_saturated());
/// assert!(bulkhead.try_acquire().is_err()); // shed at once, nothing started
///
/// drop(first); // no cooldown: the slot is free the instant it is released
/// assert_eq!(bulkhead.in_flight(), 1);
/// assert!(bulkhead.try_acquire().is_ok());
/// ```
#[derive(Clone)]
pub struct Bulkhead {
    shared: Arc<Shared>,
}

pub(crate) struct Shared {
    slots: SlotTable,
    clock: Clock,
    waiters: Waiters,
    config: Config,
}

impl Bulkhead {
    /// Builds a bulkhead.
    ///
    /// # Panics
    ///
    /// If the configuration is invalid; the message names the field. Use
    /// [`try_new`](Self::try_new) to get the error instead.
    #[track_caller]
    pub fn new(config: Config) -> Self {
        Self::try_new(config).unwrap_or_else(|error| panic!("{error}"))
    }

    /// Builds a bulkhead, or says which field of the configuration is wrong.
    pub fn try_new(config: Config) -> Result<Self, ConfigError> {
        config.validate()?;
        let clock = match &config.clock {
            Some(manual) => Clock::Manual(manual.clone()),
            None => Clock::coarse(),
        };
        let shared = Shared {
            slots: SlotTable::new(
                config.limit,
                clock.hold(config.reclaim_after),
                config.max_bytes,
            ),
            clock,
            waiters: Waiters::default(),
            config,
        };
        Ok(Self {
            shared: Arc::new(shared),
        })
    }

    /// Takes a slot if one is free and nobody is waiting for one; never waits.
    ///
    /// A caller never overtakes callers parked by [`acquire`](Self::acquire):
    /// while any are parked, a free slot goes to them first.
    #[inline]
    pub fn try_acquire(&self) -> Result<Permit, ServiceSaturated> {
        match self.shared.try_claim() {
            Some(claim) => Ok(Permit::new(self.shared.clone(), claim)),
            None => Err(self.shared.saturated(ShedReason::LimitReached)),
        }
    }

    /// Takes a slot, waiting for one up to the configured `wait` budget.
    ///
    /// Without a `wait` budget this is [`try_acquire`](Self::try_acquire).
    /// A waiting caller holds no slot; freed slots go to waiting callers
    /// oldest first. Dropping the future gives up its place in line (and
    /// passes on a slot it was handed but had not yet taken).
    ///
    /// Waiting is timed by Tokio, so it needs a Tokio runtime with its time
    /// driver enabled.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_inflight::{Bulkhead, Config, ShedReason};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let bulkhead = Bulkhead::new(
    ///     Config::new(1, Duration::from_secs(30)).wait(Duration::from_millis(50)),
    /// );
    /// let held = bulkhead.try_acquire().unwrap();
    ///
    /// // Nothing frees the slot within 50 ms: shed once the budget is spent.
    /// let shed = bulkhead.acquire().await.unwrap_err();
    /// assert_eq!(shed.reason(), ShedReason::WaitExpired);
    ///
    /// // A slot freed while a caller waits goes straight to it.
    /// let waiter = tokio::spawn({
    ///     let bulkhead = bulkhead.clone();
    ///     async move { bulkhead.acquire().await.is_ok() }
    /// });
    /// tokio::time::sleep(Duration::from_millis(10)).await;
    /// drop(held);
    /// assert!(waiter.await.unwrap());
    /// # }
    /// ```
    pub fn acquire(&self) -> Acquire {
        Acquire::new(self.shared.clone())
    }

    /// Takes a slot and `bytes` of the byte budget together, or neither;
    /// never waits.
    ///
    /// When a slot is free but the bytes are not, the slot is given back and
    /// the call is shed with [`ShedReason::Bytes`]. Without a byte budget
    /// ([`Config::max_bytes`]) this is [`try_acquire`](Self::try_acquire).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_inflight::{Bulkhead, Config, ShedReason};
    ///
    /// let bulkhead = Bulkhead::new(Config::new(4, Duration::from_secs(30)).max_bytes(1 << 20));
    /// let first = bulkhead.try_acquire_bytes(600 << 10).unwrap();
    /// let shed = bulkhead.try_acquire_bytes(600 << 10).unwrap_err();
    /// assert_eq!(shed.reason(), ShedReason::Bytes);
    /// assert_eq!(bulkhead.in_flight(), 1); // the second call's slot was given back
    /// drop(first);
    /// assert!(bulkhead.try_acquire_bytes(600 << 10).is_ok());
    /// ```
    pub fn try_acquire_bytes(&self, bytes: u64) -> Result<Permit, ServiceSaturated> {
        let permit = self.try_acquire()?;
        self.shared.reserve_bytes(permit, bytes)
    }

    /// Takes a slot, waiting for one up to the `wait` budget, then `bytes` of
    /// the byte budget; if the bytes are not free, gives the slot back and
    /// sheds with [`ShedReason::Bytes`]. Bytes are never waited for.
    pub async fn acquire_bytes(&self, bytes: u64) -> Result<Permit, ServiceSaturated> {
        let permit = self.acquire().await?;
        self.shared.reserve_bytes(permit, bytes)
    }

    #[cfg(feature = "http")]
    pub(crate) fn reserve_bytes(
        &self,
        permit: Permit,
        bytes: u64,
    ) -> Result<Permit, ServiceSaturated> {
        self.shared.reserve_bytes(permit, bytes)
    }

    /// Bytes of the budget reserved now.
    pub fn bytes_reserved(&self) -> u64 {
        self.shared.slots.bytes_reserved()
    }

    /// The byte budget, if the configuration set one.
    pub fn max_bytes(&self) -> Option<u64> {
        self.shared.config.max_bytes
    }

    /// How many slots are held now (including slots held by leaked permits
    /// that `reclaim_after` has not reclaimed yet). A snapshot: it may change
    /// before you act on it.
    pub fn in_flight(&self) -> usize {
        self.shared.slots.held(self.shared.clock.now())
    }

    /// How many calls may be in flight at once.
    pub fn limit(&self) -> usize {
        self.shared.slots.len()
    }

    /// How many slots are free now.
    pub fn available(&self) -> usize {
        self.limit() - self.in_flight()
    }

    /// Whether every slot is held now, so that a call would be shed or wait.
    pub fn is_saturated(&self) -> bool {
        !self.shared.slots.any_free(self.shared.clock.now())
    }

    /// How many callers are parked waiting for a slot.
    pub fn waiting(&self) -> usize {
        self.shared.waiters.parked()
    }

    /// The bulkhead's name, if its configuration gave it one.
    pub fn name(&self) -> Option<&str> {
        self.shared.config.name.as_deref()
    }

    /// The configuration the bulkhead was built from.
    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    /// Frees every slot, as if each holder had released it, and forgets
    /// every reservation of the byte budget.
    ///
    /// This forgets that the slots were taken; it does not stop calls that
    /// are still running, so until they finish more than `limit` calls may be
    /// in flight. Their permits can no longer release anything: a permit
    /// taken after the reset is never freed by one taken before it, even
    /// within the same clock tick. Outside tests, it is for clearing slots
    /// lost to killed callers when `reclaim_after` is long.
    pub fn reset(&self) {
        self.shared.slots.reset();
        self.shared
            .waiters
            .after_release(&self.shared.slots, &self.shared.clock);
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }
}

impl Shared {
    /// The fast path: one load to see that nobody is parked, one clock read,
    /// one compare-and-exchange on a free slot.
    #[inline]
    pub(crate) fn try_claim(&self) -> Option<Claim> {
        let now = self.clock.now();
        if self.waiters.parked() == 0 {
            if let Some(claim) = self.slots.try_claim(now, Ordering::Relaxed) {
                return Some(claim);
            }
            if self.waiters.parked() == 0 {
                return None;
            }
        }
        self.waiters.claim_behind_parked(&self.slots, now)
    }

    #[inline]
    pub(crate) fn release(&self, claim: &Claim) {
        self.slots.release(claim);
        // The clock is read only if somebody is parked.
        self.waiters.after_release(&self.slots, &self.clock);
    }

    /// Adds `bytes` to `permit`, or drops it (handing its slot on) if the
    /// budget cannot take them.
    pub(crate) fn reserve_bytes(
        &self,
        permit: Permit,
        bytes: u64,
    ) -> Result<Permit, ServiceSaturated> {
        if self.config.max_bytes.is_none() || bytes == 0 {
            return Ok(permit);
        }
        match self.slots.reserve_bytes(permit.claim(), bytes) {
            Some(epoch) => Ok(permit.with_bytes(bytes, epoch)),
            None => {
                drop(permit);
                Err(self.saturated(ShedReason::Bytes))
            }
        }
    }

    /// Whether a caller arriving now would be admitted without waiting.
    pub(crate) fn has_room(&self) -> bool {
        self.waiters.parked() == 0 && self.slots.any_free(self.clock.now())
    }

    pub(crate) fn saturated(&self, reason: ShedReason) -> ServiceSaturated {
        ServiceSaturated::new(
            self.config.name.clone(),
            self.config.limit,
            reason,
            self.config.retry_after,
        )
    }

    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    pub(crate) fn waiters(&self) -> &Waiters {
        &self.waiters
    }

    pub(crate) fn slots(&self) -> &SlotTable {
        &self.slots
    }

    pub(crate) fn now(&self) -> u64 {
        self.clock.now()
    }
}

impl fmt::Debug for Bulkhead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bulkhead")
            .field("name", &self.name())
            .field("limit", &self.limit())
            .field("in_flight", &self.in_flight())
            .field("waiting", &self.waiting())
            .field("bytes_reserved", &self.bytes_reserved())
            .finish()
    }
}
