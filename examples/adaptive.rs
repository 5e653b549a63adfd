//! Adaptive limits side by side, against a dependency whose capacity halves
//! and comes back.
//!
//! ```text
//! cargo run --release --example adaptive -- --help
//! cargo run --release --example adaptive                # load 2x, 3 x 10 s
//! cargo run --release --example adaptive -- --load 4
//! ```
//!
//! Every limiter gets a simulated dependency of its own (C workers at about
//! 10 ms a call, a FIFO queue in front) and the same Poisson arrivals, all
//! in one run on real time. The dependency serves C calls at once for 10 s,
//! C/2 for the next 10 s, then C again. The limiters never learn C: they
//! see only their calls' latencies and timeouts. What is compared:
//! - static limits of tower-inflight: the best one (C, which a person would
//!   set knowing C and knowing it never changes) and one three times too
//!   high (3C);
//! - tower-inflight's adaptive algorithms (`Capacity`, the default, and
//!   `Vegas`, `Gradient2`, `Aimd`), each with a maximum of 200;
//! - the peers `tower-acc` (AIMD, Gradient2, Vegas) and
//!   `tower-resilience-adaptive` (AIMD, Vegas), with their defaults.
//!
//! It prints a table per phase (goodput, latency, sheds, timeouts, the
//! limit's range and how soon it came back near the new C), a check of the
//! default against its targets, a text chart of the limit over time, and
//! writes the limit every 100 ms to a CSV file.

use std::collections::VecDeque;
use std::error::Error;
use std::fmt::Write as _;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tower::timeout::Timeout;
use tower::util::BoxCloneService;
use tower::{BoxError, Layer, Service, ServiceBuilder, ServiceExt};
use tower_inflight::adaptive::{Adaptive, Aimd, Gradient2, Vegas};
use tower_inflight::{ConcurrencyLayer, Config, ServiceSaturated};

const HELP: &str = "\
adaptive: tower-inflight's adaptive limits against static limits and peer crates

A simulated dependency of true capacity C: C workers, each call about BASE ms
(uniform jitter of +-JITTER ms), and a FIFO queue in front of them, so latency
is BASE until C calls are in service and grows with the queue after that. Its
capacity is C for the first phase, C/2 for the second and C again for the
third. No limiter is told C.

Calls arrive as a Poisson process (open loop: arrivals do not wait for
answers) at LOAD times C's throughput (C / BASE calls a second), the same rate
in every phase (so twice as much over capacity in the middle one). Each
arriving call goes through the limiter under test: refused, it is counted as
shed; admitted, it runs on the dependency, under a client timeout of TIMEOUT
ms (a timed-out call counts as a timeout, not goodput; the dependency still
works on it, as a remote server that never hears of the client's timeout
does). Every limiter has a dependency of its own and sees the same arrival
times, all in one run (about the sum of the phases, plus a second).

Limiters (names as printed):
  static-C        tower-inflight, static limit C (the best static limit)
  static-3C       tower-inflight, static limit 3C (three times too high)
  ours:Capacity   tower-inflight adaptive, Capacity (the default), max MAX
  ours:Vegas      tower-inflight adaptive, Vegas, max MAX
  ours:Gradient2  tower-inflight adaptive, Gradient2, max MAX
  ours:Aimd       tower-inflight adaptive, Aimd, max MAX
  acc:Aimd        tower-acc 0.1, Aimd::default()       (min 20, max 200)
  acc:Gradient2   tower-acc 0.1, Gradient2::default()  (min 20, max 200)
  acc:Vegas       tower-acc 0.1, Vegas::default()      (max 1000)
  res:Aimd        tower-resilience-adaptive 0.14, Aimd::builder() defaults
  res:Vegas       tower-resilience-adaptive 0.14, Vegas::builder() defaults
The peers wait for a permit in poll_ready rather than refuse, so each is
wrapped in tower's LoadShed: a call that finds no permit is shed at once, as
tower-inflight sheds it. The client timeout is inside every limiter, so each
sees a timeout as its own call failing.

Caveats: this is real time on tokio's timer, which wakes on whole
milliseconds, so a call of BASE ms takes BASE to BASE+1 ms and the
dependency serves a little under C / BASE calls a second. The arrivals come
from a thread of their own, which wakes within about 0.1 ms. A freed slot
waits for the next arrival, and the dependency idles meanwhile: a limit of
exactly C serves a few percent less than a limit with a short queue. Figures
vary by a point or two from run to run, and more on a busy machine: the
timer lag in each phase's header says how late the runtime was.

Output: progress on stderr; then on stdout a table per phase, a check of
ours:Capacity against its targets, a text chart of the limit over time for
ours:Capacity and the peers, and a legend. The limit of every limiter every
100 ms goes to the CSV file.

Options:
  --capacity C       true capacity of the dependency in the first and last
                     phases; C/2 in the middle one            [default: 16]
  --load X           arrival rate, as a multiple of C's throughput
                                                               [default: 2]
  --phases A,B,C     length of the three phases, in seconds
                                                        [default: 10,10,10]
  --base-ms MS       service time of a call without queueing  [default: 10]
  --jitter-ms MS     uniform jitter around it, +-             [default: 1]
  --timeout-ms MS    client timeout                           [default: 1000]
  --max N            the most the adaptive limits of tower-inflight may set
                                                              [default: 200]
  --only A,B,...     run only the limiters whose names contain one of these
                     (e.g. --only static-C,Capacity,acc:)
  --csv PATH         where to write the limit over time
                                                 [default: target/adaptive.csv]
  --seed N           seed of the arrivals and service times   [default: 1]
  -h, --help         this text
";

