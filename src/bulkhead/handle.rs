//! The handle users hold: admission, the queries, and the bulkhead's life
//! (close, drain, reset).

use crate::bulkhead::drain::RECHECK;
use crate::bulkhead::{Acquire, BorrowedPermit, Granted, History, Permit, Shared};
use crate::config::{Config, ConfigError};
use crate::error::{ServiceSaturated, ShedReason};
use crate::observe::Status;
use crate::slots::Claim;
use crate::sync::Arc;
use crate::ticket::Ticket;
use crate::wait::{MovablePlace, SaturationSignal};
use std::fmt;
use std::time::Duration;

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

impl Bulkhead {
    /// Builds a bulkhead.
    ///
    /// # Panics
    ///
    /// If the configuration is invalid; the message names the field. Use
    /// [`try_new`](Self::try_new) to get the error instead.
    #[track_caller]
    pub fn new(config: Config) -> Self {
        ConfigError::unwrap(Self::try_new(config))
    }

    /// Builds a bulkhead, or says which field of the configuration is wrong.
    pub fn try_new(config: Config) -> Result<Self, ConfigError> {
        let limit = config.limit;
        Self::try_new_keeping(std::sync::Arc::new(config), limit, History::Kept)
    }

    /// [`try_new`](Self::try_new) with a limit of `limit` (a key's own, held
    /// to `1..=MAX_SLOTS`), with or without a history of minutes.
    pub(crate) fn try_new_keeping(
        config: std::sync::Arc<Config>,
        limit: usize,
        history: History,
    ) -> Result<Self, ConfigError> {
        let shared = Shared::new(config, limit, history)?;
        Ok(Self {
            shared: Arc::new(shared),
        })
    }

    /// Takes a slot if one is free and nobody is waiting for one; never waits.
    ///
    /// A caller never overtakes callers parked by [`acquire`](Self::acquire):
    /// while any are parked, a free slot goes to them first.
    #[inline(always)]
    pub fn try_acquire(&self) -> Result<Permit, ServiceSaturated> {
        self.try_acquire_weighted(1)
    }

