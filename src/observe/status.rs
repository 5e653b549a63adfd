//! A snapshot of a bulkhead: its state now, its lifetime totals, and rollups
//! over the last minute, 5 and 15 minutes, hour and day.
//!
//! The rollups cost the fast path one relaxed load: once a minute, the first
//! call to notice that the minute has turned stores the lifetime totals in a
//! ring of one entry a minute (a day's worth), and a window is the difference
//! between the totals now and the entry at its start.

use crate::sync::{lock, AtomicU64, AtomicUsize, Mutex, Ordering};
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

/// A snapshot of a [`Bulkhead`](crate::Bulkhead), from
/// [`Bulkhead::status`](crate::Bulkhead::status). Taking one costs a read of
/// every slot and of the day's history of minutes, whatever the number of
/// callers waiting.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Status {
    /// The bulkhead's name, if it has one.
    pub name: Option<String>,
    /// How many calls may be in flight at once now: the limit in force,
    /// which an adaptive limit moves.
    pub limit: usize,
    /// The most the limit can be: the configuration's `limit`.
    pub max_limit: usize,
    /// Slots held now.
    pub in_flight: usize,
    /// Slots free now.
    pub available: usize,
    /// Callers parked for a slot now.
    pub waiting: usize,
    /// Callers parked for a slot now, by the priority they asked for
    /// ([`Ticket::priority`](crate::Ticket::priority)); priorities nobody
    /// waits with are left out.
    pub waiting_by_priority: BTreeMap<i32, usize>,
    /// Whether the saturation signal is up: callers that find every slot
    /// held are shed at once instead of waiting.
    pub saturation_signal: bool,
    /// Whether new waits are cut to CoDel's target now, the line having
    /// stood for a whole interval ([`Config::codel`](crate::Config::codel)).
    pub waits_cut_short: bool,
    /// Bytes of the byte budget reserved now.
    pub bytes_reserved: u64,
    /// The byte budget, if there is one.
    pub max_bytes: Option<u64>,
    /// The Redis ceiling, as this replica has seen it, if the bulkhead has
    /// one (feature `redis`).
    #[cfg(feature = "redis")]
    pub cluster: Option<crate::redis::ClusterStatus>,
    /// Counts since the bulkhead was built.
    pub totals: Totals,
    /// The last minute.
    pub last_minute: Window,
    /// The last 5 minutes.
    pub last_5_minutes: Window,
    /// The last 15 minutes.
    pub last_15_minutes: Window,
    /// The last hour.
    pub last_hour: Window,
    /// The last 24 hours.
    pub last_day: Window,
}

impl Status {
    /// A status with nothing in it: the base a bulkhead's status is made
    /// on, so that it names only what it reports itself. The parts a
    /// ceiling reports are filled in by the ceiling.
    pub(crate) fn unfilled() -> Self {
        let window = Window::default();
        Self {
            name: None,
            limit: 0,
            max_limit: 0,
            in_flight: 0,
            available: 0,
            waiting: 0,
            waiting_by_priority: BTreeMap::new(),
            saturation_signal: false,
            waits_cut_short: false,
            bytes_reserved: 0,
            max_bytes: None,
            #[cfg(feature = "redis")]
            cluster: None,
            totals: Totals::default(),
            last_minute: window,
            last_5_minutes: window,
            last_15_minutes: window,
            last_hour: window,
            last_day: window,
        }
    }
}