const LEGEND: &str = "\
Legend (one row per limiter, one table per phase; calls are counted in the
phase they arrived in, but for goodput and %best):
  goodput/s  calls served within the client timeout and answered in the
             phase, per second of it (a backlog served in the next phase
             counts in the next)
  %best      that goodput as a % of the highest goodput any limiter reached
             in the phase
  p50 ms     median latency of the served calls (admission to answer)
  p99 ms     99th percentile latency of the served calls
  shed %     % of the phase's arrivals the limiter refused at once
  tmo %      % of the phase's arrivals admitted but not answered within the
             client timeout
  fail %     % of the phase's arrivals that failed otherwise (shown only
             when any did)
  limit      the least and the most limit in force, sampled every 100 ms
             (for the peers: the limit their algorithm asks for; they apply
             a cut only as permits come back)
  in band    time from the phase's start (the change of capacity) until the
             limit was first within 0.75-1.5x the phase's C, or never
  stays      time from the phase's start after which the limit stayed within
             0.75-1.5x the phase's C to the end of the phase, or never
  timer lag  (phase header) how late a 1 ms tokio sleep woke, p99: the
             runtime's own delay, included in every latency measured
";

/// How often the limits are sampled (for the CSV, the charts and the
/// time back in band).
const SAMPLE_EVERY: Duration = Duration::from_millis(100);

// ---- Options ----------------------------------------------------------------

#[derive(Clone, Debug)]
struct Options {
    capacity: usize,
    load: f64,
    phases: [Duration; 3],
    base: Duration,
    jitter: Duration,
    timeout: Duration,
    max: usize,
    only: Option<Vec<String>>,
    csv: PathBuf,
    seed: u64,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            capacity: 16,
            load: 2.0,
            phases: [Duration::from_secs(10); 3],
            base: Duration::from_millis(10),
            jitter: Duration::from_millis(1),
            timeout: Duration::from_millis(1_000),
            max: 200,
            only: None,
            csv: PathBuf::from("target/adaptive.csv"),
            seed: 1,
        }
    }
}

impl Options {
    /// The options, or `None` after printing the help.
    fn parse(mut args: impl Iterator<Item = String>) -> Result<Option<Self>, String> {
        let mut options = Self::default();
        while let Some(flag) = args.next() {
            if flag == "-h" || flag == "--help" {
                print!("{HELP}");
                return Ok(None);
            }
            const TAKING_A_VALUE: [&str; 10] = [
                "--capacity",
                "--load",
                "--phases",
                "--base-ms",
                "--jitter-ms",
                "--timeout-ms",
                "--max",
                "--only",
                "--csv",
                "--seed",
            ];
            if !TAKING_A_VALUE.contains(&flag.as_str()) {
                return Err(format!("unknown option {flag} (see --help)"));
            }
            let value = args
                .next()
                .ok_or_else(|| format!("{flag} needs a value (see --help)"))?;
            let number = |value: &str| -> Result<f64, String> {
                value
                    .parse::<f64>()
                    .ok()
                    .filter(|n| n.is_finite() && *n >= 0.0)
                    .ok_or_else(|| format!("{flag}: {value:?} is not a number >= 0"))
            };
            let millis = |value: &str| number(value).map(|ms| Duration::from_secs_f64(ms / 1e3));
            match flag.as_str() {
                "--capacity" => options.capacity = number(&value)? as usize,
                "--load" => options.load = number(&value)?,
                "--phases" => {
                    let lengths = value
                        .split(',')
                        .map(|secs| number(secs).map(Duration::from_secs_f64))
                        .collect::<Result<Vec<_>, _>>()?;
                    options.phases = lengths
                        .try_into()
                        .map_err(|_| "--phases takes three lengths, e.g. 10,10,10".to_string())?;
                }
                "--base-ms" => options.base = millis(&value)?,
                "--jitter-ms" => options.jitter = millis(&value)?,
                "--timeout-ms" => options.timeout = millis(&value)?,
                "--max" => options.max = number(&value)? as usize,
                "--only" => options.only = Some(value.split(',').map(str::to_string).collect()),
                "--csv" => options.csv = PathBuf::from(value),
                "--seed" => options.seed = number(&value)? as u64,
                _ => unreachable!("{flag} is in TAKING_A_VALUE"),
            }
        }
        if options.capacity < 2 {
            return Err("--capacity must be at least 2 (the middle phase has C/2)".into());
        }
        if options.base.is_zero() || options.jitter >= options.base {
            return Err("--base-ms must be over 0 and over --jitter-ms".into());
        }
        if options.load <= 0.0 || options.timeout.is_zero() {
            return Err("--load and --timeout-ms must be over 0".into());
        }
        if options.max < 3 * options.capacity {
            // Below it, they could not even reach where static-3C is.
            return Err("--max must be at least 3C".into());
        }
        if options.phases.iter().any(|phase| phase < &SAMPLE_EVERY) {
            return Err("each phase must last at least 0.1 s".into());
        }
        Ok(Some(options))
    }

    /// The dependency's capacity in each phase: C, C/2, C.
    fn capacities(&self) -> [usize; 3] {
        [self.capacity, self.capacity / 2, self.capacity]
    }

    /// Where each phase starts, and where the last ends.
    fn boundaries(&self) -> [Duration; 4] {
        let [a, b, c] = self.phases;
        [Duration::ZERO, a, a + b, a + b + c]
    }

    fn phase_at(&self, at: Duration) -> usize {
        let bounds = self.boundaries();
        (0..3).rev().find(|&phase| at >= bounds[phase]).unwrap_or(0)
    }

    /// Calls a second: LOAD times what C workers serve.
    fn arrival_rate(&self) -> f64 {
        self.load * self.capacity as f64 / self.base.as_secs_f64()
    }
}

// ---- Randomness -------------------------------------------------------------

/// SplitMix64: small, fast and seeded, so that a run can be repeated (and no
/// dependency is added for it).
#[derive(Clone, Debug)]
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The wait until the next arrival of a Poisson process of `rate`.
    fn exponential(&mut self, rate: f64) -> Duration {
        Duration::from_secs_f64(-(1.0 - self.unit()).ln() / rate)
    }
}

