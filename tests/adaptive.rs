//! Adaptive limits: each algorithm's answer to drops and to latency, the
//! complaints users of other limiters make (each as a test), and what the
//! bulkhead promises while the limit moves.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
use tower_inflight::adaptive::{
    Adaptive, Aimd, Algorithm, Capacity, Gradient2, Outcome, Sample, Vegas,
};
use tower_inflight::{BoxError, Bulkhead, ConcurrencyLayer, Config, Event, ManualClock};

const MS: Duration = Duration::from_millis(1);

fn sample(latency_ms: u64, in_flight: usize, dropped: bool) -> Sample {
    Sample::new(
        Duration::from_millis(latency_ms),
        in_flight,
        dropped,
        Duration::ZERO,
    )
}

// ---- Each algorithm alone --------------------------------------------------

#[test]
fn aimd_takes_a_tenth_off_a_drop_and_adds_one_while_in_use() {
    let mut aimd = Aimd::default();
    assert_eq!(aimd.update(&sample(10, 50, true), 50), 45);
    assert_eq!(aimd.update(&sample(10, 25, false), 50), 51);
    // Fewer than half in flight: nothing learned.
    assert_eq!(aimd.update(&sample(10, 24, false), 50), 50);
    // Slower than its timeout: a drop.
    assert_eq!(aimd.update(&sample(6_000, 50, false), 50), 45);
}

#[test]
fn vegas_grows_without_a_queue_and_shrinks_with_one() {
    let mut vegas = Vegas::default();
    vegas.update(&sample(10, 20, false), 20);
    let grown = vegas.update(&sample(10, 20, false), 20);
    assert!(grown > 20, "{grown}");
    // Twice the least latency: half the limit queues.
    let shrunk = vegas.update(&sample(20, grown, false), grown);
    assert!(shrunk < grown, "{shrunk} after {grown}");
    let dropped = vegas.update(&sample(10, shrunk, true), shrunk);
    assert!(dropped < shrunk, "{dropped} after {shrunk}");
}

#[test]
fn gradient2_shrinks_when_latency_jumps_and_grows_while_steady() {
    let mut gradient = Gradient2::default();
    let mut limit = 20;
    for _ in 0..50 {
        limit = gradient.update(&sample(10, limit, false), limit);
    }
    assert!(limit > 20, "{limit}");
    let before = limit;
    for _ in 0..20 {
        limit = gradient.update(&sample(100, limit, false), limit);
    }
    assert!(limit < before, "{limit} after {before}");
}

/// A dependency that refuses at once (its own load shedder, a 503 in
/// 100 µs) says its limit is too high, and no more: the refusal's latency
/// is not the least a call can take.
#[test]
fn vegas_shrinks_on_a_fast_drop_and_keeps_its_least_latency() {
    let mut vegas = Vegas::default();
    let mut limit = 40;
    for _ in 0..5 {
        limit = vegas.update(&sample(10, limit, false), limit);
    }
    assert_eq!(vegas.baseline(), Some(10 * MS));
    let fast_drop = Sample::new(Duration::from_micros(100), limit, true, Duration::ZERO);
    let dropped = vegas.update(&fast_drop, limit);
    assert!(dropped < limit, "{dropped} after {limit}");
    assert_eq!(
        vegas.baseline(),
        Some(10 * MS),
        "a drop's latency is no sample"
    );
    // The calls after it, at the latency without a queue, grow it again.
    let after = vegas.update(&sample(10, dropped, false), dropped);
    assert!(after > dropped, "{after} after {dropped}");
}

#[test]
fn gradient2_takes_no_sample_from_drops() {
    let mut gradient = Gradient2::default();
    let mut limit = 60;
    for _ in 0..50 {
        limit = gradient.update(&sample(10, limit, false), limit);
    }
    let before = limit;
    let fast_drop = Sample::new(Duration::from_micros(100), limit, true, Duration::ZERO);
    for _ in 0..200 {
        limit = gradient.update(&fast_drop, limit);
    }
    assert_eq!(limit, before, "fast refusals moved it");
}

// ---- A simulated dependency ------------------------------------------------

/// A dependency of `capacity` workers, each call taking `base` once a
/// worker takes it, with a queue in front; called by a bulkhead that is
/// always full (more callers than the limit), so that every free slot is
/// taken at once. Returns the limit every 100 ms.
struct Dependency {
    base: Duration,
    /// (from, capacity): the capacity from that time on.
    capacity: Vec<(Duration, usize)>,
    /// Every `nth` served call comes back at once, having done no work.
    no_work_every: Option<u64>,
    /// Every `nth` call is dropped (times out) whatever the load.
    drop_every: Option<u64>,
    /// (from, base): each call takes this long from then on.
    slower: Option<(Duration, Duration)>,
    /// Whether service times are spread exponentially about the base (a
    /// deterministic sequence), rather than all the base.
    exponential: bool,
    /// Calls a second arriving on their own (Poisson, open loop), shed when
    /// the bulkhead is full; `None`: the bulkhead is kept full.
    arrivals: Option<f64>,
    /// Calls shed and admitted by the last open-loop run.
    counted: std::cell::Cell<(u64, u64)>,
}

impl Dependency {
    fn new(base: Duration, capacity: usize) -> Self {
        Self {
            base,
            capacity: vec![(Duration::ZERO, capacity)],
            no_work_every: None,
            drop_every: None,
            slower: None,
            exponential: false,
            arrivals: None,
            counted: std::cell::Cell::new((0, 0)),
        }
    }

    /// The share of arrivals shed in the last open-loop run.
    fn shed_share(&self) -> f64 {
        let (shed, admitted) = self.counted.get();
        shed as f64 / (shed + admitted).max(1) as f64
    }

