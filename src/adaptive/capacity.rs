//! Capacity: Little's law on windows of samples.

use crate::adaptive::{Algorithm, Sample};
use std::collections::VecDeque;
use std::time::Duration;

/// The default algorithm: it estimates the dependency's capacity, the
/// calls it serves at once without queueing, and sets the limit there.
///
/// # The idea
///
/// By Little's law, a dependency that serves `X` calls a second, each in
/// `L` seconds when none queues, has `X × L` calls in service. Over the
/// limit it can serve, more calls in flight only queue: throughput stays
/// at its capacity and latency grows with the queue. So:
///
/// - Samples are taken in windows (100 ms, at least twice the baseline,
///   and at least 10 samples). A window's latency is the mean of its
///   latencies but the fifth that came back first: calls that did no work
///   and came back at once drop out, where they drag the minimum Vegas
///   relies on; calls that queued count in full, as Little's law needs.
/// - The *baseline* is the least window latency of the last 200 windows:
///   the latency without queueing.
/// - A window over 1.35 times the baseline queues: the limit goes at once
///   to `1.2 × X × baseline`, the capacity measured and a fifth more (a
///   short queue keeps every worker of the dependency fed between one
///   call's end and the next call's arrival). `X` is the highest of this
///   window's throughput and the last two's, so that a stall of the
///   dependency or of the runtime, across one window or two, does not cut
///   the limit to what they served. One step, not a slide: when capacity
///   halves, the limit halves within three or four windows (a window or two
///   more if a probe is under way), where AIMD and Gradient2 take seconds
///   and let the queue grow meanwhile.
/// - A window with the limit reached grows it while latency stays within
///   1.05 times the baseline (no queue at all): it doubles up to where it
///   was before the cuts (the capacity came back), and grows by half past
///   that. Within 1.15, it grows by a tenth. Between 1.15 and 1.35 it holds, so there is no saw-tooth
///   around the point where queueing starts.
/// - A window with fewer calls in flight than the limit says nothing of
///   capacity: the limit holds (it does not creep up to the maximum under
///   light load, to let the next burst through unchecked).
/// - Drops: a window whose share of drops is over twice the usual share
///   (and over 1 %) takes a tenth off. A steady share of timeouts or errors
///   unrelated to load becomes the usual share and stops counting: the
///   limit does not drift down for good.
/// - The baseline is kept honest both ways. Two cuts in a row that do not
///   bring latency down mean the dependency itself became slower, not
///   queued: the baseline is taken afresh. (One is not enough: a cut made
///   on a window that a change of capacity fell in halfway measured a
///   throughput between the old and the new.) And now and then the limit
///   is lowered by a quarter for two windows, so that a baseline measured
///   while calls queued is found out: after 3 s, then twice as long after
///   each probe that finds nothing new, up to 10 s. At start, while each
///   probe finds latency falling with the limit (the limit began well over
///   capacity), the next comes soon and goes a quarter deeper. A probe
///   costs a few percent of throughput for its two windows, where a
///   re-measure that drops the limit to a floor sheds a burst.
///
/// ```
/// use std::time::Duration;
/// use tower_inflight::adaptive::{Algorithm, Capacity, Sample};
///
/// let mut capacity = Capacity::default();
/// let mut limit = 20;
/// // A dependency of 16 workers at 10 ms: 1,600 calls a second, and with
/// // 20 in flight each waits 12.5 ms. Ten seconds of it:
/// for call in 0..16_000u64 {
///     let now = Duration::from_micros(call * 625);
///     let latency = Duration::from_micros(10_000 * limit.max(16) as u64 / 16);
///     limit = capacity.update(&Sample::new(latency, limit, false, now), limit);
/// }
/// // Near 16 (a probe may have it a quarter lower for a moment).
/// assert!((12..=24).contains(&limit), "{limit}");
/// ```
#[derive(Clone, Debug)]
pub struct Capacity {
    window: Duration,
    min_samples: u64,
    /// Windows the baseline looks back over.
    history: usize,
    /// The window at which the next probe below the limit starts.
    next_probe: u64,
    /// Windows from a probe that found nothing new to the next.
    probe_gap: u64,
    /// How deep the next probe goes, in quarters off the limit: at start,
    /// each probe that finds a lower baseline is followed by one a quarter
    /// deeper, until one finds nothing lower.
    probe_depth: i32,
    /// Whether a probe has found nothing lower: the start is over.
    started_up: bool,
    /// Whether a probe ended with the last window.
    after_probe: bool,
    started: Option<Duration>,
    /// This window's latencies, in microseconds (up to `MAX_KEPT`).
    latencies: Vec<u32>,
    served: u64,
    drops: u64,
    peak_in_flight: usize,
    /// The latencies of the last `history` windows, in microseconds.
    past: VecDeque<u32>,
    baseline: Option<Duration>,
    /// The usual share of drops: an average over windows.
    drop_share: f64,
    /// The latency of the window that last cut the limit for queueing.
    cut_at: Option<Duration>,
    /// Cuts in a row after which latency was no lower.
    futile_cuts: u8,
    windows: u64,
    /// The probe under way, if one is.
    probing: Option<Probe>,
    /// The last two windows' throughputs, in calls a second.
    last_throughputs: [f64; 2],
    /// The limit before the cuts for queueing since the limit last grew
    /// back to it: a window with no queue doubles the limit up to it (the
    /// capacity came back), and grows it by half past it.
    before_cuts: usize,
}