    /// [`try_acquire`](Self::try_acquire) for a permit that borrows the
    /// bulkhead instead of sharing ownership of it, like tokio's
    /// `Semaphore::try_acquire` beside `try_acquire_owned`.
    ///
    /// An owned [`Permit`] counts itself in and out of the bulkhead's
    /// reference count, and every caller on every core writes that one
    /// count; a borrowed permit writes only its own slot. Use it when the
    /// slot lives within a scope that can borrow the bulkhead (a handler
    /// that holds its `&Bulkhead` while it works). It is reclaimed, and
    /// released, exactly as a [`Permit`] is.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_inflight::{Bulkhead, Config};
    ///
    /// let bulkhead = Bulkhead::new(Config::new(1, Duration::from_secs(30)));
    /// {
    ///     let _permit = bulkhead.try_acquire_borrowed().unwrap();
    ///     assert!(bulkhead.try_acquire().is_err());
    /// }
    /// assert!(bulkhead.try_acquire().is_ok());
    /// ```
    #[inline(always)]
    pub fn try_acquire_borrowed(&self) -> Result<BorrowedPermit<'_>, ServiceSaturated> {
        self.shared.claim_weighted_or_shed(
            1,
            #[inline(always)]
            |claim| BorrowedPermit::new(&self.shared, claim),
        )
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
        Acquire::new(self.shared.clone(), Ticket::new())
    }

    /// [`acquire`](Self::acquire) with a priority for the line of waiting
    /// callers: with a [`QueueOrder`](crate::QueueOrder) that looks at
    /// priorities, the lower the value, the sooner the slot (0 is what
    /// `acquire` uses). A priority never lets a caller take a slot while
    /// others wait: it only orders the line.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_inflight::{Bulkhead, Config, QueueOrder};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let bulkhead = Bulkhead::new(
    ///     Config::new(1, Duration::from_secs(30))
    ///         .wait(Duration::from_millis(100))
    ///         .queue_order(QueueOrder::PriorityFifo),
    /// );
    /// let held = bulkhead.try_acquire().unwrap();
    /// let batch = tokio::spawn({
    ///     let bulkhead = bulkhead.clone();
    ///     async move { bulkhead.acquire_with_priority(10).await.is_ok() }
    /// });
    /// tokio::task::yield_now().await;
    /// let interactive = tokio::spawn({
    ///     let bulkhead = bulkhead.clone();
    ///     async move { bulkhead.acquire_with_priority(0).await.map(|_| ()).is_ok() }
    /// });
    /// tokio::task::yield_now().await;
    /// drop(held); // the interactive call, though it came later, goes first
    /// assert!(interactive.await.unwrap());
    /// assert!(batch.await.unwrap());
    /// # }
    /// ```
    pub fn acquire_with_priority(&self, priority: i32) -> Acquire {
        Acquire::new(self.shared.clone(), Ticket::new().priority(priority))
    }

    /// [`acquire_with_priority`](Self::acquire_with_priority), going to
    /// `place` in a line ordered by priority (the priority only names the
    /// caller in the metrics), or to `movable`'s place, which
    /// [`move_in_line`](Self::move_in_line) may change while it waits: for
    /// an order the crate computes itself.
    pub(crate) fn acquire_in_place(
        &self,
        priority: i32,
        place: i64,
        movable: Option<Arc<MovablePlace>>,
    ) -> Acquire {
        let ticket = Ticket::new().priority(priority).place_in_line(place);
        Acquire::new(self.shared.clone(), ticket).in_movable_place(movable)
    }

    /// Moves the caller of `movable` to `place` in this bulkhead's line (or,
    /// if it has not come to the line yet, where it will go).
    pub(crate) fn move_in_line(&self, movable: &MovablePlace, place: i64) {
        self.shared.waiters().move_in_line(movable, place);
    }

    /// Takes `weight` slots at once, or none, if nobody is waiting; never
    /// waits. One permit holds them all, and gives them all back when
    /// dropped. A weight of 0 or over the limit is refused with
    /// [`ShedReason::InvalidWeight`](crate::ShedReason::InvalidWeight). A weight of 1 is
    /// [`try_acquire`](Self::try_acquire); above that, the claim also notes
    /// its weight, behind a lock, so that a reclaim gives all of it back.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_inflight::{Bulkhead, Config};
    ///
    /// let bulkhead = Bulkhead::new(Config::new(4, Duration::from_secs(30)));
    /// let light = bulkhead.try_acquire().unwrap();
    /// let heavy = bulkhead.try_acquire_weighted(3).unwrap(); // the other three
    /// assert_eq!(bulkhead.in_flight(), 4);
    /// drop(light);
    /// assert!(bulkhead.try_acquire_weighted(2).is_err()); // one free: all or nothing
    /// assert_eq!(bulkhead.in_flight(), 3);
    /// drop(heavy);
    /// assert_eq!(bulkhead.in_flight(), 0);
    /// ```
    #[inline(always)]
    pub fn try_acquire_weighted(&self, weight: usize) -> Result<Permit, ServiceSaturated> {
        self.shared.claim_weighted_or_shed(
            weight,
            #[inline(always)]
            |claim| Permit::new(self.shared.clone(), claim),
        )
    }

    /// [`acquire`](Self::acquire) with a [`Ticket`]: a priority for the
    /// line and a weight in slots. A weighted caller takes all its slots at
    /// once; at the head of the line it is never bypassed by lighter
    /// callers, so freed slots wait for it until enough have come free.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_inflight::{Bulkhead, Config, Ticket};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let bulkhead = Bulkhead::new(Config::new(2, Duration::from_secs(30)).wait(Duration::from_secs(1)));
    /// let first = bulkhead.try_acquire().unwrap();
    /// let heavy = tokio::spawn({
    ///     let bulkhead = bulkhead.clone();
    ///     async move { bulkhead.acquire_with(Ticket::new().weight(2)).await.map(|_| ()) }
    /// });
    /// tokio::task::yield_now().await;
    /// // One slot is free, but the heavy caller at the head needs two: a
    /// // light caller does not slip past it.
    /// assert!(bulkhead.try_acquire().is_err());
    /// drop(first);
    /// assert!(heavy.await.unwrap().is_ok());
    /// # }
    /// ```
    pub fn acquire_with(&self, ticket: Ticket) -> Acquire {
        Acquire::new(self.shared.clone(), ticket)
    }

    /// Takes a slot and `bytes` of the byte budget together, or neither;
    /// never waits.
    ///
    /// When a slot is free but the bytes are not, the slot is given back and
    /// the call is shed with [`ShedReason::Bytes`](crate::ShedReason::Bytes). Without a byte budget
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
        let claim = self.shared.claim_or_shed()?;
        Shared::permit(&self.shared, claim, bytes)
    }

    /// Takes a slot, waiting for one up to the `wait` budget, then `bytes` of
    /// the byte budget; if the bytes are not free, gives the slot back and
    /// sheds with [`ShedReason::Bytes`](crate::ShedReason::Bytes). Bytes are never waited for.
    pub async fn acquire_bytes(&self, bytes: u64) -> Result<Permit, ServiceSaturated> {
        Acquire::new(self.shared.clone(), Ticket::new())
            .with_bytes(bytes)
            .await
    }

    /// Whether slot `index` is released (held by nobody, expired or not):
    /// for tests that model the table.
    #[doc(hidden)]
    #[cfg(any(test, feature = "test-util"))]
    pub fn slot_is_released(&self, index: usize) -> bool {
        self.shared.slots.is_released(index)
    }

    /// Bytes of the budget reserved now.
    pub fn bytes_reserved(&self) -> u64 {
        self.shared.slots.bytes_reserved()
    }

    /// The byte budget, if the configuration set one.
    pub fn max_bytes(&self) -> Option<u64> {
        self.shared.config.max_bytes
    }

    /// How many slots are held now: by calls admitted (or callers handed a
    /// slot) that have not released it yet. A slot whose holder vanished (a
    /// leaked permit) counts until it is reclaimed, by the next claim that
    /// needs it once `reclaim_after` has passed, or by [`drain`](Self::drain);
    /// [`is_saturated`](Self::is_saturated) already treats it as free. A
    /// snapshot: it may change before you act on it. It costs the same at
    /// any `limit`.
    pub fn in_flight(&self) -> usize {
        self.shared.slots.in_flight()
    }

    /// How many calls may be in flight at once: the limit in force now.
    pub fn limit(&self) -> usize {
        self.shared.slots.limit()
    }

    /// How many slots are free now: `limit` less
    /// [`in_flight`](Self::in_flight), or 0 while more are in flight than a
    /// lowered limit allows.
    pub fn available(&self) -> usize {
        self.limit().saturating_sub(self.in_flight())
    }

    /// Whether every slot is held now, so that a call would be shed or wait
    /// (a slot past `reclaim_after` counts as free: a call would reclaim it).
    pub fn is_saturated(&self) -> bool {
        !self.shared.slots.has_room(self.shared.clock.now(), 1)
    }

    /// How many callers are parked waiting for a slot.
    pub fn waiting(&self) -> usize {
        self.shared.waiters.parked()
    }

    /// A snapshot: the state now, lifetime totals, and what happened over
    /// the last minute, 5 and 15 minutes, hour and day.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_inflight::{Bulkhead, Config};
    ///
    /// let bulkhead = Bulkhead::new(Config::new(2, Duration::from_secs(30)).name("db"));
    /// let _held = (bulkhead.try_acquire().unwrap(), bulkhead.try_acquire().unwrap());
    /// let _ = bulkhead.try_acquire(); // shed
    ///
    /// let status = bulkhead.status();
    /// assert_eq!((status.in_flight, status.available), (2, 0));
    /// assert_eq!(status.totals.admitted, 2);
    /// assert_eq!(status.totals.rejected_limit, 1);
    /// assert_eq!(status.last_minute.rejected, 1);
    /// assert_eq!(status.last_minute.peak_in_flight, 2);
    /// ```
    pub fn status(&self) -> Status {
        let shared = &*self.shared;
        let now = shared.clock.now();
        let in_flight = shared.slots.in_flight();
        let totals = shared.totals();
        // Read together, so that the two add up.
        let waiting_by_priority = shared.waiters.depths();
        let rollups = &shared.observer.rollups;
        rollups.see_in_flight(in_flight);
        rollups.turn(now - 1, totals, in_flight);
        let windows = rollups.windows(now - 1, totals, |ticks| shared.clock.duration(ticks));
        let [last_minute, last_5_minutes, last_15_minutes, last_hour, last_day] = windows;
        let mut status = Status {
            name: self.name().map(str::to_owned),
            limit: self.limit(),
            max_limit: shared.slots.len(),
            in_flight,
            available: self.limit().saturating_sub(in_flight),
            waiting: waiting_by_priority.values().sum(),
            waiting_by_priority,
            saturation_signal: shared
                .saturation
                .as_deref()
                .is_some_and(SaturationSignal::is_raised),
            waits_cut_short: shared
                .codel
                .as_ref()
                .is_some_and(|codel| codel.is_cutting(shared.waiters.parked())),
            bytes_reserved: self.bytes_reserved(),
            max_bytes: self.max_bytes(),
            totals,
            last_minute,
            last_5_minutes,
            last_15_minutes,
            last_hour,
            last_day,
            ..Status::unfilled()
        };
        if let Some(leases) = shared.leases() {
            leases.ceiling().describe(&mut status);
        }
        status
    }

    /// Refuses every new call from now on with [`ShedReason::Closed`](crate::ShedReason::Closed), and
    /// turns away the callers waiting now with the same reason; calls in
    /// flight finish as usual. For a graceful shutdown: close, then
    /// [`drain`](Self::drain). There is no reopening: build a new bulkhead.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_inflight::{Bulkhead, Config, ShedReason};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let bulkhead = Bulkhead::new(Config::new(4, Duration::from_secs(30)));
    /// let in_flight = bulkhead.try_acquire().unwrap();
    /// bulkhead.close();
    /// assert_eq!(bulkhead.try_acquire().unwrap_err().reason(), ShedReason::Closed);
    ///
    /// tokio::spawn(async move {
    ///     tokio::time::sleep(Duration::from_millis(100)).await;
    ///     drop(in_flight); // the call in flight finishes
    /// });
    /// bulkhead.drain(Duration::from_secs(5)).await.unwrap();
    /// assert_eq!(bulkhead.in_flight(), 0);
    /// # }
    /// ```
    pub fn close(&self) {
        self.shared.waiters.close();
        self.shared.turn_away_leasing(false);
    }

    /// Whether [`close`](Self::close) was called.
    pub fn is_closed(&self) -> bool {
        self.shared.waiters.is_closed()
    }

    /// Turns away every caller waiting for a slot now, with
    /// [`ShedReason::Cancelled`](crate::ShedReason::Cancelled); callers arriving later wait as usual.
    pub fn cancel_waiting(&self) {
        self.shared.waiters.cancel();
        self.shared.turn_away_leasing(true);
    }

    /// Resolves once no call is in flight and nobody is waiting, or fails
    /// with [`DrainTimedOut`] after `timeout`. It does not stop new calls:
    /// [`close`](Self::close) first for that. Needs a Tokio runtime with its
    /// time driver.
    ///
    /// It is woken by the release that ends the last call, and looks again
    /// at least every 100 ms besides. A slot whose holder vanished (a leaked
    /// permit) ends at its deadline: the drain reclaims it then.
    pub async fn drain(&self, timeout: Duration) -> Result<(), DrainTimedOut> {
        let shared = &*self.shared;
        // A timeout past what an instant can hold (`Duration::MAX`) is none.
        let deadline = tokio::time::Instant::now().checked_add(timeout);
        let _draining = shared.drain.enter();
        loop {
            // Listening before looking, so that a release in between wakes it.
            let notified = shared.drain.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            let (in_flight, waiting) = shared.left_to_drain();
            if in_flight == 0 && waiting == 0 {
                return Ok(());
            }
            let now = tokio::time::Instant::now();
            if deadline.is_some_and(|deadline| now >= deadline) {
                return Err(DrainTimedOut { in_flight, waiting });
            }
            let recheck = now + RECHECK;
            let wake = deadline.map_or(recheck, |deadline| deadline.min(recheck));
            let _ = tokio::time::timeout_at(wake, notified).await;
        }
    }

    /// The bulkhead's name, if its configuration gave it one.
    pub fn name(&self) -> Option<&str> {
        self.shared.config.name.as_deref()
    }

    /// The configuration the bulkhead was built from.
    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    /// Frees every slot, as if each holder had released it, with the bytes
    /// its holder reserved on it. Bytes split off into a
    /// [`ByteReservation`](crate::ByteReservation) stay reserved until it
    /// is dropped.
    ///
    /// This forgets that the slots were taken; it does not stop calls that
    /// are still running, so until they finish more than `limit` calls may be
    /// in flight. Their permits can no longer release anything: a permit
    /// taken after the reset is never freed by one taken before it, even
    /// within the same clock tick. Outside tests, it is for clearing slots
    /// lost to killed callers when `reclaim_after` is long.
    pub fn reset(&self) {
        self.shared.slots.reset(self.shared.clock.now());
        self.shared.give_back_freed_leases();
        if let Some(leases) = self.shared.leases() {
            leases.ceiling().reset();
        }
        self.shared.observer.reset();
        self.shared
            .waiters
            .after_release(&self.shared.slots, &self.shared.clock);
    }

    /// [`try_acquire`](Self::try_acquire) for a caller that waits next if
    /// it is refused (which then records what comes of the call): a
    /// refusal is not recorded. With a ceiling, whose lease may need a
    /// round trip, it refuses: the caller's wait asks for the lease.
    pub(crate) fn try_acquire_unrecorded(&self) -> Option<Permit> {
        if self.shared.has_ceiling() {
            return None;
        }
        let claim = self.try_claim().ok()?;
        Some(Permit::new(self.shared.clone(), claim))
    }

    /// A slot for a caller that may not wait, not yet counted as admitted
    /// (nor its refusal recorded: see [`shed_now`](Self::shed_now)): made a
    /// permit by [`admit`](Self::admit) once the caller's other slots are
    /// held, or given back by [`give_back`](Self::give_back). Not for a
    /// bulkhead with a ceiling, whose leases `claim_or_shed` takes
    /// (keyed bulkheads refuse one per key).
    #[inline(always)]
    pub(crate) fn try_claim(&self) -> Result<Claim, ShedReason> {
        debug_assert!(!self.shared.has_ceiling());
        let now = self.shared.clock.now();
        self.shared.try_claim_weighted(1, now)
    }

    /// `claim`, from [`try_claim`](Self::try_claim), counted as admitted.
    #[inline(always)]
    pub(crate) fn admit(self, claim: Claim) -> Permit {
        Permit::new(self.shared, claim)
    }

    /// `claim`, from [`try_claim`](Self::try_claim), kept for a caller that
    /// waits for something else before it is counted as admitted (made a
    /// permit by [`Granted::into_permit`], or given back when dropped).
    pub(crate) fn grant(&self, claim: Claim) -> Granted {
        Granted::new(self.shared.clone(), claim)
    }

    /// `claim`, from [`try_claim`](Self::try_claim), given back uncounted.
    pub(crate) fn give_back(&self, claim: &Claim) {
        self.shared.give_back_unused(claim);
    }

    /// A shed for `reason`, recorded (counts, event, metrics, tracing) as
    /// any of this bulkhead's: for a refusal decided outside it.
    pub(crate) fn shed_now(&self, reason: ShedReason) -> ServiceSaturated {
        self.shared.saturated_at(reason, self.shared.clock.now())
    }

    /// Whether every slot held has passed its deadline (or none is held):
    /// a permit that was leaked pins its key only until its slot could be
    /// reclaimed, however often the key is called since. Frees nothing:
    /// the key's eviction resets its bulkhead.
    pub(crate) fn holds_nothing_unexpired(&self) -> bool {
        self.shared
            .slots
            .holds_only_expired(self.shared.clock.now())
    }

    /// Whether this handle is the only one, with no clone and no permit
    /// sharing the bulkhead.
    pub(crate) fn is_unshared(&self) -> bool {
        Arc::strong_count(&self.shared) == 1
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }
}

/// [`Bulkhead::drain`] ran out of time with calls still in flight or waiting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DrainTimedOut {
    /// Calls still in flight when the time ran out.
    pub in_flight: usize,
    /// Callers still waiting when the time ran out.
    pub waiting: usize,
}

impl fmt::Display for DrainTimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "bulkhead did not drain in time: {} in flight, {} waiting",
            self.in_flight, self.waiting
        )
    }
}

impl std::error::Error for DrainTimedOut {}

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