    fn base_at(&self, now: Duration) -> Duration {
        match self.slower {
            Some((from, base)) if now >= from => base,
            _ => self.base,
        }
    }

    fn capacity_at(&self, now: Duration) -> usize {
        self.capacity
            .iter()
            .rev()
            .find(|(from, _)| *from <= now)
            .map_or(1, |(_, capacity)| *capacity)
    }

    /// Runs `algorithm` for `length`, starting at `limit`.
    fn run(&self, algorithm: &mut dyn Algorithm, mut limit: usize, length: Duration) -> Vec<usize> {
        // Completions: (finish time, start time, in flight at start, call).
        let mut finishing: BinaryHeap<Reverse<(Duration, Duration, usize, u64)>> =
            BinaryHeap::new();
        let mut queue: VecDeque<(Duration, usize, u64)> = VecDeque::new();
        let mut busy = 0;
        let mut in_flight = 0;
        let mut now = Duration::ZERO;
        let mut call = 0u64;
        let mut limits = Vec::new();
        let mut next_report = Duration::ZERO;
        let (mut random, mut next_arrival) = (0x2545_F491_4F6C_DD1Du64, Duration::ZERO);
        let (mut shed, mut admitted) = (0u64, 0u64);
        while now < length {
            // Fill the bulkhead, or take the next arrival if it comes
            // before the next call ends.
            let next_end = finishing.peek().map(|Reverse((end, ..))| *end);
            let mut arrived = false;
            match self.arrivals {
                None => {
                    while in_flight < limit {
                        in_flight += 1;
                        call += 1;
                        queue.push_back((now, in_flight, call));
                    }
                }
                Some(rate) if next_end.is_none_or(|end| next_arrival < end) => {
                    now = next_arrival;
                    arrived = true;
                    random ^= random << 13;
                    random ^= random >> 7;
                    random ^= random << 17;
                    let uniform = ((random >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
                    next_arrival += Duration::from_secs_f64(-uniform.ln() / rate);
                    if in_flight < limit {
                        in_flight += 1;
                        call += 1;
                        admitted += 1;
                        queue.push_back((now, in_flight, call));
                    } else {
                        shed += 1;
                    }
                }
                Some(_) => {}
            }
            // Workers take queued calls (capacity may have dropped below
            // `busy`: then none starts until enough finish).
            while busy < self.capacity_at(now) {
                let Some((started, at_start, call)) = queue.pop_front() else {
                    break;
                };
                busy += 1;
                let took = if self.no_work_every.is_some_and(|nth| call % nth == 0) {
                    Duration::from_micros(1)
                } else if self.exponential {
                    // An exponential draw from a fixed hash of the call.
                    let hashed = call.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 11;
                    let uniform = (hashed as f64 + 0.5) / (1u64 << 53) as f64;
                    self.base_at(now).mul_f64(-uniform.ln())
                } else {
                    self.base_at(now)
                };
                finishing.push(Reverse((now + took, started, at_start, call)));
            }
            if arrived {
                // An arrival came first: its turn was taken above.
                continue;
            }
            let Some(Reverse((finished, started, at_start, call))) = finishing.pop() else {
                break;
            };
            now = finished;
            busy -= 1;
            in_flight -= 1;
            while next_report <= now {
                limits.push(limit);
                next_report += 100 * MS;
            }
            let dropped = self.drop_every.is_some_and(|nth| call % nth == 0);
            let sample = Sample::new(now - started, at_start, dropped, now);
            limit = algorithm.update(&sample, limit).clamp(1, 1_000);
        }
        self.counted.set((shed, admitted));
        limits
    }
}

fn within(limit: usize, capacity: usize) -> bool {
    limit * 4 >= capacity * 3 && limit * 2 <= capacity * 3
}

/// The first time from `from` (in 100 ms steps) after which the limit
/// stays within 0.75-1.5 times `capacity` until `until`.
fn settled_after(limits: &[usize], from: usize, until: usize, capacity: usize) -> Option<usize> {
    (from..until).find(|&start| {
        limits[start..until]
            .iter()
            .all(|&limit| within(limit, capacity))
    })
}

#[test]
fn capacity_follows_a_dependency_whose_capacity_halves_and_returns() {
    let mut dependency = Dependency::new(10 * MS, 16);
    dependency.capacity = vec![
        (Duration::ZERO, 16),
        (Duration::from_secs(20), 8),
        (Duration::from_secs(40), 16),
    ];
    let limits = dependency.run(&mut Capacity::default(), 20, Duration::from_secs(60));
    for (from, until, capacity) in [(0, 200, 16), (200, 400, 8), (400, 600, 16)] {
        let settled = settled_after(&limits, from, until, capacity)
            .unwrap_or_else(|| panic!("never settled near {capacity}: {:?}", &limits[from..until]));
        assert!(
            settled - from <= 50,
            "settled near {capacity} after {} ms: {:?}",
            (settled - from) * 100,
            &limits[from..until]
        );
    }
}

/// A dependency (or a runtime) that stalls now and then serves little in
/// the windows of a stall, and its calls come back late: the limit is not
/// cut to what those windows served, wherever the stall falls in them.
#[test]
fn capacity_is_not_cut_by_a_short_stall() {
    for offset_ms in (0..100).step_by(10) {
        let mut dependency = Dependency::new(10 * MS, 16);
        // A stall of 60 ms (one worker left) every 2 s from 5 s on.
        dependency.capacity = vec![(Duration::ZERO, 16)];
        for stall in 0..12u32 {
            let at = Duration::from_secs(5) + stall * 2 * Duration::from_secs(1) + offset_ms * MS;
            dependency.capacity.push((at, 1));
            dependency.capacity.push((at + 60 * MS, 16));
        }
        let limits = dependency.run(&mut Capacity::default(), 20, Duration::from_secs(30));
        let after = &limits[40..];
        assert!(
            after.iter().all(|&limit| within(limit, 16)),
            "stalls {offset_ms} ms into a second: {after:?}"
        );
    }
}

/// Arrivals just under the capacity: the limit is seldom reached, and a
/// window with no queue grows it, but it does not creep far over the
/// capacity (a burst would then be let in to queue).
#[test]
fn capacity_does_not_creep_up_under_load_just_under_capacity() {
    let mut dependency = Dependency::new(10 * MS, 32);
    dependency.exponential = true;
    // 95 % of what 32 workers serve.
    dependency.arrivals = Some(0.95 * 3_200.0);
    let limits = dependency.run(&mut Capacity::default(), 20, Duration::from_secs(120));
    let mean = limits.iter().sum::<usize>() as f64 / limits.len() as f64;
    assert!(mean <= 2.0 * 32.0, "mean limit {mean:.1}: {limits:?}");
}

/// Wherever in a window the capacity halves, the limit follows within
/// 5 s (a cut made on a window the change fell in halfway is too shallow,
/// and must not be taken for a slower dependency).
#[test]
fn capacity_follows_a_halving_wherever_it_falls_in_a_window() {
    for offset_ms in (0..100).step_by(5) {
        let mut dependency = Dependency::new(10 * MS, 16);
        let change = Duration::from_secs(10) + offset_ms * MS;
        dependency.capacity = vec![(Duration::ZERO, 16), (change, 8)];
        let limits = dependency.run(&mut Capacity::default(), 20, Duration::from_secs(20));
        let settled = settled_after(&limits, 101, 200, 8);
        assert!(
            settled.is_some_and(|at| at - 101 <= 50),
            "change at +{offset_ms} ms: {:?}",
            &limits[100..200]
        );
    }
}

/// A dependency whose every call becomes twice as slow, its capacity the
/// same: the limit does not collapse, and is back near capacity within
/// 5 s, the baseline taken afresh.
#[test]
fn capacity_holds_when_the_dependency_becomes_slower_for_good() {
    let mut dependency = Dependency::new(10 * MS, 16);
    dependency.slower = Some((Duration::from_secs(10), 20 * MS));
    let limits = dependency.run(&mut Capacity::default(), 20, Duration::from_secs(30));
    let settled = settled_after(&limits, 100, 300, 16);
    assert!(
        settled.is_some_and(|at| at - 100 <= 50),
        "{:?}",
        &limits[100..300]
    );
    assert!(
        limits[100..].iter().all(|&limit| limit >= 4),
        "{:?}",
        &limits[100..]
    );
}

/// Started well over a small capacity (20 against 8): the first probes
/// find the latency without queueing, and the limit comes near capacity
/// within 5 s.
#[test]
fn capacity_started_over_a_small_capacity_comes_down_to_it() {
    let limits =
        Dependency::new(10 * MS, 8).run(&mut Capacity::default(), 20, Duration::from_secs(20));
    let settled = settled_after(&limits, 0, 200, 8);
    assert!(settled.is_some_and(|at| at <= 50), "{limits:?}");
}

/// Service times spread exponentially (the latency of each window is
/// noisy, its baseline the least of a hundred of them): the limit does not
/// fall away from the capacity.
#[test]
fn capacity_holds_near_capacity_with_spread_service_times() {
    let mut dependency = Dependency::new(10 * MS, 32);
    dependency.exponential = true;
    let limits = dependency.run(&mut Capacity::default(), 20, Duration::from_secs(120));
    let last = &limits[limits.len() / 2..];
    let least = *last.iter().min().unwrap();
    let mean = last.iter().sum::<usize>() as f64 / last.len() as f64;
    assert!(
        least >= 16 && mean <= 1.6 * 32.0,
        "least {least}, mean {mean}: {last:?}"
    );
}

/// Open-loop arrivals below capacity (80 % of 32 workers; 5 calls in
/// flight on average against no limit at all), service times spread
/// exponentially: nothing is overloaded, and the limit sheds little (a
/// noisy window, slow with the limit not reached, says nothing).
#[test]
fn capacity_sheds_little_below_capacity_with_spread_service_times() {
    for (workers, rate) in [(32, 0.8 * 3_200.0), (100_000, 500.0)] {
        let mut dependency = Dependency::new(10 * MS, workers);
        dependency.exponential = true;
        dependency.arrivals = Some(rate);
        let limits = dependency.run(&mut Capacity::default(), 20, Duration::from_secs(120));
        let shed = dependency.shed_share();
        assert!(
            shed < 0.05,
            "{workers} workers, {rate}/s: shed {:.1} %: {:?}",
            shed * 100.0,
            &limits[limits.len() - 100..]
        );
    }
}

#[test]
fn capacity_keeps_no_saw_tooth_under_steady_load() {
    let limits =
        Dependency::new(10 * MS, 32).run(&mut Capacity::default(), 20, Duration::from_secs(30));
    let steady = &limits[100..];
    let (low, high) = (steady.iter().min().unwrap(), steady.iter().max().unwrap());
    assert!(*low >= 24 && *high <= 48, "{low}..={high}: {steady:?}");
    let moves = steady.windows(2).filter(|pair| pair[0] != pair[1]).count();
    assert!(
        moves <= steady.len() / 4,
        "{moves} moves in {} steps: {steady:?}",
        steady.len()
    );
}

/// Envoy's adaptive concurrency re-measures its least latency by dropping
/// the limit to a floor, and sheds a burst each time. `Capacity`'s probes
/// take a quarter off for two windows: offered twice the capacity, past the
/// start-up the limit never goes below 70 % of where it mostly stands, and
/// probes do come (so the check is not empty).
#[test]
fn capacity_probes_take_a_quarter_off_never_the_limit_to_a_floor() {
    let mut dependency = Dependency::new(10 * MS, 32);
    dependency.arrivals = Some(2.0 * 3_200.0);
    let limits = dependency.run(&mut Capacity::default(), 20, Duration::from_secs(120));
    let steady = &limits[100..];
    let mut sorted = steady.to_vec();
    sorted.sort_unstable();
    let (least, usual) = (sorted[0], sorted[sorted.len() / 2]);
    let dips = steady.windows(2).filter(|pair| pair[1] < pair[0]).count();
    assert!(dips >= 5, "{dips} dips in 110 s: {steady:?}");
    assert!(
        least as f64 >= 0.7 * usual as f64,
        "least {least}, usually {usual}: {steady:?}"
    );
}

#[test]
fn capacity_does_not_drift_down_under_steady_drops_unrelated_to_load() {
    let mut dependency = Dependency::new(10 * MS, 32);
    dependency.drop_every = Some(20); // 5 % of calls, whatever the load
    let limits = dependency.run(&mut Capacity::default(), 20, Duration::from_secs(30));
    let last = &limits[200..];
    assert!(last.iter().all(|&limit| within(limit, 32)), "{last:?}");
}

#[test]
fn capacity_is_not_dragged_by_calls_that_did_no_work() {
    let mut dependency = Dependency::new(10 * MS, 16);
    dependency.no_work_every = Some(10); // a tenth come back at once
    let mut capacity = Capacity::default();
    let limits = dependency.run(&mut capacity, 20, Duration::from_secs(30));
    let baseline = capacity.baseline().unwrap();
    assert!(baseline >= 9 * MS, "baseline {baseline:?}");
    let last = &limits[100..];
    // The calls that did no work free their workers at once: the capacity
    // is a little over 16.
    assert!(
        last.iter().all(|&limit| (12..=28).contains(&limit)),
        "{last:?}"
    );
}

#[test]
fn capacity_holds_its_limit_while_few_calls_are_in_flight() {
    let mut capacity = Capacity::default();
    let mut limit = 50;
    for call in 0..10_000u64 {
        let now = Duration::from_micros(call * 1_000);
        limit = capacity.update(&Sample::new(10 * MS, 5, false, now), limit);
    }
    assert_eq!(limit, 50);
}

// ---- Through the bulkhead --------------------------------------------------

/// Why a call through a layer was shed.
fn shed_reason(error: &BoxError) -> tower_inflight::ShedReason {
    error
        .downcast_ref::<tower_inflight::ServiceSaturated>()
        .expect("shed by the bulkhead")
        .reason()
}

/// Counts its samples and answers with a limit set from outside.
#[derive(Clone)]
struct Scripted {
    samples: Arc<Mutex<Vec<Sample>>>,
    next: Arc<AtomicUsize>,
}

impl Scripted {
    fn new(next: usize) -> Self {
        Self {
            samples: Arc::default(),
            next: Arc::new(AtomicUsize::new(next)),
        }
    }

    fn samples(&self) -> Vec<Sample> {
        self.samples.lock().unwrap().clone()
    }
}

impl Algorithm for Scripted {
    fn update(&mut self, sample: &Sample, _limit: usize) -> usize {
        self.samples.lock().unwrap().push(*sample);
        self.next.load(Ordering::SeqCst)
    }
}

#[test]
fn a_configuration_out_of_bounds_names_its_field() {
    let config = || Config::new(10, Duration::from_secs(30));
    let error = config()
        .adaptive(Adaptive::default().min(0))
        .validate()
        .unwrap_err();
    assert_eq!(error.field(), "adaptive.min");
    let error = config()
        .adaptive(Adaptive::default().min(11))
        .validate()
        .unwrap_err();
    assert_eq!(error.field(), "adaptive.min");
    let error = config()
        .adaptive(Adaptive::default().min(2).initial(1))
        .validate()
        .unwrap_err();
    assert_eq!(error.field(), "adaptive.initial");
    let error = config()
        .adaptive(Adaptive::default().initial(11))
        .validate()
        .unwrap_err();
    assert_eq!(error.field(), "adaptive.initial");
    // The default start, 20, is kept under a lower maximum.
    assert_eq!(
        Bulkhead::new(config().adaptive(Adaptive::default())).limit(),
        10
    );
}

#[tokio::test]
async fn sheds_waits_and_cancelled_calls_never_feed_the_algorithm() {
    let scripted = Scripted::new(1);
    let layer = ConcurrencyLayer::new(
        Config::new(4, Duration::from_secs(30))
            .adaptive(Adaptive::new(scripted.clone()).initial(1)),
    );
    let bulkhead = layer.bulkhead();
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let released = Arc::new(Mutex::new(Some(released)));
    let mut service = ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(move |wait: bool| {
            let released = released.lock().unwrap().take();
            async move {
                if wait {
                    if let Some(released) = released {
                        let _ = released.await;
                    }
                }
                Ok::<_, BoxError>(())
            }
        }));
    // One call holds the only slot; the next is shed.
    let holding = service.ready().await.unwrap().call(true);
    let holding = tokio::spawn(holding);
    while bulkhead.in_flight() == 0 {
        tokio::task::yield_now().await;
    }
    let shed = service.ready().await.unwrap().call(false).await;
    assert!(shed.is_err());
    assert!(scripted.samples().is_empty(), "a shed was sampled");
    release.send(()).unwrap();
    holding.await.unwrap().unwrap();
    assert_eq!(scripted.samples().len(), 1);
    assert!(!scripted.samples()[0].dropped);

    // A call cancelled before it finished is no sample.
    let pending = service.ready().await.unwrap().call(true);
    drop(pending);
    assert_eq!(scripted.samples().len(), 1);
    assert_eq!(bulkhead.in_flight(), 0);
}

/// A caller's wait is no part of its sample (its latency runs from its
/// admission), and a caller shed once its wait budget ran out is no sample.
#[tokio::test(start_paused = true)]
async fn a_wait_is_no_sample_nor_any_part_of_one() {
    let scripted = Scripted::new(1);
    let clock = ManualClock::new();
    let layer = ConcurrencyLayer::new(
        Config::new(4, Duration::from_secs(30))
            .wait(Duration::from_secs(1))
            .clock(clock.clone())
            .adaptive(Adaptive::new(scripted.clone()).initial(1)),
    );
    let bulkhead = layer.bulkhead();
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let released = Arc::new(Mutex::new(Some(released)));
    let service = ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(move |hold: bool| {
            let released = released.lock().unwrap().take();
            async move {
                if let (true, Some(released)) = (hold, released) {
                    let _ = released.await;
                }
                Ok::<_, BoxError>(())
            }
        }));
    // One call holds the only slot; a caller waits for it while the
    // bulkhead's clock moves half a second.
    let holding = tokio::spawn(service.clone().oneshot(true));
    while bulkhead.in_flight() == 0 {
        tokio::task::yield_now().await;
    }
    let waiting = tokio::spawn(service.clone().oneshot(false));
    while bulkhead.waiting() == 0 {
        tokio::task::yield_now().await;
    }
    clock.advance(Duration::from_millis(500));
    release.send(()).unwrap();
    holding.await.unwrap().unwrap();
    waiting.await.unwrap().unwrap();
    let mut latencies: Vec<_> = scripted.samples().iter().map(|s| s.latency).collect();
    latencies.sort();
    assert_eq!(latencies.len(), 2, "{latencies:?}");
    assert!(
        latencies[0] < Duration::from_millis(500) && latencies[1] >= Duration::from_millis(500),
        "the waiter's half second of waiting was sampled: {latencies:?}"
    );