// ---- The dependency ---------------------------------------------------------

/// The dependency: `workers` calls in service at once, each for `base` ±
/// `jitter`; the others wait in a FIFO queue in front. Latency is `base`
/// until every worker is busy and grows with the queue after that, which is
/// what an adaptive limit has to read.
///
/// It knows nothing of its callers: a call whose caller gave up (timed out)
/// keeps its place in the queue and takes a worker in turn, as on a remote
/// server that never hears of the client's timeout. So a limit too high
/// costs twice: the queue makes calls time out, and the calls that timed
/// out still use the workers.
#[derive(Debug)]
struct Dependency {
    base: Duration,
    jitter: Duration,
    state: Mutex<Workers>,
}

#[derive(Debug)]
struct Workers {
    workers: usize,
    busy: usize,
    /// Calls waiting for a worker, first come first served: each is woken
    /// through its sender when a worker is handed to it.
    queue: VecDeque<oneshot::Sender<()>>,
    rng: Rng,
}

impl Workers {
    /// Hands free workers to the calls waiting longest.
    fn start_waiting(&mut self) {
        while self.busy < self.workers {
            let Some(next) = self.queue.pop_front() else {
                break;
            };
            self.busy += 1;
            // Its receiver is in a spawned task that is never cancelled.
            let _ = next.send(());
        }
    }
}

impl Dependency {
    fn new(workers: usize, base: Duration, jitter: Duration, seed: u64) -> Arc<Self> {
        Arc::new(Self {
            base,
            jitter,
            state: Mutex::new(Workers {
                workers,
                busy: 0,
                queue: VecDeque::new(),
                rng: Rng(seed),
            }),
        })
    }

    /// Changes the capacity. Calls in service when it shrinks finish; no
    /// new one starts until fewer than `workers` are busy.
    fn set_workers(&self, workers: usize) {
        let mut state = self.state.lock().unwrap();
        state.workers = workers;
        state.start_waiting();
    }

    /// One call, from arrival at the dependency to its answer.
    async fn serve(self: Arc<Self>) {
        let (wait, took) = {
            let mut state = self.state.lock().unwrap();
            let spread = (2.0 * state.rng.unit() - 1.0) * self.jitter.as_secs_f64();
            let took = Duration::from_secs_f64(self.base.as_secs_f64() + spread);
            if state.busy < state.workers {
                state.busy += 1;
                (None, took)
            } else {
                let (handed, wait) = oneshot::channel();
                state.queue.push_back(handed);
                (Some(wait), took)
            }
        };
        if let Some(wait) = wait {
            let _ = wait.await;
        }
        tokio::time::sleep(took).await;
        let mut state = self.state.lock().unwrap();
        state.busy -= 1;
        state.start_waiting();
    }
}

/// The dependency as a tower service.
#[derive(Clone, Debug)]
struct DependencyService(Arc<Dependency>);

impl Service<()> for DependencyService {
    type Response = ();
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, (): ()) -> Self::Future {
        // Spawned, so that the work goes on when the caller stops waiting.
        let work = tokio::spawn(self.0.clone().serve());
        Box::pin(async move { work.await.map_err(BoxError::from) })
    }
}

// ---- The limiters -----------------------------------------------------------

/// Every limiter's stack, boxed to one type: limiter → client timeout →
/// dependency.
type CallService = BoxCloneService<(), (), BoxError>;

/// Reads the limit in force.
type LimitFn = Box<dyn Fn() -> usize + Send + Sync>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    StaticC,
    Static3C,
    Capacity,
    Vegas,
    Gradient2,
    Aimd,
    AccAimd,
    AccGradient2,
    AccVegas,
    ResAimd,
    ResVegas,
}

impl Kind {
    const ALL: [Kind; 11] = [
        Kind::StaticC,
        Kind::Static3C,
        Kind::Capacity,
        Kind::Vegas,
        Kind::Gradient2,
        Kind::Aimd,
        Kind::AccAimd,
        Kind::AccGradient2,
        Kind::AccVegas,
        Kind::ResAimd,
        Kind::ResVegas,
    ];

    fn name(self) -> &'static str {
        match self {
            Kind::StaticC => "static-C",
            Kind::Static3C => "static-3C",
            Kind::Capacity => "ours:Capacity",
            Kind::Vegas => "ours:Vegas",
            Kind::Gradient2 => "ours:Gradient2",
            Kind::Aimd => "ours:Aimd",
            Kind::AccAimd => "acc:Aimd",
            Kind::AccGradient2 => "acc:Gradient2",
            Kind::AccVegas => "acc:Vegas",
            Kind::ResAimd => "res:Aimd",
            Kind::ResVegas => "res:Vegas",
        }
    }

    /// Whether its limit is charted: our default and the peers.
    fn charted(self) -> bool {
        matches!(
            self,
            Kind::Capacity
                | Kind::AccAimd
                | Kind::AccGradient2
                | Kind::AccVegas
                | Kind::ResAimd
                | Kind::ResVegas
        )
    }

    /// The limiter around `inner`, and a reader of its limit; or why it
    /// could not be built.
    fn build(
        self,
        inner: Timeout<DependencyService>,
        options: &Options,
    ) -> Result<(CallService, LimitFn), String> {
        let reclaim_after = Duration::from_secs(30);
        let ours = |config: Config| -> (CallService, LimitFn) {
            let layer = ConcurrencyLayer::new(config);
            let bulkhead = layer.bulkhead();
            (
                BoxCloneService::new(layer.layer(inner.clone())),
                Box::new(move || bulkhead.limit()),
            )
        };
        let adaptive =
            |adaptive: Adaptive| ours(Config::new(options.max, reclaim_after).adaptive(adaptive));
        Ok(match self {
            Kind::StaticC => ours(Config::new(options.capacity, reclaim_after)),
            Kind::Static3C => ours(Config::new(3 * options.capacity, reclaim_after)),
            Kind::Capacity => adaptive(Adaptive::default()),
            Kind::Vegas => adaptive(Adaptive::new(Vegas::default())),
            Kind::Gradient2 => adaptive(Adaptive::new(Gradient2::default())),
            Kind::Aimd => adaptive(Adaptive::new(Aimd::default())),
            Kind::AccAimd => acc(tower_acc::Aimd::default(), inner),
            Kind::AccGradient2 => acc(tower_acc::Gradient2::default(), inner),
            Kind::AccVegas => acc(tower_acc::Vegas::default(), inner),
            Kind::ResAimd => res(
                tower_resilience_adaptive::Aimd::builder()
                    .build()
                    .map_err(|error| format!("res:Aimd: {error}"))?,
                inner,
            ),
            Kind::ResVegas => res(
                tower_resilience_adaptive::Vegas::builder()
                    .build()
                    .map_err(|error| format!("res:Vegas: {error}"))?,
                inner,
            ),
        })
    }
}