/// A probe below the limit: a few windows with fewer calls in flight, to
/// measure latency without queueing.
#[derive(Clone, Copy, Debug)]
struct Probe {
    /// The limit to go back to.
    restore: usize,
    /// The share of it the probe keeps.
    lowered: f64,
    windows_left: u8,
    /// The baseline before it, to tell whether it found a lower one.
    baseline_before: Option<Duration>,
    /// The latency of the window before it, at the limit it lowered.
    latency_before: Duration,
}

/// The limit is set this much over the capacity measured: a queue of a
/// few calls keeps every worker of the dependency fed between one call's
/// end and the next call's arrival.
const HEADROOM: f64 = 1.2;
/// A window slower than this times the baseline queues.
const QUEUEING: f64 = 1.35;
/// A window within this times the baseline has room to grow into: a
/// tenth at a time.
const ROOM: f64 = 1.15;
/// A window within this times the baseline shows no queue at all: it
/// doubles up to the limit before the cuts, and grows by half past it.
const NO_QUEUE: f64 = 1.05;
/// Windows between probes that find nothing new, at first and at most.
/// (The history holds two of the longest: a probe spoiled by a change of
/// capacity that fell in it leaves the one before it in the history until
/// the next.)
const PROBE_GAPS: (u64, u64) = (30, 95);

/// The latencies a window keeps: more add little.
const MAX_KEPT: usize = 128;

/// `latency` in whole microseconds, up to about 71 minutes.
fn micros(latency: Duration) -> u32 {
    u32::try_from(latency.as_micros()).unwrap_or(u32::MAX)
}

impl Default for Capacity {
    fn default() -> Self {
        Self {
            window: Duration::from_millis(100),
            min_samples: 10,
            history: 200,
            next_probe: 5,
            probe_gap: PROBE_GAPS.0,
            probe_depth: 1,
            started_up: false,
            after_probe: false,
            started: None,
            latencies: Vec::new(),
            served: 0,
            drops: 0,
            peak_in_flight: 0,
            past: VecDeque::new(),
            baseline: None,
            drop_share: 0.0,
            cut_at: None,
            futile_cuts: 0,
            windows: 0,
            probing: None,
            last_throughputs: [0.0; 2],
            before_cuts: 0,
        }
    }
}

