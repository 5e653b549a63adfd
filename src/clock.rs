//! Where the slot table reads the time.
//!
//! Deadlines are kept in *ticks* counted from the bulkhead's creation, small
//! enough to fit the 42 bits the slot word leaves for them: 1/1024 s on the
//! system's coarse clock (a shift, not a division, turns its 32.32
//! fixed-point reading into ticks), a microsecond on a [`ManualClock`].

use crate::sync::{Arc, AtomicU64, Ordering};
use std::time::Duration;

/// Coarse ticks per second.
const COARSE_TICKS_PER_SEC: u64 = 1024;

/// How far behind the true time a coarse reading may lag: one jiffy, which
/// is 10 ms on a kernel built with the slowest common tick rate (100 Hz).
const COARSE_RESOLUTION: Duration = Duration::from_millis(10);

/// A clock the bulkhead reads its deadlines from.
///
/// The default reads the operating system's coarse monotonic clock
/// (`CLOCK_MONOTONIC_COARSE` on Linux: a few nanoseconds a read, a resolution
/// of one to ten milliseconds), which is all `reclaim_after` needs.
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
            Clock::Manual(manual) => manual.micros() + 1,
        }
    }

    /// How many ticks a slot is held for `reclaim_after`, such that it is
    /// never reclaimed before `reclaim_after` has passed: rounded up, plus a
    /// tick for the reading at the claim having been rounded down, plus, on
    /// the coarse clock, its resolution.
    pub(crate) fn hold(&self, reclaim_after: Duration) -> u64 {
        match self {
            Clock::Coarse { .. } => {
                ceil_ticks(reclaim_after + COARSE_RESOLUTION, COARSE_TICKS_PER_SEC) + 1
            }
            Clock::Manual(_) => ceil_ticks(reclaim_after, 1_000_000),
        }
    }
}

impl Clock {
    fn ticks_per_sec(&self) -> u64 {
        match self {
            Clock::Coarse { .. } => COARSE_TICKS_PER_SEC,
            Clock::Manual(_) => 1_000_000,
        }
    }

    pub(crate) fn ticks_per_minute(&self) -> u64 {
        self.ticks_per_sec() * 60
    }

    pub(crate) fn duration(&self, ticks: u64) -> Duration {
        let per_sec = self.ticks_per_sec();
        Duration::from_secs(ticks / per_sec)
            + Duration::from_nanos((ticks % per_sec) * 1_000_000_000 / per_sec)
    }
}

fn ceil_ticks(duration: Duration, per_sec: u64) -> u64 {
    let ticks = (duration.as_nanos() * u128::from(per_sec)).div_ceil(1_000_000_000);
    u64::try_from(ticks).unwrap_or(u64::MAX)
}

/// A clock that only moves when told to, for tests of `reclaim_after`.
///
/// It counts in microseconds: a slot taken at a whole microsecond is
/// reclaimable exactly when the clock has been advanced by `reclaim_after`.
/// (On the system clock, reclamation comes up to a few milliseconds after
/// `reclaim_after`, never before.)
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

    fn micros(&self) -> u64 {
        // Rounds down: a deadline passes only once the clock really reached it.
        self.nanos.load(Ordering::SeqCst) / 1_000
    }
}

#[cfg(all(test, not(tower_inflight_loom)))]
mod tests {
    use super::*;

    #[test]
    fn coarse_hold_covers_rounding_and_resolution() {
        let clock = Clock::coarse();
        // 1 s is 1024 ticks; 10 ms of resolution is 10.24, so 11; one more
        // for the rounded-down reading at the claim.
        assert_eq!(clock.hold(Duration::from_secs(1)), 1024 + 11 + 1);
    }

    #[test]
    fn manual_clock_reaches_a_deadline_exactly_when_advanced_to_it() {
        let manual = ManualClock::new();
        let clock = Clock::Manual(manual.clone());
        let deadline = clock.now() + clock.hold(Duration::from_millis(30));
        manual.advance(Duration::from_millis(30) - Duration::from_nanos(1));
        assert!(clock.now() < deadline);
        manual.advance(Duration::from_nanos(1));
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