/// A `tower-acc` algorithm that also publishes its limit: the crate keeps
/// its controller private, and this is the one way to read it from outside.
#[derive(Clone, Debug)]
struct Watched<A> {
    algorithm: A,
    limit: Arc<AtomicUsize>,
}

impl<A: tower_acc::Algorithm> tower_acc::Algorithm for Watched<A> {
    fn max_concurrency(&self) -> usize {
        self.algorithm.max_concurrency()
    }

    fn update(&mut self, rtt: Duration, in_flight: usize, is_error: bool, is_canceled: bool) {
        self.algorithm.update(rtt, in_flight, is_error, is_canceled);
        self.limit
            .store(self.algorithm.max_concurrency(), Ordering::Relaxed);
    }
}

/// `tower-acc` with `algorithm`, shedding when no permit is free.
fn acc<A>(algorithm: A, inner: Timeout<DependencyService>) -> (CallService, LimitFn)
where
    A: tower_acc::Algorithm + Clone + Send + 'static,
{
    let limit = Arc::new(AtomicUsize::new(algorithm.max_concurrency()));
    let watched = Watched {
        algorithm,
        limit: limit.clone(),
    };
    let service = ServiceBuilder::new()
        // Its `poll_ready` waits for a permit: LoadShed turns a wait into a
        // refusal, as the crate's own example does.
        .load_shed()
        .layer(tower_acc::ConcurrencyLimitLayer::new(watched))
        .service(inner);
    (
        BoxCloneService::new(service),
        Box::new(move || limit.load(Ordering::Relaxed)),
    )
}

/// `tower-resilience-adaptive` with `algorithm`, shedding when no permit is
/// free.
fn res<A>(algorithm: A, inner: Timeout<DependencyService>) -> (CallService, LimitFn)
where
    A: tower_resilience_adaptive::ConcurrencyAlgorithm + 'static,
{
    use tower_resilience_adaptive::{AdaptiveError, AdaptiveService};
    // The service takes the algorithm in an `Arc`: a clone of it reads the
    // limit.
    let algorithm = Arc::new(algorithm);
    let reader = algorithm.clone();
    let limited = AdaptiveService::new(inner, algorithm).map_err(|error| match error {
        AdaptiveError::Service(error) => error,
        AdaptiveError::LimitReached => BoxError::from("tower-resilience-adaptive: limit reached"),
    });
    // Its `poll_ready` waits for a permit too.
    let service = ServiceBuilder::new().load_shed().service(limited);
    (
        BoxCloneService::new(service),
        Box::new(move || reader.limit()),
    )
}

/// One limiter under test, with its own dependency and counts.
struct Limiter {
    kind: Kind,
    /// Only the arrival loop calls it (a boxed service is not `Sync`).
    service: CallService,
    probe: Arc<Probe>,
}

/// What the other tasks see of a limiter: its limit, its dependency and its
/// counts.
struct Probe {
    name: &'static str,
    limit: LimitFn,
    dependency: Arc<Dependency>,
    tally: Arc<Tally>,
}

// ---- Counting ---------------------------------------------------------------

/// What became of one call.
#[derive(Clone, Copy, Debug)]
enum Outcome {
    Served(Duration),
    Shed,
    TimedOut,
    Failed,
}