impl Capacity {
    /// The shortest window of samples (100 ms unless set; at least 1 ms).
    /// The baseline looks back over 200 windows, and probes come every 30
    /// to 95.
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window.max(Duration::from_millis(1));
        self
    }

    /// Ends the window, and returns the limit it leads to.
    fn close_window(&mut self, now: Duration, limit: usize) -> usize {
        let elapsed = now.saturating_sub(self.started.unwrap_or(now));
        self.started = Some(now);
        self.windows += 1;
        let served = std::mem::take(&mut self.served);
        let drops = std::mem::take(&mut self.drops);
        let peak = std::mem::take(&mut self.peak_in_flight);
        let latency = self.window_latency();
        // The highest of this window's and the last two's: a stall of the
        // dependency (or of the runtime), which may fall across two
        // windows, serves less than its capacity, and must not cut the
        // limit to that alone.
        let throughput = served as f64 / elapsed.as_secs_f64().max(1e-9);
        let [before_last, last] = self.last_throughputs;
        let recent_throughput = throughput.max(last).max(before_last);
        self.last_throughputs = [last, throughput];
        let share = drops as f64 / (served + drops) as f64;
        let usual_share = self.drop_share;
        self.drop_share = 0.9 * self.drop_share + 0.1 * share;

        self.remember(latency);
        if let Some(probe) = self.probing.take() {
            return self.go_on_probing(probe, limit);
        }
        // Before latency: a window of nothing but drops (an outage) has
        // none, and must cut all the same.
        if drops > 0 && share > (2.0 * usual_share).max(0.01) {
            self.cut_at = None;
            return (limit as f64 * 0.9) as usize;
        }
        let (Some(latency), Some(baseline)) = (latency, self.baseline) else {
            return limit;
        };
        // Calls of under a microsecond are measured as none.
        let baseline = baseline.max(Duration::from_micros(1));
        let slowdown = latency.as_secs_f64() / baseline.as_secs_f64();
        // Only a window that reached the limit can say the limit is too
        // high: under it, a slow window is the dependency's own noise.
        let reached = peak.saturating_mul(10) >= limit.saturating_mul(9);
        if slowdown > QUEUEING && reached {
            // The capacity measured, with the headroom.
            let capacity_of =
                |throughput: f64| (throughput * baseline.as_secs_f64() * HEADROOM).ceil() as usize;
            let target = capacity_of(recent_throughput);
            if target >= limit {
                if capacity_of(throughput) < limit {
                    // Only the windows before served enough: this one may
                    // be a stall, or the first of a change of capacity. No
                    // cut, and no probe (which would put a cut off); the
                    // cuts that did not bring latency down stay counted.
                    return limit;
                }
                // The capacity measured, rounded up to whole calls, is the
                // limit: no cut, and so none that could be futile (counted
                // so, two would take a queued latency for the baseline).
                self.cut_at = None;
                self.futile_cuts = 0;
                return self.probe_if_due(limit, latency).unwrap_or(limit);
            }
            let no_faster = self
                .cut_at
                .is_some_and(|before| latency.as_secs_f64() >= 0.95 * before.as_secs_f64());
            self.futile_cuts = if no_faster { self.futile_cuts + 1 } else { 0 };
            if self.futile_cuts >= 2 {
                // Two cuts, and no faster: the dependency is slower, not
                // queued. (One is not enough: a cut made on a window that
                // a change of capacity fell in halfway measured a
                // throughput between the old and the new, and the next
                // window, all of the new, is slower still.)
                self.past.clear();
                self.remember(Some(latency));
                self.cut_at = None;
                self.futile_cuts = 0;
                return limit;
            }
            self.cut_at = Some(latency);
            self.before_cuts = self.before_cuts.max(limit);
            return target.clamp(limit / 2, limit);
        }
        self.futile_cuts = 0;
        self.cut_at = None;
        if let Some(probe) = self.probe_if_due(limit, latency) {
            return probe;
        }
        // (Not before a probe has found the baseline: until then, it may
        // be the latency of a queue.)
        // Nor in the window after a probe: its calls were admitted under
        // the probe's lower limit, and did not queue.
        let after_probe = std::mem::take(&mut self.after_probe);
        if !reached || slowdown > ROOM || !self.started_up || after_probe {
            return limit;
        }
        // No queue at all: capacity returned, and the limit may be far
        // under it (back to where it was before the cuts at once, by half
        // past it); a queue starting: close to it.
        if slowdown > NO_QUEUE {
            return limit.saturating_add(limit.div_ceil(10));
        }
        if limit < self.before_cuts {
            return limit.saturating_mul(2).min(self.before_cuts);
        }
        self.before_cuts = 0;
        limit.saturating_add(limit.div_ceil(2))
    }

    /// The limit of a probe, if one is due: it starts.
    fn probe_if_due(&mut self, limit: usize, latency: Duration) -> Option<usize> {
        if self.windows < self.next_probe {
            return None;
        }
        let lowered = 0.75f64.powi(self.probe_depth);
        self.probing = Some(Probe {
            restore: limit,
            lowered,
            windows_left: 2,
            baseline_before: self.baseline,
            latency_before: latency,
        });
        Some((limit as f64 * lowered) as usize)
    }

    /// A window of `probe` ended: the limit stays down for its windows,
    /// which add their latencies to the history, then goes back to where
    /// it was, for the rules to move on from the next window. A probe that
    /// found latency falling with the limit is followed by another soon (at
    /// start, a quarter deeper: the limit may have begun well over
    /// capacity); one that found nothing lower waits twice as long for the
    /// next, up to 10 s.
    fn go_on_probing(&mut self, probe: Probe, limit: usize) -> usize {
        if probe.windows_left > 1 {
            self.probing = Some(Probe {
                windows_left: probe.windows_left - 1,
                ..probe
            });
            return limit;
        }
        // Whether the baseline fell; and whether latency fell by about as
        // much as the limit: then the probe still queued (at start, go
        // deeper), else it found the latency without a queue.
        let found_lower = match (probe.baseline_before, self.baseline) {
            (Some(before), Some(now)) => now.as_secs_f64() < 0.95 * before.as_secs_f64(),
            _ => false,
        };
        let fell = self.baseline.map_or(1.0, |now| {
            now.as_secs_f64() / probe.latency_before.as_secs_f64().max(1e-9)
        });
        let still_queued = found_lower && fell <= probe.lowered * 1.05;
        self.probe_gap = if found_lower {
            PROBE_GAPS.0
        } else {
            self.probe_gap.saturating_mul(2).min(PROBE_GAPS.1)
        };
        self.started_up |= !still_queued;
        self.probe_depth = if still_queued && !self.started_up {
            (self.probe_depth + 1).min(8)
        } else {
            1
        };
        self.next_probe = self.windows + if still_queued { 5 } else { self.probe_gap };
        self.after_probe = true;
        probe.restore.max(limit)
    }

    /// This window's latency, if it served any call: the mean of its
    /// latencies above the fifth that came back first. Calls that did no
    /// work come back first, and drop out; calls that queued come back
    /// last, and count in full (a median would not see a queue until half
    /// the calls wait). Clears the window's latencies.
    fn window_latency(&mut self) -> Option<Duration> {
        if self.latencies.is_empty() {
            return None;
        }
        self.latencies.sort_unstable();
        let kept = &self.latencies[self.latencies.len() / 5..];
        let mean = kept.iter().map(|&micros| u64::from(micros)).sum::<u64>() / kept.len() as u64;
        self.latencies.clear();
        Some(Duration::from_micros(mean))
    }

    /// Keeps a window's latency for the baseline.
    fn remember(&mut self, latency: Option<Duration>) {
        if let Some(latency) = latency {
            if self.past.len() == self.history {
                self.past.pop_front();
            }
            self.past.push_back(micros(latency));
        }
        self.baseline = self
            .past
            .iter()
            .min()
            .map(|&least| Duration::from_micros(u64::from(least)));
    }
}

