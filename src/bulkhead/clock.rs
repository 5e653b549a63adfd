//! Where the slot table reads the time.
//!
//! Deadlines are kept in *ticks* counted from the bulkhead's creation, small
//! enough to fit the 42 bits the slot word leaves for them: 1/1024 s on the
//! system clock (a shift, not a division, turns the coarse clock's 32.32
//! fixed-point reading into ticks), a microsecond on a [`ManualClock`].
//!
//! # Which system clock
//!
//! The clock must be monotonic, and its resolution known, for a slot never
//! to be reclaimed before `reclaim_after`. Where the operating system has a
//! coarse monotonic clock with a resolution of at most one scheduler tick
//! (Linux and Android: `CLOCK_MONOTONIC_COARSE`; FreeBSD and DragonFly:
//! `CLOCK_MONOTONIC_FAST`), the bulkhead reads that: a few nanoseconds a
//! read, at most 10 ms behind (one tick at the slowest common rate, 100 Hz),
//! which every hold adds as a margin. Elsewhere (macOS, Windows, the other
//! BSDs and illumos, where the coarse readings are approximate, 15.6 ms
//! coarse, or wall time) it reads [`std::time::Instant`], monotonic on every
//! platform Rust supports, with no margin needed.

use crate::sync::{Arc, AtomicU64, Ordering};
use std::time::Duration;

/// System ticks per second.
const SYSTEM_TICKS_PER_SEC: u64 = 1024;

/// Manual ticks per second: microseconds.
const MANUAL_TICKS_PER_SEC: u64 = 1_000_000;

/// How far behind the true time a coarse reading may lag: one scheduler
/// tick, which is 10 ms on a kernel built with the slowest common rate
/// (100 Hz).
const COARSE_RESOLUTION: Duration = Duration::from_millis(10);

/// The largest tick a slot word can date (42 bits: about 136 years of
/// system ticks, 51 days of manual ones). The clock stops short of it, and
/// a deadline is cut to it, so a clock that ran that long holds its slots
/// until they are released rather than freeing them all.
const MAX_TICK: u64 = crate::slots::MAX_DEADLINE;

/// The longest hold a bulkhead accepts, in ticks: a quarter of what a word
/// can date, so that the clock can run three times as long as the hold
/// (about 100 years on the system clock, 38 days on a manual one) before a
/// deadline reaches [`MAX_TICK`].
const MAX_HOLD: u64 = MAX_TICK / 4;

/// A clock the bulkhead reads its deadlines from.
#[derive(Clone, Debug)]
pub(crate) enum Clock {
    /// The operating system's coarse monotonic clock.
    Coarse {
        epoch: coarsetime::Instant,
    },
    /// `std::time::Instant`, where no coarse clock is known to be monotonic.
    Precise {
        epoch: std::time::Instant,
    },
    Manual(ManualClock),
}

impl Clock {
    /// The system clock of this platform (see the module docs).
    pub(crate) fn system() -> Self {
        if cfg!(any(
            target_os = "linux",
            target_os = "android",
            target_os = "freebsd",
            target_os = "dragonfly"
        )) {
            Clock::Coarse {
                epoch: coarsetime::Instant::now_without_cache_update(),
            }
        } else {
            Clock::precise()
        }
    }

    pub(crate) fn precise() -> Self {
        Clock::Precise {
            epoch: std::time::Instant::now(),
        }
    }

    /// Ticks since this clock's epoch. Never zero: a slot word with a zero
    /// deadline is one that was released, and must read as already expired.
    /// Never past `MAX_TICK - 1`, so that a deadline cut to `MAX_TICK` is
    /// never reached.
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        match self {
            Clock::Coarse { epoch } => {
                // `now_without_cache_update`: `now()` also stores into a
                // process-wide static, a write every core would fight over.
                let now = coarsetime::Instant::now_without_cache_update();
                // 32.32 fixed point to 1/1024 s: at most 2^42 ticks (136
                // years) since the epoch, so no cut is needed here.
                (now.as_ticks().saturating_sub(epoch.as_ticks()) >> 22) + 1
            }
            Clock::Precise { epoch } => {
                let elapsed = epoch.elapsed();
                let ticks = (elapsed.as_secs() << 10)
                    | (u64::from(elapsed.subsec_nanos()) * SYSTEM_TICKS_PER_SEC / 1_000_000_000);
                ticks.min(MAX_TICK - 2) + 1
            }
            // A manual clock can be advanced by any amount.
            Clock::Manual(manual) => manual.micros().min(MAX_TICK - 2) + 1,
        }
    }

    /// How many ticks a slot is held for `reclaim_after`, such that it is
    /// never reclaimed before `reclaim_after` has passed: rounded up, plus a
    /// tick for the reading at the claim having been rounded down, plus, on
    /// the coarse clock, its resolution. `None` past what a slot word can
    /// date (see [`max_reclaim_after`]).
    pub(crate) fn hold(&self, reclaim_after: Duration) -> Option<u64> {
        let ticks = match self {
            Clock::Coarse { .. } => ceil_ticks(
                reclaim_after.saturating_add(COARSE_RESOLUTION),
                SYSTEM_TICKS_PER_SEC,
            )
            .saturating_add(1),
            Clock::Precise { .. } => {
                ceil_ticks(reclaim_after, SYSTEM_TICKS_PER_SEC).saturating_add(1)
            }
            Clock::Manual(_) => ceil_ticks(reclaim_after, MANUAL_TICKS_PER_SEC),
        };
        (ticks <= MAX_HOLD).then_some(ticks)
    }
}