/// What the error of a call says became of it.
fn classify(result: Result<(), BoxError>, latency: Duration) -> Outcome {
    let error = match result {
        Ok(()) => return Outcome::Served(latency),
        Err(error) => error,
    };
    let mut cause: Option<&(dyn Error + 'static)> = Some(&*error);
    while let Some(error) = cause {
        if error.is::<tower::timeout::error::Elapsed>() {
            return Outcome::TimedOut;
        }
        if error.is::<ServiceSaturated>() || error.is::<tower::load_shed::error::Overloaded>() {
            return Outcome::Shed;
        }
        cause = error.source();
    }
    Outcome::Failed
}

/// A limiter's counts in one phase.
#[derive(Debug, Default)]
struct PhaseTally {
    arrivals: u64,
    /// Calls served whose answer came within this phase, whenever they
    /// arrived: the goodput. (Counted by arrival, a limiter that queues
    /// would be credited at a phase's end with a backlog that the next
    /// phase's capacity serves.)
    answered: u64,
    shed: u64,
    timed_out: u64,
    failed: u64,
    /// Of the served calls, in microseconds: exact percentiles afterwards.
    latencies_us: Vec<u32>,
}

/// A limiter's counts, by the phase each call arrived in.
#[derive(Debug)]
struct Tally {
    phases: [Mutex<PhaseTally>; 3],
}

impl Tally {
    fn new() -> Self {
        Self {
            phases: Default::default(),
        }
    }

    /// Counts a call that arrived in `phase`, and was answered in
    /// `answered_in` (none: after the last phase).
    fn record(&self, phase: usize, answered_in: Option<usize>, outcome: Outcome) {
        if let (Outcome::Served(_), Some(answered_in)) = (outcome, answered_in) {
            self.phases[answered_in].lock().unwrap().answered += 1;
        }
        let mut tally = self.phases[phase].lock().unwrap();
        tally.arrivals += 1;
        match outcome {
            Outcome::Served(latency) => {
                tally
                    .latencies_us
                    .push(latency.as_micros().min(u128::from(u32::MAX)) as u32);
            }
            Outcome::Shed => tally.shed += 1,
            Outcome::TimedOut => tally.timed_out += 1,
            Outcome::Failed => tally.failed += 1,
        }
    }
}

// ---- Results ----------------------------------------------------------------

/// One limiter in one phase, as the table shows it.
#[derive(Clone, Debug)]
struct PhaseResult {
    goodput: f64,
    /// Of the best goodput in the phase, in %.
    of_best: f64,
    p50: Option<Duration>,
    p99: Option<Duration>,
    shed: f64,
    timed_out: f64,
    failed: f64,
    limit_range: (usize, usize),
    in_band: Option<Duration>,
    stays: Option<Duration>,
}

impl PhaseResult {
    fn new(tally: &PhaseTally, length: Duration, limits: &[usize], capacity: usize) -> Self {
        let mut latencies = tally.latencies_us.clone();
        latencies.sort_unstable();
        let percentile = |p: f64| {
            (!latencies.is_empty()).then(|| {
                let at = ((latencies.len() as f64 * p).ceil() as usize).clamp(1, latencies.len());
                Duration::from_micros(u64::from(latencies[at - 1]))
            })
        };
        let share = |count: u64| 100.0 * count as f64 / tally.arrivals.max(1) as f64;
        // Within 0.75-1.5x, in integers.
        let within = |limit: usize| limit * 4 >= capacity * 3 && limit * 2 <= capacity * 3;
        let at = |index: usize| SAMPLE_EVERY * index as u32;
        let stays = (0..limits.len())
            .find(|&start| limits[start..].iter().all(|&limit| within(limit)))
            .map(at);
        Self {
            goodput: tally.answered as f64 / length.as_secs_f64(),
            of_best: 0.0,
            p50: percentile(0.50),
            p99: percentile(0.99),
            shed: share(tally.shed),
            timed_out: share(tally.timed_out),
            failed: share(tally.failed),
            limit_range: (
                limits.iter().copied().min().unwrap_or(0),
                limits.iter().copied().max().unwrap_or(0),
            ),
            in_band: limits.iter().position(|&limit| within(limit)).map(at),
            stays,
        }
    }
}

/// Everything a run measured.
struct Results {
    options: Options,
    kinds: Vec<Kind>,
    /// `phases[phase][limiter]`.
    phases: Vec<Vec<PhaseResult>>,
    /// `limits[sample][limiter]`, a sample every 100 ms from the start.
    limits: Vec<Vec<usize>>,
    /// p99 of the timer's lag in each phase.
    lag_p99: [Duration; 3],
}

fn millis(duration: Option<Duration>) -> String {
    duration.map_or("-".into(), |d| format!("{:.1}", d.as_secs_f64() * 1e3))
}

fn seconds(duration: Option<Duration>) -> String {
    duration.map_or("never".into(), |d| format!("{:.1} s", d.as_secs_f64()))
}

impl Results {
    fn index_of(&self, kind: Kind) -> Option<usize> {
        self.kinds.iter().position(|&k| k == kind)
    }

    /// The samples of the limit that fall in `phase`, for limiter `index`.
    fn phase_limits(&self, phase: usize, index: usize) -> Vec<usize> {
        let bounds = self.options.boundaries();
        self.limits
            .iter()
            .enumerate()
            .filter(|(sample, _)| {
                let at = SAMPLE_EVERY * *sample as u32;
                at >= bounds[phase] && at < bounds[phase + 1]
            })
            .map(|(_, row)| row[index])
            .collect()
    }

    fn tables(&self) -> String {
        let options = &self.options;
        let bounds = options.boundaries();
        let capacities = options.capacities();
        let any_failed = self.phases.iter().flatten().any(|r| r.failed > 0.0);
        let mut out = String::new();
        for (phase, results) in self.phases.iter().enumerate() {
            let capacity = capacities[phase];
            let _ = writeln!(
                out,
                "\nPhase {} ({:.0}-{:.0} s): C = {capacity} ({:.0} calls/s at the base time); \
                 arrivals {:.0}/s; timer lag p99 {:.1} ms",
                phase + 1,
                bounds[phase].as_secs_f64(),
                bounds[phase + 1].as_secs_f64(),
                capacity as f64 / options.base.as_secs_f64(),
                options.arrival_rate(),
                self.lag_p99[phase].as_secs_f64() * 1e3,
            );
            let _ = write!(
                out,
                "{:<15} {:>9} {:>6} {:>7} {:>7} {:>6} {:>6}",
                "limiter", "goodput/s", "%best", "p50 ms", "p99 ms", "shed %", "tmo %"
            );
            if any_failed {
                let _ = write!(out, " {:>6}", "fail %");
            }
            let _ = writeln!(out, " {:>9} {:>8} {:>8}", "limit", "in band", "stays");
            for (kind, result) in self.kinds.iter().zip(results) {
                let _ = write!(
                    out,
                    "{:<15} {:>9.0} {:>6.1} {:>7} {:>7} {:>6.1} {:>6.1}",
                    kind.name(),
                    result.goodput,
                    result.of_best,
                    millis(result.p50),
                    millis(result.p99),
                    result.shed,
                    result.timed_out,
                );
                if any_failed {
                    let _ = write!(out, " {:>6.1}", result.failed);
                }
                let (low, high) = result.limit_range;
                let _ = writeln!(
                    out,
                    " {:>9} {:>8} {:>8}",
                    format!("{low}-{high}"),
                    seconds(result.in_band),
                    seconds(result.stays),
                );
            }
        }
        out
    }

    /// Our default against its targets, phase by phase.
    fn targets(&self) -> String {
        let mut out = String::from(
            "\nours:Capacity against its targets: goodput >= 98% of the best, \
             p99 <= 1.5x static-C's, limit staying within 0.75-1.5x C by 5 s after each change\n",
        );
        let Some(ours) = self.index_of(Kind::Capacity) else {
            out.push_str("  (not run)\n");
            return out;
        };
        let reference = self.index_of(Kind::StaticC);
        let mut all_met = true;
        for (phase, results) in self.phases.iter().enumerate() {
            let result = &results[ours];
            let goodput_ok = result.of_best >= 98.0;
            let mut line = format!(
                "  phase {}: goodput {:.2}% of the best [{}]",
                phase + 1,
                result.of_best,
                if goodput_ok { "met" } else { "MISSED" }
            );
            let mut met = goodput_ok;
            match (reference.map(|r| results[r].p99), result.p99) {
                (Some(Some(best)), Some(p99)) => {
                    let ratio = p99.as_secs_f64() / best.as_secs_f64();
                    let ok = ratio <= 1.5;
                    met &= ok;
                    let _ = write!(
                        line,
                        "; p99 {:.2} ms = {ratio:.3}x static-C's {:.2} ms [{}]",
                        p99.as_secs_f64() * 1e3,
                        best.as_secs_f64() * 1e3,
                        if ok { "met" } else { "MISSED" }
                    );
                }
                _ => line.push_str("; p99: no static-C to compare with"),
            }
            // The first phase starts from the initial limit, not a change.
            let ok = result.stays.is_some_and(|at| at <= Duration::from_secs(5));
            let _ = write!(
                line,
                "; limit in band for good {} [{}]",
                result.stays.map_or("never".into(), |at| format!(
                    "after {:.1} s",
                    at.as_secs_f64()
                )),
                match (phase, ok) {
                    (0, _) => "start, not a change",
                    (_, true) => "met",
                    (_, false) => "MISSED",
                }
            );
            if phase > 0 {
                met &= ok;
            }
            all_met &= met;
            let _ = writeln!(out, "{line}");
        }
        let _ = writeln!(
            out,
            "  {}",
            if all_met {
                "all targets met"
            } else {
                "some targets missed"
            }
        );
        out
    }

    /// A text chart of the limit over time, for our default and the peers.
    fn charts(&self) -> String {
        const WIDTH: usize = 60;
        const HEIGHT: usize = 10;
        let options = &self.options;
        let capacities = options.capacities();
        let top = (options.capacity * 5).div_ceil(2).max(4); // 2.5 C
        let samples = self.limits.len();
        let columns = WIDTH.min(samples);
        let per_column = samples as f64 / columns as f64;
        let row_of = |value: f64| -> usize {
            // Row 0 is the top one; values over `top` are clipped to it.
            let scaled = (value / top as f64 * HEIGHT as f64).floor() as usize;
            HEIGHT - 1 - scaled.min(HEIGHT - 1)
        };
        let mut out = format!(
            "\nThe limit over time ('*' the limit, mean of each column's samples; \
             ':' its range; '-' the true C; '@' the limit on C's row; '^' over {top}); \
             a column is {:.2} s\n",
            per_column * SAMPLE_EVERY.as_secs_f64()
        );
        for (index, kind) in self.kinds.iter().enumerate() {
            if !kind.charted() {
                continue;
            }
            let series: Vec<usize> = self.limits.iter().map(|row| row[index]).collect();
            // Column by column, each from the samples of its time.
            let grid: Vec<[char; HEIGHT]> = (0..columns)
                .map(|column| {
                    let from = (column as f64 * per_column) as usize;
                    let to = (((column + 1) as f64 * per_column) as usize).clamp(from + 1, samples);
                    let bucket = &series[from..to];
                    let mean = bucket.iter().sum::<usize>() as f64 / bucket.len() as f64;
                    let low = *bucket.iter().min().unwrap() as f64;
                    let high = *bucket.iter().max().unwrap() as f64;
                    let capacity = capacities[options.phase_at(SAMPLE_EVERY * from as u32)];
                    let mut cells = [' '; HEIGHT];
                    for cell in &mut cells[row_of(high)..=row_of(low)] {
                        *cell = ':';
                    }
                    let capacity_row = row_of(capacity as f64);
                    let limit_row = row_of(mean);
                    if cells[capacity_row] == ' ' {
                        cells[capacity_row] = '-';
                    }
                    cells[limit_row] = if limit_row == capacity_row { '@' } else { '*' };
                    if high > top as f64 {
                        cells[0] = '^';
                    }
                    cells
                })
                .collect();
            let (low, high) = (
                series.iter().min().copied().unwrap_or(0),
                series.iter().max().copied().unwrap_or(0),
            );
            let _ = writeln!(out, "\n{} (limit {low}-{high} over the run)", kind.name());
            for row in 0..HEIGHT {
                // The label is the bottom of the row's range.
                let label = top as f64 * (HEIGHT - 1 - row) as f64 / HEIGHT as f64;
                let label = if row % 2 == 1 {
                    format!("{label:>5.0}")
                } else {
                    " ".repeat(5)
                };
                let cells: String = grid.iter().map(|cells| cells[row]).collect();
                let _ = writeln!(out, "{label} |{cells}");
            }
            let _ = writeln!(out, "      +{}", "-".repeat(columns));
            let mut axis = vec![' '; columns + 8];
            for bound in options.boundaries() {
                let column = ((bound.as_secs_f64() / SAMPLE_EVERY.as_secs_f64()) / per_column)
                    .round() as usize;
                let text = format!("{:.0}s", bound.as_secs_f64());
                for (offset, c) in text.chars().enumerate() {
                    if let Some(cell) = axis.get_mut(column + offset) {
                        *cell = c;
                    }
                }
            }
            let _ = writeln!(out, "       {}", axis.iter().collect::<String>().trim_end());
        }
        out
    }

    fn write_csv(&self) -> std::io::Result<()> {
        let path = &self.options.csv;
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)?;
        }
        let mut csv = String::from("t_s,capacity");
        for kind in &self.kinds {
            let _ = write!(csv, ",{}", kind.name());
        }
        csv.push('\n');
        let capacities = self.options.capacities();
        for (sample, row) in self.limits.iter().enumerate() {
            let at = SAMPLE_EVERY * sample as u32;
            let _ = write!(
                csv,
                "{:.1},{}",
                at.as_secs_f64(),
                capacities[self.options.phase_at(at)]
            );
            for limit in row {
                let _ = write!(csv, ",{limit}");
            }
            csv.push('\n');
        }
        std::fs::write(path, csv)
    }
}