    // A caller that waits out its budget (tokio's paused time moves on to
    // it) is shed, and is no sample.
    let mut held = bulkhead.try_acquire().unwrap();
    let shed = service.clone().oneshot(false).await.unwrap_err();
    assert_eq!(shed_reason(&shed), tower_inflight::ShedReason::WaitExpired);
    assert_eq!(
        scripted.samples().len(),
        2,
        "a caller shed after waiting was sampled"
    );
    held.record(Outcome::Ignore);
}

/// A service that found room in `poll_ready` holds nothing until its
/// `call`: an adaptive limit lowered meanwhile sheds the call at once,
/// without waiting, though a `wait` budget is set.
#[tokio::test(start_paused = true)]
async fn a_limit_lowered_between_poll_ready_and_call_sheds_the_call_at_once() {
    let scripted = Scripted::new(2);
    let layer = ConcurrencyLayer::new(
        Config::new(4, Duration::from_secs(30))
            .wait(Duration::from_secs(10))
            .adaptive(Adaptive::new(scripted.clone()).initial(2)),
    );
    let bulkhead = layer.bulkhead();
    let mut service = ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(|()| async { Ok::<_, BoxError>(()) }));
    let held = bulkhead.try_acquire().unwrap();
    let ready = service.ready().await.unwrap();
    // A call held elsewhere ends, and its outcome lowers the limit to 1,
    // which the one still held fills.
    let mut other = bulkhead.try_acquire().unwrap();
    drop(held);
    scripted.next.store(1, Ordering::SeqCst);
    other.record(Outcome::Success);
    assert_eq!(bulkhead.limit(), 1);
    let started = tokio::time::Instant::now();
    let shed = ready.call(()).await.unwrap_err();
    assert_eq!(shed_reason(&shed), tower_inflight::ShedReason::LimitReached);
    assert_eq!(started.elapsed(), Duration::ZERO, "the call waited");
    drop(other);
}