/// Lifetime counts of a bulkhead.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Totals {
    /// Calls admitted (a weighted permit counts once).
    pub admitted: u64,
    /// Calls shed because every slot was held (see
    /// [`ShedReason::LimitReached`](crate::ShedReason::LimitReached)) and
    /// nobody could wait.
    pub rejected_limit: u64,
    /// Calls shed after waiting their whole `wait` budget.
    pub rejected_wait_expired: u64,
    /// Calls shed because `max_waiting` callers were already waiting.
    pub rejected_too_many_waiting: u64,
    /// Calls shed because their bytes did not fit the byte budget.
    pub rejected_bytes: u64,
    /// Calls refused because the bulkhead was closed.
    pub rejected_closed: u64,
    /// Waiting callers turned away by `cancel_waiting`.
    pub rejected_cancelled: u64,
    /// Calls shed without waiting because the saturation signal was up.
    pub rejected_saturated: u64,
    /// Calls refused because their weight was 0 or over the limit.
    pub rejected_invalid_weight: u64,
    /// Calls whose local slot was free but the cluster ceiling was full.
    pub rejected_cluster_limit: u64,
    /// Calls shed because the cluster ceiling could not be asked.
    pub rejected_cluster_unavailable: u64,
    /// Slots taken over after their holder kept them past `reclaim_after`.
    pub reclaimed: u64,
    /// Callers that waited for a slot (admitted or not).
    pub waits: u64,
    /// Time those callers spent waiting, in all.
    #[cfg_attr(feature = "serde", serde(serialize_with = "seconds"))]
    pub wait_time: Duration,
}

impl Totals {
    /// Calls shed, for every reason.
    pub fn rejected(&self) -> u64 {
        // Every field named, so that a reason added later cannot be missed.
        let Totals {
            admitted: _,
            rejected_limit,
            rejected_wait_expired,
            rejected_too_many_waiting,
            rejected_bytes,
            rejected_closed,
            rejected_cancelled,
            rejected_saturated,
            rejected_invalid_weight,
            rejected_cluster_limit,
            rejected_cluster_unavailable,
            reclaimed: _,
            waits: _,
            wait_time: _,
        } = *self;
        rejected_limit
            + rejected_wait_expired
            + rejected_too_many_waiting
            + rejected_bytes
            + rejected_closed
            + rejected_cancelled
            + rejected_saturated
            + rejected_invalid_weight
            + rejected_cluster_limit
            + rejected_cluster_unavailable
    }

    /// What was added since `earlier`. Saturating: `earlier` may have been
    /// recorded by another thread after these totals were read (a minute
    /// turning between a status's reads), and is then taken as no change.
    fn since(&self, earlier: &Totals) -> Totals {
        Totals {
            admitted: self.admitted.saturating_sub(earlier.admitted),
            rejected_limit: self.rejected_limit.saturating_sub(earlier.rejected_limit),
            rejected_wait_expired: self
                .rejected_wait_expired
                .saturating_sub(earlier.rejected_wait_expired),
            rejected_too_many_waiting: self
                .rejected_too_many_waiting
                .saturating_sub(earlier.rejected_too_many_waiting),
            rejected_bytes: self.rejected_bytes.saturating_sub(earlier.rejected_bytes),
            rejected_closed: self.rejected_closed.saturating_sub(earlier.rejected_closed),
            rejected_cancelled: self
                .rejected_cancelled
                .saturating_sub(earlier.rejected_cancelled),
            rejected_saturated: self
                .rejected_saturated
                .saturating_sub(earlier.rejected_saturated),
            rejected_invalid_weight: self
                .rejected_invalid_weight
                .saturating_sub(earlier.rejected_invalid_weight),
            rejected_cluster_limit: self
                .rejected_cluster_limit
                .saturating_sub(earlier.rejected_cluster_limit),
            rejected_cluster_unavailable: self
                .rejected_cluster_unavailable
                .saturating_sub(earlier.rejected_cluster_unavailable),
            reclaimed: self.reclaimed.saturating_sub(earlier.reclaimed),
            waits: self.waits.saturating_sub(earlier.waits),
            wait_time: self.wait_time.saturating_sub(earlier.wait_time),
        }
    }

    /// The mean wait, if anyone waited: in nanoseconds over the whole count,
    /// which a `Duration`'s division by a `u32` would cut.
    fn mean_wait(&self) -> Option<Duration> {
        (self.waits > 0).then(|| {
            let nanos = self.wait_time.as_nanos() / u128::from(self.waits);
            Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
        })
    }
}