// ---- The run ----------------------------------------------------------------

/// Sends one call through `limiter`, in a task of its own, and counts what
/// became of it.
fn issue(limiter: &Limiter, phase: usize, clock: &RunClock, outstanding: &Arc<AtomicUsize>) {
    let started = Instant::now();
    // `oneshot` polls readiness and calls in one poll: a peer's pending
    // permit is given up as soon as LoadShed has refused the call.
    let mut call = limiter.service.clone().oneshot(());
    // Polled here first: most arrivals are shed at once, and need no task
    // of their own (fewer tasks, less of the runtime's own delay in every
    // latency). A call still pending goes on in a task, whose first poll
    // registers its real waker.
    let mut noop = Context::from_waker(std::task::Waker::noop());
    if let Poll::Ready(result) = Pin::new(&mut call).poll(&mut noop) {
        let answered_in = clock.phase_now();
        limiter
            .probe
            .tally
            .record(phase, answered_in, classify(result, started.elapsed()));
        return;
    }
    let tally = limiter.probe.tally.clone();
    let outstanding = outstanding.clone();
    let clock = clock.clone();
    outstanding.fetch_add(1, Ordering::SeqCst);
    tokio::spawn(async move {
        let result = call.await;
        let answered_in = clock.phase_now();
        tally.record(phase, answered_in, classify(result, started.elapsed()));
        outstanding.fetch_sub(1, Ordering::SeqCst);
    });
}