#[tokio::test]
async fn a_timeout_is_a_drop_and_other_errors_are_ignored_unless_classified() {
    let scripted = Scripted::new(4);
    let config = || Config::new(4, Duration::from_secs(30));
    let layer = ConcurrencyLayer::new(config().adaptive(Adaptive::new(scripted.clone())));
    let mut service =
        ServiceBuilder::new()
            .layer(layer)
            .service(service_fn(|timeout: bool| async move {
                if timeout {
                    Err::<(), BoxError>(tower::timeout::error::Elapsed::new().into())
                } else {
                    Err::<(), BoxError>("refused before any I/O".into())
                }
            }));
    assert!(service.ready().await.unwrap().call(true).await.is_err());
    assert!(service.ready().await.unwrap().call(false).await.is_err());
    let samples = scripted.samples();
    assert_eq!(samples.len(), 1);
    assert!(samples[0].dropped);

    let classified = Scripted::new(4);
    let layer = ConcurrencyLayer::new(
        config().adaptive(Adaptive::new(classified.clone()).classify_errors(|_| Outcome::Dropped)),
    );
    let mut service = ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(|()| async {
            Err::<(), BoxError>("connection refused".into())
        }));
    assert!(service.ready().await.unwrap().call(()).await.is_err());
    assert_eq!(classified.samples().len(), 1);
    assert!(classified.samples()[0].dropped);
}