impl Algorithm for Capacity {
    fn update(&mut self, sample: &Sample, limit: usize) -> usize {
        // A window starts again at a sample from before it (a clock that
        // went back, or a window started at a time far in the future).
        if self.started.is_some_and(|started| sample.now < started) {
            self.started = Some(sample.now);
        }
        let started = *self.started.get_or_insert(sample.now);
        if sample.dropped {
            self.drops += 1;
        } else {
            // Past `MAX_KEPT`, the latest replace the earliest.
            if self.latencies.len() < MAX_KEPT {
                self.latencies.push(micros(sample.latency));
            } else {
                self.latencies[self.served as usize % MAX_KEPT] = micros(sample.latency);
            }
            self.served += 1;
        }
        self.peak_in_flight = self.peak_in_flight.max(sample.in_flight);
        let samples = self.served + self.drops;
        // At least twice the baseline: a window shorter than a call holds
        // only calls admitted before the last move, and could not see it.
        let window = self.window.max(
            self.baseline
                .map_or(Duration::ZERO, |baseline| baseline.saturating_mul(2)),
        );
        if sample.now.saturating_sub(started) < window || samples < self.min_samples {
            return limit;
        }
        self.close_window(sample.now, limit)
    }

    fn baseline(&self) -> Option<Duration> {
        self.baseline
    }
}