/// When the run started, to tell in which phase a call was answered.
#[derive(Clone, Debug)]
struct RunClock {
    start: Instant,
    bounds: [Duration; 4],
}

impl RunClock {
    /// The phase now, if the run is not over.
    fn phase_now(&self) -> Option<usize> {
        let at = self.start.elapsed();
        (at < self.bounds[3]).then(|| {
            (0..3)
                .rev()
                .find(|&phase| at >= self.bounds[phase])
                .unwrap_or(0)
        })
    }
}

async fn run(options: Options) -> Result<Results, String> {
    let capacities = options.capacities();
    let mut limiters = Vec::new();
    for kind in Kind::ALL {
        let wanted = options.only.as_ref().is_none_or(|only| {
            only.iter()
                .any(|part| kind.name().to_lowercase().contains(&part.to_lowercase()))
        });
        if !wanted {
            continue;
        }
        // The same seed for every dependency: each draws the same sequence
        // of service times (in the order calls reach it), as every limiter
        // sees the same arrivals.
        let dependency = Dependency::new(
            capacities[0],
            options.base,
            options.jitter,
            options.seed.wrapping_mul(31).wrapping_add(7),
        );
        let inner = Timeout::new(DependencyService(dependency.clone()), options.timeout);
        match kind.build(inner, &options) {
            Ok((service, limit)) => limiters.push(Limiter {
                kind,
                service,
                probe: Arc::new(Probe {
                    name: kind.name(),
                    limit,
                    dependency,
                    tally: Arc::new(Tally::new()),
                }),
            }),
            // Reported, not faked: the run goes on without it.
            Err(error) => eprintln!("{}: could not be built: {error}", kind.name()),
        }
    }
    if limiters.is_empty() {
        return Err("no limiter to run (see --only)".into());
    }
    let probes: Arc<Vec<Arc<Probe>>> = Arc::new(limiters.iter().map(|l| l.probe.clone()).collect());
    let bounds = options.boundaries();
    let total = bounds[3];
    eprintln!(
        "{} limiters, {:.0} arrivals/s, phases C={} / {} / {} of {:.0}+{:.0}+{:.0} s",
        limiters.len(),
        options.arrival_rate(),
        capacities[0],
        capacities[1],
        capacities[2],
        options.phases[0].as_secs_f64(),
        options.phases[1].as_secs_f64(),
        options.phases[2].as_secs_f64(),
    );

    let start = tokio::time::Instant::now();
    let done = Arc::new(AtomicBool::new(false));

    // The capacity changes at each phase's start.
    let phases = {
        let probes = probes.clone();
        tokio::spawn(async move {
            for phase in 1..3 {
                tokio::time::sleep_until(start + bounds[phase]).await;
                for probe in probes.iter() {
                    probe.dependency.set_workers(capacities[phase]);
                }
            }
        })
    };

    // The limits, every 100 ms; progress every second.
    let sampler = {
        let probes = probes.clone();
        let options = options.clone();
        tokio::spawn(async move {
            let mut rows: Vec<Vec<usize>> = Vec::new();
            let mut ticks = tokio::time::interval_at(start, SAMPLE_EVERY);
            let samples = (total.as_secs_f64() / SAMPLE_EVERY.as_secs_f64()).round() as usize;
            while rows.len() < samples {
                ticks.tick().await;
                let row: Vec<usize> = probes.iter().map(|p| (p.limit)()).collect();
                if rows.len().is_multiple_of(10) {
                    let at = SAMPLE_EVERY * rows.len() as u32;
                    let phase = options.phase_at(at);
                    let mut line = format!(
                        "[{:>5.1} s] phase {} C={:<3} limits:",
                        at.as_secs_f64(),
                        phase + 1,
                        capacities[phase]
                    );
                    for (probe, limit) in probes.iter().zip(&row) {
                        let _ = write!(line, " {}={limit}", probe.name);
                    }
                    eprintln!("{line}");
                }
                rows.push(row);
            }
            rows
        })
    };

    // How late the runtime wakes a 1 ms sleep: every latency includes it,
    // so it says whether the machine kept up with the simulation.
    let lag = {
        let done = done.clone();
        let options = options.clone();
        tokio::spawn(async move {
            let mut lags: [Vec<u32>; 3] = Default::default();
            while !done.load(Ordering::SeqCst) {
                let before = tokio::time::Instant::now();
                tokio::time::sleep(Duration::from_millis(1)).await;
                let late = before.elapsed().saturating_sub(Duration::from_millis(1));
                let phase = options.phase_at(before - start);
                lags[phase].push(late.as_micros() as u32);
            }
            lags.map(|mut lags| {
                lags.sort_unstable();
                let at = (lags.len() * 99 / 100).min(lags.len().saturating_sub(1));
                Duration::from_micros(lags.get(at).copied().unwrap_or(0).into())
            })
        })
    };

    // Poisson arrivals, the same instants for every limiter, sent from a
    // thread of their own. Not from a tokio timer: it wakes on whole
    // milliseconds, the same ticks on which the dependency's calls end, and
    // the arrivals of a tick were sent before the calls ending on it had
    // given back their slots. A slot would then stay empty a millisecond
    // after every call, 9 % of a 10 ms dependency's capacity lost to the
    // simulation. `std::thread::sleep` wakes within some 0.1 ms instead.
    let outstanding = Arc::new(AtomicUsize::new(0));
    let arrivals = {
        let outstanding = outstanding.clone();
        let options = options.clone();
        let start = start.into_std();
        let clock = RunClock {
            start,
            bounds: options.boundaries(),
        };
        // A thread of tokio's blocking pool: it is inside the runtime, so
        // the calls it polls can make timers and spawn tasks.
        tokio::task::spawn_blocking(move || {
            let mut rng = Rng(options.seed);
            let rate = options.arrival_rate();
            let mut next = rng.exponential(rate);
            while next < total {
                let now = start.elapsed();
                if next > now {
                    std::thread::sleep(next - now);
                }
                let phase = options.phase_at(next);
                for limiter in &limiters {
                    issue(limiter, phase, &clock, &outstanding);
                }
                next += rng.exponential(rate);
            }
            limiters
        })
    };
    let limiters = arrivals.await.map_err(|e| e.to_string())?;

    // Let the calls still in flight finish (at most the client timeout).
    let deadline = Instant::now() + options.timeout + Duration::from_millis(500);
    while outstanding.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    done.store(true, Ordering::SeqCst);
    let limits = sampler.await.map_err(|e| e.to_string())?;
    let lag_p99 = lag.await.map_err(|e| e.to_string())?;
    phases.await.map_err(|e| e.to_string())?;
    let unfinished = outstanding.load(Ordering::SeqCst);
    if unfinished > 0 {
        eprintln!("{unfinished} calls still unanswered at the end: not counted");
    }

    let kinds: Vec<Kind> = limiters.iter().map(|l| l.kind).collect();
    let mut results = Results {
        options: options.clone(),
        kinds,
        phases: Vec::new(),
        limits,
        lag_p99,
    };
    for (phase, &capacity) in capacities.iter().enumerate() {
        let mut row: Vec<PhaseResult> = limiters
            .iter()
            .enumerate()
            .map(|(index, limiter)| {
                let tally = limiter.probe.tally.phases[phase].lock().unwrap();
                let limits = results.phase_limits(phase, index);
                PhaseResult::new(&tally, options.phases[phase], &limits, capacity)
            })
            .collect();
        let best = row.iter().map(|r| r.goodput).fold(0.0, f64::max);
        for result in &mut row {
            result.of_best = if best > 0.0 {
                100.0 * result.goodput / best
            } else {
                0.0
            };
        }
        results.phases.push(row);
    }
    Ok(results)
}