#[tokio::test(start_paused = true)]
async fn a_growing_limit_hands_its_room_to_the_callers_waiting() {
    let scripted = Scripted::new(1);
    let bulkhead = Bulkhead::new(
        Config::new(4, Duration::from_secs(30))
            .wait(Duration::from_secs(10))
            .adaptive(Adaptive::new(scripted.clone()).initial(1)),
    );
    let mut holder = bulkhead.try_acquire().unwrap();
    let waiting = {
        let bulkhead = bulkhead.clone();
        tokio::spawn(async move { bulkhead.acquire().await })
    };
    while bulkhead.waiting() == 0 {
        tokio::task::yield_now().await;
    }
    scripted.next.store(2, Ordering::SeqCst);
    holder.record(Outcome::Success);
    assert_eq!(bulkhead.limit(), 2);
    // Admitted while the holder still holds its slot.
    let admitted = waiting.await.unwrap().unwrap();
    assert_eq!(bulkhead.in_flight(), 2);
    drop((holder, admitted));
}

#[test]
fn a_limit_changed_is_an_event_and_in_the_status() {
    let changes = Arc::new(Mutex::new(Vec::new()));
    let seen = changes.clone();
    let bulkhead = Bulkhead::new(
        Config::new(100, Duration::from_secs(30))
            .clock(ManualClock::new())
            .on_event(move |event| {
                if let Event::LimitChanged { from, to } = event {
                    seen.lock().unwrap().push((*from, *to));
                }
            })
            .adaptive(Adaptive::new(Aimd::default())),
    );
    let mut permit = bulkhead.try_acquire().unwrap();
    permit.record(Outcome::Dropped);
    assert_eq!(*changes.lock().unwrap(), vec![(20, 18)]);
    let status = bulkhead.status();
    assert_eq!((status.limit, status.max_limit), (18, 100));
}