/// The longest `reclaim_after` a bulkhead accepts: about 34 years on the
/// system clock, 12 days on a [`ManualClock`] (`manual`). Longer ones are
/// refused rather than cut, since a hold the table cannot date would
/// reclaim slots early.
pub(crate) fn max_reclaim_after(manual: bool) -> Duration {
    if manual {
        Duration::from_micros(MAX_HOLD)
    } else {
        // Less one tick and the coarse clock's margin, so that every value
        // up to this one gets a hold of at most `MAX_HOLD`.
        Duration::from_secs((MAX_HOLD - 1) / SYSTEM_TICKS_PER_SEC) - COARSE_RESOLUTION
    }
}

impl Clock {
    fn ticks_per_sec(&self) -> u64 {
        match self {
            Clock::Coarse { .. } | Clock::Precise { .. } => SYSTEM_TICKS_PER_SEC,
            Clock::Manual(_) => MANUAL_TICKS_PER_SEC,
        }
    }

    pub(crate) fn ticks_per_minute(&self) -> u64 {
        self.ticks_per_sec() * 60
    }

    /// Whether `now`, read from this clock, is its last tick: the clock
    /// reads the same from then on.
    pub(crate) fn has_stopped(now: u64) -> bool {
        now >= MAX_TICK - 1
    }

    /// How many ticks `duration` spans, rounded up.
    pub(crate) fn ticks(&self, duration: Duration) -> u64 {
        ceil_ticks(duration, self.ticks_per_sec())
    }

    /// A precise reading, from an arbitrary start: for latencies, which a
    /// tick of the coarse clock is too coarse to measure. `Instant::now()`
    /// on the system clocks, so only adaptive limits pay for it.
    pub(crate) fn precise_elapsed(&self) -> Duration {
        static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        match self {
            Clock::Manual(manual) => manual.elapsed(),
            Clock::Coarse { .. } | Clock::Precise { .. } => {
                START.get_or_init(std::time::Instant::now).elapsed()
            }
        }
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
/// Feature `test-util`.
#[derive(Clone, Debug, Default)]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
pub struct ManualClock {
    nanos: Arc<AtomicU64>,
}

// Without the feature only the crate's own tests make one.
#[cfg_attr(not(feature = "test-util"), allow(dead_code, unreachable_pub))]
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
        let clock = Clock::system();
        // 1 s is 1024 ticks; 10 ms of resolution is 10.24, so 11; one more
        // for the rounded-down reading at the claim.
        assert_eq!(clock.hold(Duration::from_secs(1)), Some(1024 + 11 + 1));
    }

    #[test]
    fn precise_hold_covers_rounding() {
        assert_eq!(
            Clock::precise().hold(Duration::from_secs(1)),
            Some(1024 + 1)
        );
    }

    #[test]
    fn manual_clock_reaches_a_deadline_exactly_when_advanced_to_it() {
        let manual = ManualClock::new();
        let clock = Clock::Manual(manual.clone());
        let deadline = clock.now() + clock.hold(Duration::from_millis(30)).unwrap();
        manual.advance(Duration::from_millis(30) - Duration::from_nanos(1));
        assert!(clock.now() < deadline);
        manual.advance(Duration::from_nanos(1));
        assert!(clock.now() >= deadline);
    }

    #[test]
    fn system_clocks_are_never_zero_and_never_go_back() {
        for clock in [Clock::system(), Clock::precise()] {
            let a = clock.now();
            let b = clock.now();
            assert!(a >= 1 && b >= a);
        }
    }

    #[test]
    fn the_longest_accepted_reclaim_after_gets_a_hold_and_a_longer_one_none() {
        for (clock, manual) in [
            (Clock::system(), false),
            (Clock::precise(), false),
            (Clock::Manual(ManualClock::new()), true),
        ] {
            let max = max_reclaim_after(manual);
            assert!(
                clock.hold(max).is_some_and(|hold| hold <= MAX_HOLD),
                "{clock:?}"
            );
            assert_eq!(clock.hold(max * 2), None, "{clock:?}");
            assert_eq!(clock.hold(Duration::MAX), None, "{clock:?}");
        }
    }

    #[test]
    fn a_manual_clock_advanced_past_what_a_word_can_date_stops_short_of_it() {
        let manual = ManualClock::new();
        let clock = Clock::Manual(manual.clone());
        manual.advance(Duration::MAX);
        assert_eq!(clock.now(), MAX_TICK - 1);
    }
}