#[tokio::main]
async fn main() {
    let options = match Options::parse(std::env::args().skip(1)) {
        Ok(Some(options)) => options,
        Ok(None) => return,
        Err(error) => {
            eprintln!("{error}");
            std::process::exit(2);
        }
    };
    let started = Instant::now();
    let results = match run(options.clone()).await {
        Ok(results) => results,
        Err(error) => {
            eprintln!("{error}");
            std::process::exit(1);
        }
    };
    eprintln!("done in {:.1} s", started.elapsed().as_secs_f64());

    println!(
        "A dependency of C = {} workers at {:.0} ms a call (+-{:.1} ms), FIFO queue in front; \
         Poisson arrivals at {:.0}/s ({}x C's throughput); client timeout {:.0} ms; \
         adaptive limits of tower-inflight with max {}.",
        options.capacity,
        options.base.as_secs_f64() * 1e3,
        options.jitter.as_secs_f64() * 1e3,
        options.arrival_rate(),
        options.load,
        options.timeout.as_secs_f64() * 1e3,
        options.max,
    );
    print!("{}", results.tables());
    print!("{}", results.targets());
    print!("{}", results.charts());
    println!();
    print!("{LEGEND}");
    match results.write_csv() {
        Ok(()) => println!(
            "\nThe limit every 100 ms, one column per limiter: {}",
            options.csv.display()
        ),
        Err(error) => eprintln!("could not write {}: {error}", options.csv.display()),
    }
}