#[test]
fn a_permit_dropped_is_a_success_and_one_recorded_is_sampled_once() {
    let scripted = Scripted::new(10);
    let clock = ManualClock::new();
    let bulkhead = Bulkhead::new(
        Config::new(10, Duration::from_secs(30))
            .clock(clock.clone())
            .adaptive(Adaptive::new(scripted.clone()).initial(10)),
    );
    let _other = bulkhead.try_acquire().unwrap();
    let permit = bulkhead.try_acquire().unwrap();
    clock.advance(7 * MS);
    drop(permit);
    let mut recorded = bulkhead.try_acquire_borrowed().unwrap();
    recorded.record(Outcome::Ignore);
    drop(recorded);
    let samples = scripted.samples();
    assert_eq!(samples.len(), 1);
    assert_eq!(
        (samples[0].latency, samples[0].in_flight, samples[0].dropped),
        (7 * MS, 2, false)
    );
}

/// A call longer than its start can tell (kept in 32 bits of
/// microseconds: 71 min 35 s) is no sample: its latency would wrap to a
/// few milliseconds, and be taken for the fastest call yet.
#[test]
fn a_call_of_over_an_hour_is_no_sample() {
    let scripted = Scripted::new(10);
    let clock = ManualClock::new();
    let bulkhead = Bulkhead::new(
        Config::new(10, Duration::from_secs(3 * 3_600))
            .clock(clock.clone())
            .adaptive(Adaptive::new(scripted.clone()).initial(10)),
    );
    let long = bulkhead.try_acquire().unwrap();
    clock.advance(Duration::from_micros(1 << 32) + 5 * MS);
    drop(long);
    assert!(scripted.samples().is_empty(), "{:?}", scripted.samples());
    let short = bulkhead.try_acquire().unwrap();
    clock.advance(5 * MS);
    drop(short);
    assert_eq!(scripted.samples().len(), 1);
    assert_eq!(scripted.samples()[0].latency, 5 * MS);
}

/// Many threads claim and release while the limit shrinks from 64 to 4:
/// once the calls in flight are under 4, never more than 4 hold a slot.
#[test]
fn the_limit_is_never_exceeded_while_it_shrinks() {
    let scripted = Scripted::new(64);
    let bulkhead = Bulkhead::new(
        Config::new(64, Duration::from_secs(30))
            .adaptive(Adaptive::new(scripted.clone()).initial(64)),
    );
    let holding = AtomicUsize::new(0);
    let under = AtomicBool::new(false);
    let most_after = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        for _ in 0..8 {
            scope.spawn(|| {
                while !stop.load(Ordering::SeqCst) {
                    let Ok(mut permit) = bulkhead.try_acquire() else {
                        std::thread::yield_now();
                        continue;
                    };
                    let checking = under.load(Ordering::SeqCst);
                    let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                    if checking {
                        most_after.fetch_max(now, Ordering::SeqCst);
                    }
                    std::thread::yield_now();
                    holding.fetch_sub(1, Ordering::SeqCst);
                    permit.record(Outcome::Ignore);
                }
            });
        }
        std::thread::sleep(Duration::from_millis(20));
        scripted.next.store(4, Ordering::SeqCst);
        let mut shrinking = bulkhead.try_acquire().unwrap_or_else(|_| loop {
            if let Ok(permit) = bulkhead.try_acquire() {
                break permit;
            }
        });
        shrinking.record(Outcome::Success);
        drop(shrinking);
        assert_eq!(bulkhead.limit(), 4);
        while bulkhead.in_flight() > 4 {
            std::thread::yield_now();
        }
        under.store(true, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(50));
        stop.store(true, Ordering::SeqCst);
    });
    let most = most_after.load(Ordering::SeqCst);
    assert!(
        (1..=4).contains(&most),
        "{most} held at once under a limit of 4"
    );
}

#[test]
fn each_key_of_a_keyed_bulkhead_adapts_alone() {
    use tower_inflight::keyed::{KeyedBulkhead, KeyedConfig};
    let keyed: KeyedBulkhead<&str> = KeyedBulkhead::new(KeyedConfig::new(
        Config::new(100, Duration::from_secs(30)).adaptive(Adaptive::new(Aimd::default())),
    ));
    let mut noisy = keyed.try_acquire(&"noisy").unwrap();
    let quiet = keyed.try_acquire(&"quiet").unwrap();
    noisy.record(Outcome::Dropped);
    let limits: std::collections::HashMap<_, _> = keyed
        .status(2)
        .busiest
        .iter()
        .map(|key| (key.key, key.limit))
        .collect();
    assert_eq!(limits[&"noisy"], 18);
    assert_eq!(limits[&"quiet"], 20);
    drop((noisy, quiet));
}