/// What happened in a recent window of time.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Window {
    /// The time the window really covers: its nominal length, or less while
    /// the bulkhead is younger than that. Windows start on whole minutes of
    /// the bulkhead's clock, so this runs up to a minute over the nominal
    /// length.
    #[cfg_attr(feature = "serde", serde(serialize_with = "seconds"))]
    pub span: Duration,
    /// Calls admitted (a weighted permit counts once).
    pub admitted: u64,
    /// Calls admitted per second over the span.
    pub throughput: f64,
    /// Calls shed, for every reason.
    pub rejected: u64,
    /// Slots reclaimed.
    pub reclaimed: u64,
    /// The mean wait of the callers that waited, if any did.
    #[cfg_attr(feature = "serde", serde(serialize_with = "optional_seconds"))]
    pub mean_wait: Option<Duration>,
    /// The most slots seen held at once. Sampled (whenever a call is shed or
    /// parked for want of a slot, when a minute turns, at `status()`, and at
    /// each thread's first admission and one in 64 after that), so it can
    /// miss a short peak below the limit.
    pub peak_in_flight: usize,
}

#[cfg(feature = "serde")]
fn seconds<S: serde::Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_f64(duration.as_secs_f64())
}

#[cfg(feature = "serde")]
fn optional_seconds<S: serde::Serializer>(
    duration: &Option<Duration>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match duration {
        Some(duration) => serializer.serialize_some(&duration.as_secs_f64()),
        None => serializer.serialize_none(),
    }
}

/// The window lengths reported, in minutes.
const WINDOWS: [u64; 5] = [1, 5, 15, 60, 24 * 60];

/// One minute's entry: the totals when the minute began, and the peak seen
/// in the minutes since the previous entry.
#[derive(Clone, Copy, Debug)]
struct Entry {
    minute: u64,
    totals: Totals,
    peak: usize,
}

/// Per-minute history of the totals.
#[derive(Debug)]
pub(crate) struct Rollups {
    ticks_per_minute: u64,
    /// The tick at which the current minute ends.
    next_minute: AtomicU64,
    /// The peak seen since the last entry.
    peak: AtomicUsize,
    /// The entries, a minute each; none without history.
    history: Option<Box<Mutex<VecDeque<Entry>>>>,
}

/// The entries of rollups that keep no history.
static NO_ENTRIES: VecDeque<Entry> = VecDeque::new();

/// The `next_minute` of rollups that keep no history: past every tick the
/// clock reaches, so that no minute ever turns.
const NO_HISTORY: u64 = u64::MAX;

impl Rollups {
    /// Rollups that keep no history, for a key of a keyed bulkhead (whose
    /// status shows its totals, not windows): they allocate nothing, their
    /// windows count nothing, and the fast path never finds the minute
    /// turned.
    pub(crate) fn without_history(ticks_per_minute: u64) -> Self {
        Self {
            ticks_per_minute,
            next_minute: AtomicU64::new(NO_HISTORY),
            peak: AtomicUsize::new(0),
            history: None,
        }
    }

    pub(crate) fn new(ticks_per_minute: u64, now: u64) -> Self {
        let minute = now / ticks_per_minute;
        let first = Entry {
            minute,
            totals: Totals::default(),
            peak: 0,
        };
        Self {
            ticks_per_minute,
            next_minute: AtomicU64::new((minute + 1) * ticks_per_minute),
            peak: AtomicUsize::new(0),
            history: Some(Box::new(Mutex::new(VecDeque::from([first])))),
        }
    }

    /// Whether `now` is past the current minute, so that an entry is due.
    #[inline]
    pub(crate) fn minute_turned(&self, now: u64) -> bool {
        now >= self.next_minute.load(Ordering::Relaxed)
    }

    /// Whether the peak since the last entry is below `in_flight`.
    pub(crate) fn peak_below(&self, in_flight: usize) -> bool {
        self.peak.load(Ordering::Relaxed) < in_flight
    }

