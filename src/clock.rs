//! Where the slot table reads the time.
//!
//! Deadlines are kept in *ticks* of 1/1024 s (about a millisecond) counted
//! from the bulkhead's creation, so that a deadline fits in the 42 bits the
//! slot word leaves for it and a shift, not a division, turns the coarse
//! clock's 32.32 fixed-point reading into ticks.

use crate::sync::{Arc, AtomicU64, Ordering};
use std::time::Duration;

/// Ticks per second of the slot table's clock.
const TICKS_PER_SEC: u64 = 1024;

/// A clock the bulkhead reads its deadlines from.
///
/// The default reads the operating system's coarse monotonic clock
/// (`CLOCK_MONOTONIC_COARSE` on Linux: a few nanoseconds a read, a resolution
/// of one to four milliseconds), which is all `reclaim_after` needs.
#[derive(Clone, Debug)]
pub(crate) enum Clock {
    Coarse { epoch: coarsetime::Instant },
    Manual(ManualClock),
}

impl Clock {
    pub(crate) fn coarse() -> Self {
        Clock::Coarse {
            epoch: coarsetime::Instant::now_without_cache_update(),
        }
    }

    /// Ticks since this clock's epoch. Never zero: a slot word with a zero
    /// deadline is one that was released, and must read as already expired.
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        match self {
            Clock::Coarse { epoch } => {
                // `now_without_cache_update`: `now()` also stores into a
                // process-wide static, a write every core would fight over.
                let now = coarsetime::Instant::now_without_cache_update();
                (now.as_ticks().saturating_sub(epoch.as_ticks()) >> 22) + 1
            }
            Clock::Manual(manual) => manual.ticks() + 1,
        }
    }
}

/// Converts a duration into whole ticks, rounding up so that a deadline is
/// never earlier than asked for.
pub(crate) fn ticks(duration: Duration) -> u64 {
    let nanos = duration.as_nanos();
    let ticks = (nanos * u128::from(TICKS_PER_SEC)).div_ceil(1_000_000_000);
    u64::try_from(ticks).unwrap_or(u64::MAX)
}

/// A clock that only moves when told to, for tests of `reclaim_after`.
///
/// The bulkhead counts time in ticks of 1/1024 s, rounding deadlines up, so a
/// slot is reclaimed within a millisecond after `reclaim_after`, never before.
///
/// Hand it to [`Config::clock`](crate::Config::clock); every bulkhead built
/// from that configuration then reads its deadlines from it, and a test can
/// step past `reclaim_after` without sleeping.
///
/// ```
/// use std::time::Duration;
/// use tower_inflight::{Bulkhead, Config, ManualClock};
///
/// let clock = ManualClock::new();
/// let bulkhead = Bulkhead::new(Config::new(1, Duration::from_secs(30)).clock(clock.clone()));
///
/// std::mem::forget(bulkhead.try_acquire().unwrap()); // a leaked permit
/// assert!(bulkhead.try_acquire().is_err());
///
/// clock.advance(Duration::from_secs(30));
/// assert!(bulkhead.try_acquire().is_ok()); // the leaked slot was reclaimed
/// ```
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    nanos: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock standing at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        // fetch_update rather than fetch_add so that a huge step saturates
        // instead of wrapping the clock back to the past.
        let _ = self
            .nanos
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                Some(n.saturating_add(by))
            });
    }

    /// How far the clock has been advanced in all.
    pub fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::SeqCst))
    }

    fn ticks(&self) -> u64 {
        // Rounds down: a deadline passes only once the clock really reached it.
        let nanos = u128::from(self.nanos.load(Ordering::SeqCst));
        (nanos * u128::from(TICKS_PER_SEC) / 1_000_000_000) as u64
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn ticks_round_up_so_deadlines_are_never_early() {
        assert_eq!(ticks(Duration::ZERO), 0);
        assert_eq!(ticks(Duration::from_nanos(1)), 1);
        assert_eq!(ticks(Duration::from_secs(1)), 1024);
        assert_eq!(ticks(Duration::from_millis(1)), 2);
    }

    #[test]
    fn manual_clock_reaches_a_deadline_within_a_tick_after_it() {
        let manual = ManualClock::new();
        let clock = Clock::Manual(manual.clone());
        let deadline = clock.now() + ticks(Duration::from_millis(30));
        manual.advance(Duration::from_millis(29));
        assert!(clock.now() < deadline);
        manual.advance(Duration::from_millis(2));
        assert!(clock.now() >= deadline);
    }

    #[test]
    fn coarse_clock_is_never_zero_and_never_goes_back() {
        let clock = Clock::coarse();
        let a = clock.now();
        let b = clock.now();
        assert!(a >= 1 && b >= a);
    }
}