// ---- Found in review -------------------------------------------------------

/// Each answer of the algorithm is put in force before the next sample is
/// given the limit: two samples recorded at once never both see the limit
/// the first replaced (so a drop is never undone by a sample computed from
/// the limit before it).
#[test]
fn samples_recorded_at_once_each_see_the_limit_the_last_one_left() {
    #[derive(Clone, Default)]
    struct Checking {
        last: Arc<Mutex<Option<usize>>>,
        stale: Arc<AtomicUsize>,
    }
    impl Algorithm for Checking {
        fn update(&mut self, sample: &Sample, limit: usize) -> usize {
            let mut last = self.last.lock().unwrap();
            if last.is_some_and(|last| last != limit) {
                self.stale.fetch_add(1, Ordering::SeqCst);
            }
            let next = if sample.dropped {
                10 + limit % 7
            } else {
                20 + limit % 11
            };
            *last = Some(next);
            next
        }
    }
    let checking = Checking::default();
    let bulkhead = Bulkhead::new(
        Config::new(64, Duration::from_secs(30))
            .adaptive(Adaptive::new(checking.clone()).initial(20)),
    );
    std::thread::scope(|scope| {
        for thread in 0..4 {
            let bulkhead = &bulkhead;
            scope.spawn(move || {
                for call in 0..2_000 {
                    if let Ok(mut permit) = bulkhead.try_acquire() {
                        let outcome = if (call + thread) % 3 == 0 {
                            Outcome::Dropped
                        } else {
                            Outcome::Success
                        };
                        permit.record(outcome);
                    }
                }
            });
        }
    });
    assert_eq!(checking.stale.load(Ordering::SeqCst), 0);
}

/// Held at their maximum by the bounds for a long while, Vegas and
/// Gradient2 still shrink at once when latency jumps (their own estimates
/// do not run on past the maximum).
#[test]
fn vegas_and_gradient2_held_at_the_maximum_still_shrink() {
    for (name, mut algorithm) in [
        ("vegas", Box::new(Vegas::default()) as Box<dyn Algorithm>),
        ("gradient2", Box::new(Gradient2::default())),
    ] {
        let mut limit = 20;
        for _ in 0..2_000 {
            limit = algorithm
                .update(&sample(10, limit, false), limit)
                .clamp(1, 20);
        }
        assert_eq!(limit, 20, "{name}");
        // (Vegas may take the new latency as its least at its next probe,
        // and grow back: the least it came down to is what counts.)
        let mut least = limit;
        for _ in 0..300 {
            limit = algorithm
                .update(&sample(100, limit, false), limit)
                .clamp(1, 20);
            least = least.min(limit);
        }
        assert!(least < 15, "{name}: {least}");
    }
}

/// Calls longer than the window: the window stretches to twice the
/// baseline, so a cut is judged on calls admitted after it.
#[test]
fn capacity_follows_a_dependency_slower_than_its_window() {
    for base_ms in [300, 1_000] {
        let limits = Dependency::new(base_ms * MS, 16).run(
            &mut Capacity::default(),
            20,
            Duration::from_secs(300),
        );
        let last = &limits[limits.len() * 3 / 4..];
        assert!(
            last.iter().all(|&limit| within(limit, 16)),
            "base {base_ms} ms: {last:?}"
        );
    }
}

/// Every call dropped (an outage): the limit comes down, though no call
/// leaves a latency.
#[test]
fn capacity_cuts_when_every_call_is_dropped() {
    let mut capacity = Capacity::default();
    let mut limit = 100;
    for call in 0..10_000u64 {
        let now = Duration::from_micros(call * 1_000);
        limit = capacity
            .update(&Sample::new(10 * MS, limit, true, now), limit)
            .max(1);
    }
    assert!(limit <= 60, "{limit}");
}

/// A weighted caller heavier than the limit in force is refused at once
/// rather than holding up the line until its wait runs out.
#[tokio::test(start_paused = true)]
async fn a_weight_over_the_limit_in_force_is_refused_at_once() {
    use tower_inflight::{ShedReason, Ticket};
    let bulkhead = Bulkhead::new(
        Config::new(100, Duration::from_secs(30))
            .wait(Duration::from_secs(10))
            .adaptive(Adaptive::default()),
    );
    assert_eq!(bulkhead.limit(), 20);
    let started = tokio::time::Instant::now();
    let error = bulkhead
        .acquire_with(Ticket::new().weight(32))
        .await
        .unwrap_err();
    assert_eq!(error.reason(), ShedReason::LimitReached);
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert!(bulkhead.try_acquire().is_ok());
}

/// A key's own limit below the adaptive start: the key starts at its
/// limit, never above. An adaptive ceiling does not cap a key at where
/// the ceiling starts.
#[test]
fn a_key_s_limit_bounds_its_adaptive_limit_and_an_adaptive_ceiling_does_not_cap_keys() {
    use tower_inflight::keyed::{KeyedBulkhead, KeyedConfig};
    let keyed: KeyedBulkhead<&str> = KeyedBulkhead::new(
        KeyedConfig::new(
            Config::new(100, Duration::from_secs(30))
                .adaptive(Adaptive::default().min(4).initial(10)),
        )
        .limit_per_key(|key| if *key == "small" { 2 } else { 100 }),
    );
    let held: Vec<_> = (0..2)
        .map(|_| keyed.try_acquire(&"small").unwrap())
        .collect();
    assert!(keyed.try_acquire(&"small").is_err());
    drop(held);

    let keyed: KeyedBulkhead<&str> = KeyedBulkhead::new(
        KeyedConfig::new(
            Config::new(100, Duration::from_secs(30)).adaptive(Adaptive::default().initial(30)),
        )
        .ceiling(Config::new(200, Duration::from_secs(30)).adaptive(Adaptive::default())),
    );
    let held: Vec<_> = (0..20)
        .map(|_| keyed.try_acquire(&"big").unwrap())
        .collect();
    let status = keyed.status(1);
    assert_eq!(status.busiest[0].limit, 30);
    drop(held);
}