    pub(crate) fn see_in_flight(&self, in_flight: usize) {
        // Sheds see the same figure over and over: read before writing, so
        // that they do not all write the one shared word for nothing.
        if self.peak.load(Ordering::Relaxed) < in_flight {
            self.peak.fetch_max(in_flight, Ordering::Relaxed);
        }
    }

    /// Records the totals for the minute `now` is in, if not done already.
    pub(crate) fn turn(&self, now: u64, totals: Totals, in_flight: usize) {
        let Some(history) = &self.history else {
            return;
        };
        let minute = now / self.ticks_per_minute;
        let mut history = lock(history);
        if history.back().is_some_and(|last| last.minute >= minute) {
            return;
        }
        let peak = self.peak.swap(in_flight, Ordering::Relaxed);
        history.push_back(Entry {
            minute,
            totals,
            peak,
        });
        while history.len() > WINDOWS[4] as usize + 2 {
            history.pop_front();
        }
        self.next_minute
            .store((minute + 1) * self.ticks_per_minute, Ordering::Relaxed);
    }

    /// The five windows, ending at `now` with `totals`. A window of `n`
    /// minutes starts at the beginning of the minute `n` before the current
    /// one, so it spans between `n` and `n + 1` minutes.
    pub(crate) fn windows(
        &self,
        now: u64,
        totals: Totals,
        ticks_to_duration: impl Fn(u64) -> Duration,
    ) -> [Window; 5] {
        let minute = now / self.ticks_per_minute;
        let locked = self.history.as_deref().map(lock);
        let history = locked.as_deref().unwrap_or(&NO_ENTRIES);
        let current_peak = self.peak.load(Ordering::Relaxed);
        let born = history.front().map_or(0, |entry| entry.minute);
        WINDOWS.map(|length| {
            let start = minute.saturating_sub(length).max(born);
            // An entry is written at the first event of a minute, so the
            // totals at `start` are those of the first entry at or after it:
            // nothing happened in the minutes between.
            let first = history.iter().position(|entry| entry.minute >= start);
            let (base, later_peaks) = match first {
                Some(index) => (
                    history[index].totals,
                    history.iter().skip(index + 1).map(|entry| entry.peak).max(),
                ),
                None => (totals, None),
            };
            let since = totals.since(&base);
            let span = ticks_to_duration(now.saturating_sub(start * self.ticks_per_minute));
            let secs = span.as_secs_f64();
            Window {
                span,
                admitted: since.admitted,
                throughput: if secs > 0.0 {
                    since.admitted as f64 / secs
                } else {
                    0.0
                },
                rejected: since.rejected(),
                reclaimed: since.reclaimed,
                mean_wait: since.mean_wait(),
                peak_in_flight: later_peaks.unwrap_or(0).max(current_peak),
            }
        })
    }
}

#[cfg(all(test, not(tower_inflight_loom)))]
mod tests {
    use super::*;

    const MINUTE: u64 = 60;

    #[test]
    fn a_minute_recorded_after_the_totals_were_read_counts_as_no_change() {
        let rollups = Rollups::new(MINUTE, 0);
        let read_first = Totals::default();
        let recorded_since = Totals {
            admitted: 5,
            rejected_limit: 3,
            waits: 2,
            wait_time: Duration::from_secs(1),
            ..Totals::default()
        };
        rollups.turn(MINUTE, recorded_since, 0);
        let [minute, ..] = rollups.windows(MINUTE, read_first, Duration::from_secs);
        assert_eq!((minute.admitted, minute.rejected), (0, 0));
        assert_eq!(minute.mean_wait, None);
    }

    #[test]
    fn the_mean_wait_divides_by_the_whole_count() {
        let waits = u64::from(u32::MAX) + 1;
        let totals = Totals {
            waits,
            wait_time: Duration::from_secs(2 * waits),
            ..Totals::default()
        };
        assert_eq!(totals.mean_wait(), Some(Duration::from_secs(2)));
        let rollups = Rollups::new(MINUTE, 0);
        let [minute, ..] = rollups.windows(1, totals, Duration::from_secs);
        assert_eq!(minute.mean_wait, Some(Duration::from_secs(2)));
    }
}