/// A key's limit under the adaptive least (`min`): every move of the
/// key's limit stays within its own limit, whatever its algorithm answers.
#[test]
fn a_key_s_limit_under_the_adaptive_least_bounds_every_move() {
    use tower_inflight::keyed::{KeyedBulkhead, KeyedConfig};
    /// Answers the most and the least in turn.
    #[derive(Clone)]
    struct Swinging(bool);
    impl Algorithm for Swinging {
        fn update(&mut self, _: &Sample, _: usize) -> usize {
            self.0 = !self.0;
            if self.0 {
                usize::MAX
            } else {
                0
            }
        }
    }
    let keyed: KeyedBulkhead<&str> = KeyedBulkhead::new(
        KeyedConfig::new(
            Config::new(100, Duration::from_secs(30))
                .adaptive(Adaptive::new(Swinging(false)).min(4)),
        )
        .limit_per_key(|key| if *key == "small" { 2 } else { 100 }),
    );
    for _ in 0..10 {
        let held: Vec<_> = (0..2)
            .map(|_| keyed.try_acquire(&"small").unwrap())
            .collect();
        assert!(keyed.try_acquire(&"small").is_err());
        // Each permit dropped is a sample, and moves the limit.
        drop(held);
    }
}

/// A permit whose slot was reclaimed (it outlived `reclaim_after`) is no
/// sample when it is dropped: its hold is no latency of the dependency.
#[test]
fn a_permit_whose_slot_was_reclaimed_is_no_sample() {
    let scripted = Scripted::new(1);
    let clock = ManualClock::new();
    let bulkhead = Bulkhead::new(
        Config::new(1, Duration::from_secs(1))
            .clock(clock.clone())
            .adaptive(Adaptive::new(scripted.clone())),
    );
    let outlived = bulkhead.try_acquire().unwrap();
    clock.advance(Duration::from_secs(2));
    let mut next = bulkhead.try_acquire().unwrap();
    assert!(next.was_reclaimed());
    drop(outlived);
    assert!(scripted.samples().is_empty());
    next.record(Outcome::Success);
    assert_eq!(scripted.samples().len(), 1);
}

/// A weighted caller waiting when the limit shrinks below its weight is
/// turned away then, not at the end of its wait.
#[tokio::test(start_paused = true)]
async fn a_waiter_heavier_than_a_shrunk_limit_is_turned_away() {
    use tower_inflight::{ShedReason, Ticket};
    let scripted = Scripted::new(4);
    let bulkhead = Bulkhead::new(
        Config::new(8, Duration::from_secs(30))
            .wait(Duration::from_secs(10))
            .adaptive(Adaptive::new(scripted.clone()).initial(8)),
    );
    let mut held: Vec<_> = (0..8).map(|_| bulkhead.try_acquire().unwrap()).collect();
    let started = tokio::time::Instant::now();
    let waiting = {
        let bulkhead = bulkhead.clone();
        tokio::spawn(async move {
            bulkhead
                .acquire_with(Ticket::new().weight(6))
                .await
                .map(drop)
        })
    };
    while bulkhead.waiting() == 0 {
        tokio::task::yield_now().await;
    }
    held[0].record(Outcome::Success);
    assert_eq!(bulkhead.limit(), 4);
    let error = waiting.await.unwrap().unwrap_err();
    assert_eq!(error.reason(), ShedReason::LimitReached);
    assert_eq!(started.elapsed(), Duration::ZERO);
    drop(held);
}

/// A keyed call that waited for its slot records its outcome as one that
/// did not: a timeout after the wait is a drop.
#[tokio::test(start_paused = true)]
async fn a_keyed_call_that_waited_records_its_outcome() {
    use tower_inflight::keyed::{KeyedConcurrencyLayer, KeyedConfig};
    let scripted = Scripted::new(1);
    let layer = KeyedConcurrencyLayer::new(
        KeyedConfig::new(
            Config::new(1, Duration::from_secs(30))
                .wait(Duration::from_secs(5))
                .adaptive(Adaptive::new(scripted.clone()).initial(1)),
        ),
        |_: &u64| 0u8,
    );
    let service = ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(|_: u64| async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            Err::<(), BoxError>(tower::timeout::error::Elapsed::new().into())
        }));
    let (first, second) = tokio::join!(service.clone().oneshot(1), service.clone().oneshot(2));
    assert!(first.is_err() && second.is_err());
    let dropped: Vec<bool> = scripted
        .samples()
        .iter()
        .map(|sample| sample.dropped)
        .collect();
    assert_eq!(dropped, [true, true]);
}

/// Open-loop arrivals at twice the capacity, which halves for 10 s: the
/// limit stays near the new capacity the whole time (a probe that a change
/// fell in measures a queue; the one before it keeps the baseline).
#[test]
fn capacity_stays_near_a_halved_capacity_under_open_loop_load() {
    let mut dependency = Dependency::new(10 * MS, 16);
    dependency.capacity = vec![
        (Duration::ZERO, 16),
        (Duration::from_secs(10), 8),
        (Duration::from_secs(20), 16),
    ];
    dependency.arrivals = Some(3_200.0);
    let limits = dependency.run(&mut Capacity::default(), 20, Duration::from_secs(30));
    let settled = settled_after(&limits, 100, 200, 8);
    assert!(
        settled.is_some_and(|at| at - 100 <= 10),
        "{:?}",
        &limits[100..200]
    );
}
