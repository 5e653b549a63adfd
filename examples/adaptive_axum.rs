//! An adaptive limit on a real server: an axum handler standing in for a
//! dependency whose capacity halves and comes back, served behind
//! `HttpConcurrencyLayer` with `Adaptive::default()`, loaded over HTTP.
//!
//! ```text
//! cargo run --release --example adaptive_axum --features axum -- --help
//! # the server and its own open-loop load generator, in one process
//! cargo run --release --example adaptive_axum --features axum -- --load-gen
//! cargo run --release --example adaptive_axum --features axum -- --load-gen --static 16
//! # the server alone, loaded by anything else
//! cargo run --release --example adaptive_axum --features axum &
//! wrk -t2 -c64 -d30s --latency http://127.0.0.1:3000/
//! ```
//!
//! The handler is `examples/adaptive.rs`'s dependency on a real socket: C
//! workers (a FIFO semaphore of C permits) at about 10 ms a call, C for the
//! first phase, C/2 for the second, C again for the third. The phases start
//! with the first request to `/`, so whatever loads the server sees them
//! from its start. The server prints the limit in force every second, and
//! at the end a table per phase of what it answered; with `--load-gen`, a
//! table of what its own client saw too.

use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use axum::serve::ListenerExt;
use axum::Router;
use bytes::Bytes;
use http::{StatusCode, Uri};
use http_body_util::Empty;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use tower_inflight::adaptive::Adaptive;
use tower_inflight::http::HttpConcurrencyLayer;
use tower_inflight::{Bulkhead, Config};

// The demos' shared pieces: a seeded generator, a counter held while alive,
// and a request sent and read to its end. (This one serves on a port of its
// own and builds its client with `nodelay`: the rest goes unused.)
#[allow(dead_code)]
#[path = "shared/demo.rs"]
mod demo;
use demo::{sent, Counted, HttpClient, Rng, Status};

/// A GET of `uri`, with no body.
fn get_request(uri: Uri) -> http::Request<Empty<Bytes>> {
    http::Request::get(uri)
        .body(Empty::new())
        .expect("a GET of a valid URI")
}

const HELP: &str = "\
adaptive_axum: an adaptive limit on a real axum server, whose dependency's
capacity halves and comes back

The handler of GET / stands in for a dependency of true capacity C: C workers
(a tokio Semaphore of C permits, which queues its waiters first come first
served), each call BASE ms with a uniform jitter of +-JITTER ms. Its capacity
is C for the first phase, C/2 for the second and C again for the third; the
phases start with the first request to / (so a load generator started after
the server sees them from its own start), and the server exits 2 s after the
third ends. The handler is served behind HttpConcurrencyLayer with
Config::new(MAX, 30 s).adaptive(Adaptive::default()), or with a static limit
(--static N). It never learns C: it sees only its calls' latencies.

Every second it prints the limit in force (and its range over the second,
sampled every 100 ms), the calls in flight in the bulkhead, the dependency's
workers busy and calls queued for one, C, and the 200s and 503s answered.
At the end, a table per phase of what the server answered (latency from the
request's arrival to its response's head), and whether the limit came back
within 0.75-1.5x C after each change. GET /status (outside the bulkhead)
answers the limit, the calls in flight and C at any time.

With --load-gen, it also loads itself with an open-loop generator on a
runtime of its own: Poisson arrivals at RATE a second (LOAD times C's
throughput, C / BASE calls a second, unless --rate), each request on a task
of its own over a pool of keep-alive connections (hyper-util's client), with
a client timeout of TIMEOUT ms. Latency is from when a request was due (not
when it was sent) to the end of its body. It prints a table per phase:
goodput, p50/p99 of the 200s, % 503, % timed out.

Options:
  --port N          port on 127.0.0.1                         [default: 3000]
  --capacity C      the dependency's capacity in phases 1 and 3; C/2 in
                    phase 2                                     [default: 16]
  --phase-secs S    length of each of the three phases        [default: 10]
  --base-ms MS      service time of a call without queueing   [default: 10]
  --jitter-ms MS    uniform jitter around it, +-              [default: 1]
  --max N           the most the adaptive limit may set       [default: 200]
  --static N        a static limit of N instead of the adaptive one
  --load-gen        run the built-in open-loop load generator too
  --load X          its arrival rate, as a multiple of C's throughput
                                                               [default: 2]
  --rate R          its arrival rate, in requests a second (instead of --load)
  --timeout-ms MS   its client timeout                        [default: 1000]
  --seed N          seed of the arrivals and service times    [default: 1]
  -h, --help        this text
";

/// How often the limit is sampled (for the range printed each second and
/// the time back near C).
const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// How long the server answers after the third phase, so that a load
/// generator started after it ends its run cleanly.
const GRACE: Duration = Duration::from_secs(2);

// ---- Options ----------------------------------------------------------------

#[derive(Clone, Debug)]
struct Options {
    port: u16,
    capacity: usize,
    phase: Duration,
    base: Duration,
    jitter: Duration,
    max: usize,
    static_limit: Option<usize>,
    load_gen: bool,
    load: f64,
    rate: Option<f64>,
    timeout: Duration,
    seed: u64,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            port: 3000,
            capacity: 16,
            phase: Duration::from_secs(10),
            base: Duration::from_millis(10),
            jitter: Duration::from_millis(1),
            max: 200,
            static_limit: None,
            load_gen: false,
            load: 2.0,
            rate: None,
            timeout: Duration::from_millis(1_000),
            seed: 1,
        }
    }
}

impl Options {
    /// The options, or `None` after printing the help.
    fn parse(mut args: impl Iterator<Item = String>) -> Result<Option<Self>, String> {
        let mut options = Self::default();
        while let Some(flag) = args.next() {
            match flag.as_str() {
                "-h" | "--help" => {
                    print!("{HELP}");
                    return Ok(None);
                }
                "--load-gen" => {
                    options.load_gen = true;
                    continue;
                }
                _ => {}
            }
            const TAKING_A_VALUE: [&str; 11] = [
                "--port",
                "--capacity",
                "--phase-secs",
                "--base-ms",
                "--jitter-ms",
                "--max",
                "--static",
                "--load",
                "--rate",
                "--timeout-ms",
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
                "--port" => {
                    options.port = value
                        .parse()
                        .map_err(|_| format!("--port: {value:?} is not a port"))?
                }
                "--capacity" => options.capacity = number(&value)? as usize,
                "--phase-secs" => options.phase = Duration::from_secs_f64(number(&value)?),
                "--base-ms" => options.base = millis(&value)?,
                "--jitter-ms" => options.jitter = millis(&value)?,
                "--max" => options.max = number(&value)? as usize,
                "--static" => options.static_limit = Some(number(&value)? as usize),
                "--load" => options.load = number(&value)?,
                "--rate" => options.rate = Some(number(&value)?),
                "--timeout-ms" => options.timeout = millis(&value)?,
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
        if options.phase < SAMPLE_EVERY * 10 {
            return Err("--phase-secs must be at least 1".into());
        }
        if options.max == 0 || options.static_limit == Some(0) {
            return Err("--max and --static must be at least 1".into());
        }
        if options.arrival_rate() <= 0.0 || options.timeout.is_zero() {
            return Err("--load (or --rate) and --timeout-ms must be over 0".into());
        }
        Ok(Some(options))
    }

    /// The dependency's capacity in each phase: C, C/2, C.
    fn capacities(&self) -> [usize; 3] {
        [self.capacity, self.capacity / 2, self.capacity]
    }

    fn total(&self) -> Duration {
        self.phase * 3
    }

    /// The phase `at` (from the start of the run) falls in; `None` after
    /// the third.
    fn phase_at(&self, at: Duration) -> Option<usize> {
        let phase = (at.as_secs_f64() / self.phase.as_secs_f64()) as usize;
        (phase < 3).then_some(phase)
    }

    /// The load generator's requests a second.
    fn arrival_rate(&self) -> f64 {
        self.rate
            .unwrap_or(self.load * self.capacity as f64 / self.base.as_secs_f64())
    }

    fn limiter(&self) -> String {
        match self.static_limit {
            Some(limit) => format!("static limit {limit}"),
            None => format!("adaptive limit (Adaptive::default(), max {})", self.max),
        }
    }
}

// ---- The dependency ---------------------------------------------------------

/// C workers: a call takes a permit of a semaphore (tokio's is fair: its
/// waiters are served first come first served, the FIFO queue in front of
/// the workers), works for `base` ± `jitter`, and gives the permit back.
/// Latency is `base` while fewer than C calls are inside, and grows with the
/// queue after that: what the adaptive limit has to read.
#[derive(Debug)]
struct Dependency {
    base: Duration,
    jitter: Duration,
    workers: Semaphore,
    capacity: AtomicUsize,
    /// Permits to forget as they come back: the part of a cut that the free
    /// permits could not pay at once. Calls in service when capacity shrinks
    /// finish; no new one starts until fewer than the new C are busy.
    owed: AtomicUsize,
    working: AtomicUsize,
    queued: AtomicUsize,
    rng: Mutex<Rng>,
}

impl Dependency {
    fn new(options: &Options) -> Self {
        Self {
            base: options.base,
            jitter: options.jitter,
            workers: Semaphore::new(options.capacity),
            capacity: AtomicUsize::new(options.capacity),
            owed: AtomicUsize::new(0),
            working: AtomicUsize::new(0),
            queued: AtomicUsize::new(0),
            rng: Mutex::new(Rng::new(options.seed.wrapping_mul(31).wrapping_add(7))),
        }
    }

    fn set_capacity(&self, capacity: usize) {
        let old = self.capacity.swap(capacity, Ordering::SeqCst);
        if capacity < old {
            let cut = old - capacity;
            let taken = self.workers.forget_permits(cut);
            self.owed.fetch_add(cut - taken, Ordering::SeqCst);
        } else {
            let grow = capacity - old;
            // What is still owed was never forgotten: cancel it first.
            let owed = self
                .owed
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |owed| {
                    Some(owed - owed.min(grow))
                })
                .unwrap_or(0);
            self.workers.add_permits(grow - owed.min(grow));
        }
    }

    /// One call, from its arrival at the dependency to its answer.
    async fn serve(&self) {
        let took = {
            let spread =
                (2.0 * self.rng.lock().unwrap().next_unit() - 1.0) * self.jitter.as_secs_f64();
            Duration::from_secs_f64(self.base.as_secs_f64() + spread)
        };
        let permit = {
            let (_queued, _) = Counted::new(&self.queued);
            self.workers.acquire().await.expect("never closed")
        };
        let (_working, _) = Counted::new(&self.working);
        // Given back (or forgotten, while a cut is owed) however the call
        // ends, cancelled included.
        let _worker = Worker {
            permit: Some(permit),
            owed: &self.owed,
        };
        tokio::time::sleep(took).await;
    }
}

struct Worker<'a> {
    permit: Option<tokio::sync::SemaphorePermit<'a>>,
    owed: &'a AtomicUsize,
}

impl Drop for Worker<'_> {
    fn drop(&mut self) {
        let Some(permit) = self.permit.take() else {
            return;
        };
        let owing = self
            .owed
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |owed| {
                owed.checked_sub(1)
            })
            .is_ok();
        if owing {
            permit.forget();
        }
    }
}

// ---- The server -------------------------------------------------------------

/// What the server answered in one phase.
#[derive(Debug, Default)]
struct Tally {
    ok: AtomicU64,
    shed: AtomicU64,
    other: AtomicU64,
    /// Of the 200s: from the request's arrival to its response's head, µs.
    latencies: Mutex<Vec<u32>>,
}

#[derive(Debug)]
struct Shared {
    options: Options,
    dependency: Dependency,
    /// When the run (phase 1) started: the first request to `/`, or the
    /// built-in load generator's first arrival.
    start: OnceLock<Instant>,
    phases: [Tally; 3],
    /// 200s and 503s since the last line printed.
    second_ok: AtomicU64,
    second_shed: AtomicU64,
}

impl Shared {
    fn start(&self) -> Instant {
        *self.start.get_or_init(Instant::now)
    }
}

async fn handler(State(shared): State<Arc<Shared>>) -> &'static str {
    shared.dependency.serve().await;
    "ok\n"
}

/// Outside the bulkhead: counts what it answers, its own 503s included.
async fn measure(State(shared): State<Arc<Shared>>, request: Request, next: Next) -> Response {
    let start = shared.start();
    let arrived = Instant::now();
    let response = next.run(request).await;
    let Some(phase) = shared
        .options
        .phase_at(arrived.saturating_duration_since(start))
    else {
        return response;
    };
    let tally = &shared.phases[phase];
    match response.status() {
        StatusCode::OK => {
            let latency = arrived.elapsed().as_micros().min(u32::MAX as u128) as u32;
            tally.ok.fetch_add(1, Ordering::Relaxed);
            shared.second_ok.fetch_add(1, Ordering::Relaxed);
            tally.latencies.lock().unwrap().push(latency);
        }
        StatusCode::SERVICE_UNAVAILABLE => {
            tally.shed.fetch_add(1, Ordering::Relaxed);
            shared.second_shed.fetch_add(1, Ordering::Relaxed);
        }
        _ => {
            tally.other.fetch_add(1, Ordering::Relaxed);
        }
    }
    response
}

async fn status(State((shared, bulkhead)): State<(Arc<Shared>, Bulkhead)>) -> String {
    format!(
        "limit {} in flight {} C {}\n",
        bulkhead.limit(),
        bulkhead.in_flight(),
        shared.dependency.capacity.load(Ordering::SeqCst)
    )
}

/// The limit and the calls in flight, every 100 ms from the start of the
/// run to the end of the third phase; a line every second; the capacity
/// changed at each phase's start.
async fn watch(shared: Arc<Shared>, bulkhead: Bulkhead) -> Vec<(usize, usize)> {
    while shared.start.get().is_none() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let start = tokio::time::Instant::from_std(shared.start());
    let options = &shared.options;
    let capacities = options.capacities();
    println!("run started: phase 1, C = {}", capacities[0]);
    {
        let shared = shared.clone();
        tokio::spawn(async move {
            for (phase, &capacity) in capacities.iter().enumerate().skip(1) {
                tokio::time::sleep_until(start + shared.options.phase * phase as u32).await;
                shared.dependency.set_capacity(capacity);
                println!("phase {}: C = {capacity}", phase + 1);
            }
        });
    }
    let count = (options.total().as_secs_f64() / SAMPLE_EVERY.as_secs_f64()).round() as usize;
    let mut samples = Vec::with_capacity(count);
    let mut ticks = tokio::time::interval_at(start + SAMPLE_EVERY, SAMPLE_EVERY);
    while samples.len() < count {
        ticks.tick().await;
        samples.push((bulkhead.limit(), bulkhead.in_flight()));
        if samples.len() % 10 == 0 {
            let second = &samples[samples.len() - 10..];
            let (low, high) = second
                .iter()
                .fold((usize::MAX, 0), |(low, high), &(limit, _)| {
                    (low.min(limit), high.max(limit))
                });
            let mean = second.iter().map(|&(_, n)| n).sum::<usize>() as f64 / 10.0;
            let at = samples.len() / 10;
            // The phase the second just ended began in.
            let phase = options
                .phase_at(SAMPLE_EVERY * (samples.len() - 10) as u32)
                .unwrap_or(2);
            let dependency = &shared.dependency;
            println!(
                "[{at:>3} s] C={:<3} limit {:>3} ({low}-{high})  in flight {:>3} (mean {mean:>5.1})  \
                 working {:>3} queued {:>3}  200/s {:>5} 503/s {:>5}",
                capacities[phase],
                second[9].0,
                second[9].1,
                dependency.working.load(Ordering::SeqCst),
                dependency.queued.load(Ordering::SeqCst),
                shared.second_ok.swap(0, Ordering::Relaxed),
                shared.second_shed.swap(0, Ordering::Relaxed),
            );
        }
    }
    samples
}

// ---- The built-in load generator --------------------------------------------

#[derive(Clone, Copy, Debug)]
struct Outcome {
    /// When it was due, from the start of the run.
    due: Duration,
    /// From when it was due to the end of its body.
    latency: Duration,
    status: Status,
}

/// Open loop: requests are due at Poisson instants, each sent on a task of
/// its own, whatever became of the others. On a runtime of its own (one
/// thread), the arrivals from a thread of their own: a tokio timer wakes on
/// whole milliseconds, `std::thread::sleep` within some 0.1 ms.
fn load_gen(addr: SocketAddr, shared: Arc<Shared>) -> Vec<Outcome> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime for the load generator");
    let options = shared.options.clone();
    runtime.block_on(async move {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client: HttpClient = Client::builder(TokioExecutor::new()).build(connector);
        let uri: Uri = format!("http://{addr}/").parse().expect("a URI");
        let outcomes = Arc::new(Mutex::new(Vec::new()));
        let pending = Arc::new(AtomicUsize::new(0));
        // The run starts here, unless a request from elsewhere started it.
        let start = *shared
            .start
            .get_or_init(|| Instant::now() + Duration::from_millis(50));
        let arrivals = {
            let (outcomes, pending, options) = (outcomes.clone(), pending.clone(), options.clone());
            tokio::task::spawn_blocking(move || {
                let handle = tokio::runtime::Handle::current();
                let mut rng = Rng::new(options.seed);
                let rate = options.arrival_rate();
                let mut due = Duration::from_secs_f64(rng.exponential_gap(rate));
                while due < options.total() {
                    let now = start.elapsed();
                    if due > now {
                        std::thread::sleep(due - now);
                    }
                    let (client, uri, outcomes, pending) = (
                        client.clone(),
                        uri.clone(),
                        outcomes.clone(),
                        pending.clone(),
                    );
                    let at = tokio::time::Instant::from_std(start + due);
                    let timeout = options.timeout;
                    pending.fetch_add(1, Ordering::SeqCst);
                    handle.spawn(async move {
                        let status =
                            tokio::time::timeout_at(at + timeout, sent(&client, get_request(uri)))
                                .await
                                .unwrap_or(Status::TimedOut);
                        let outcome = Outcome {
                            due,
                            latency: at.elapsed(),
                            status,
                        };
                        outcomes.lock().unwrap().push(outcome);
                        pending.fetch_sub(1, Ordering::SeqCst);
                    });
                    due += Duration::from_secs_f64(rng.exponential_gap(rate));
                }
            })
        };
        arrivals.await.expect("the arrivals");
        let deadline = Instant::now() + options.timeout + Duration::from_millis(500);
        while pending.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let outcomes = outcomes.lock().unwrap().clone();
        outcomes
    })
}

// ---- The report -------------------------------------------------------------

/// The `q` quantile (0..=1) of `values`, nearest rank, in ms; zero when
/// empty.
fn quantile_ms(values: &mut [u32], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_unstable();
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    f64::from(values[rank - 1]) / 1e3
}

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        100.0 * part as f64 / whole as f64
    }
}

/// How near C the limit kept in a phase: seconds from the phase's start
/// until it was first within 0.75-1.5x C, and after which it stayed there
/// (`None`: never); the % of the phase's samples within.
fn near_c(limits: &[usize], capacity: usize) -> (Option<f64>, Option<f64>, f64) {
    // Within 0.75-1.5x, in integers.
    let near = |limit: usize| limit * 4 >= capacity * 3 && limit * 2 <= capacity * 3;
    let step = SAMPLE_EVERY.as_secs_f64();
    // Sample `i` is taken `(i + 1)` steps into the phase.
    let first = limits
        .iter()
        .position(|&l| near(l))
        .map(|i| (i + 1) as f64 * step);
    let stays = match limits.iter().rposition(|&l| !near(l)) {
        None => Some(0.0),
        Some(last) if last + 1 < limits.len() => Some((last + 2) as f64 * step),
        Some(_) => None,
    };
    let within = limits.iter().filter(|&&l| near(l)).count();
    (first, stays, percent(within as u64, limits.len() as u64))
}

fn seconds(at: Option<f64>) -> String {
    at.map_or("never".into(), |s| format!("{s:.1} s"))
}

/// The table, and for each change of C (phases 2 and 3) the time until the
/// limit was first near the new C and after which it stayed there.
fn server_table(shared: &Shared, samples: &[(usize, usize)]) -> (String, Vec<[Option<f64>; 2]>) {
    let options = &shared.options;
    let capacities = options.capacities();
    let per_phase = samples.len() / 3;
    let secs = options.phase.as_secs_f64();
    let mut out = String::from(
        "| phase | C | requests/s | 200/s | % 503 | p50 ms | p99 ms | limit | mean in flight | near C after | stays near C after | % of time near C |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    let mut changes = Vec::new();
    for (phase, tally) in shared.phases.iter().enumerate() {
        let ok = tally.ok.load(Ordering::SeqCst);
        let shed = tally.shed.load(Ordering::SeqCst);
        let all = ok + shed + tally.other.load(Ordering::SeqCst);
        let mut latencies = tally.latencies.lock().unwrap();
        let part = &samples[phase * per_phase..(phase + 1) * per_phase];
        let limits: Vec<usize> = part.iter().map(|&(limit, _)| limit).collect();
        let low = limits.iter().min().copied().unwrap_or(0);
        let high = limits.iter().max().copied().unwrap_or(0);
        let mean = part.iter().map(|&(_, n)| n).sum::<usize>() as f64 / part.len().max(1) as f64;
        let (first, stays, within) = near_c(&limits, capacities[phase]);
        if phase > 0 {
            changes.push([first, stays]);
        }
        let _ = writeln!(
            out,
            "| {} ({:.0}-{:.0} s) | {} | {:.0} | {:.0} | {:.1} | {:.1} | {:.1} | {low}-{high} | {mean:.1} | {} | {} | {within:.0} |",
            phase + 1,
            secs * phase as f64,
            secs * (phase + 1) as f64,
            capacities[phase],
            all as f64 / secs,
            ok as f64 / secs,
            percent(shed, all),
            quantile_ms(&mut latencies, 0.50),
            quantile_ms(&mut latencies, 0.99),
            seconds(first),
            seconds(stays),
        );
    }
    (out, changes)
}

fn client_table(options: &Options, outcomes: &[Outcome]) -> String {
    let capacities = options.capacities();
    let secs = options.phase.as_secs_f64();
    let mut out = String::from(
        "| phase | C | offered/s | goodput/s | p50 ms | p99 ms | % 503 | % timed out | % failed |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for (phase, &capacity) in capacities.iter().enumerate() {
        let of_phase: Vec<&Outcome> = outcomes
            .iter()
            .filter(|o| options.phase_at(o.due) == Some(phase))
            .collect();
        let count = |status| of_phase.iter().filter(|o| o.status == status).count() as u64;
        let all = of_phase.len() as u64;
        let mut latencies: Vec<u32> = of_phase
            .iter()
            .filter(|o| o.status == Status::Ok)
            .map(|o| o.latency.as_micros().min(u32::MAX as u128) as u32)
            .collect();
        let _ = writeln!(
            out,
            "| {} ({:.0}-{:.0} s) | {capacity} | {:.0} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
            phase + 1,
            secs * phase as f64,
            secs * (phase + 1) as f64,
            all as f64 / secs,
            count(Status::Ok) as f64 / secs,
            quantile_ms(&mut latencies, 0.50),
            quantile_ms(&mut latencies, 0.99),
            percent(count(Status::Shed), all),
            percent(count(Status::TimedOut), all),
            percent(count(Status::Failed), all),
        );
    }
    out
}

// ---- main -------------------------------------------------------------------

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
    let config = Config::new(
        options.static_limit.unwrap_or(options.max),
        Duration::from_secs(30),
    );
    let config = match options.static_limit {
        Some(_) => config,
        None => config.adaptive(Adaptive::default()),
    };
    let layer = HttpConcurrencyLayer::new(config);
    let bulkhead = layer.bulkhead();
    let shared = Arc::new(Shared {
        dependency: Dependency::new(&options),
        options: options.clone(),
        start: OnceLock::new(),
        phases: Default::default(),
        second_ok: AtomicU64::new(0),
        second_shed: AtomicU64::new(0),
    });

    let app = Router::new()
        .route("/", get(handler))
        .layer(layer)
        .layer(middleware::from_fn_with_state(shared.clone(), measure))
        .with_state(shared.clone())
        // Outside the bulkhead and the count: it answers while full.
        .merge(
            Router::new()
                .route("/status", get(status))
                .with_state((shared.clone(), bulkhead.clone())),
        );
    let listener = match tokio::net::TcpListener::bind(("127.0.0.1", options.port)).await {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("cannot listen on 127.0.0.1:{}: {error}", options.port);
            std::process::exit(1);
        }
    };
    let addr = listener.local_addr().expect("a local address");
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    tokio::spawn(async move { axum::serve(listener, app).await.expect("the server") });
    let capacities = options.capacities();
    println!(
        "listening on http://{addr}/ behind {}; dependency C = {} / {} / {} for {:.0} s each, \
         {:.0} ms a call (+-{:.1} ms); the phases start with the first request to /",
        options.limiter(),
        capacities[0],
        capacities[1],
        capacities[2],
        options.phase.as_secs_f64(),
        options.base.as_secs_f64() * 1e3,
        options.jitter.as_secs_f64() * 1e3,
    );

    let load = options.load_gen.then(|| {
        println!(
            "load generator: Poisson arrivals at {:.0}/s, client timeout {:.0} ms",
            options.arrival_rate(),
            options.timeout.as_secs_f64() * 1e3
        );
        let shared = shared.clone();
        std::thread::spawn(move || load_gen(addr, shared))
    });

    let samples = watch(shared.clone(), bulkhead).await;
    let outcomes = match load {
        Some(load) => Some(
            tokio::task::spawn_blocking(move || load.join().expect("the load generator"))
                .await
                .expect("the load generator"),
        ),
        None => {
            // Answers a little longer, at C, for a generator still running.
            tokio::time::sleep(GRACE).await;
            None
        }
    };

    println!(
        "\nThe server, behind {} (latency from arrival to response head, 200s only):\n",
        options.limiter()
    );
    let (table, changes) = server_table(&shared, &samples);
    print!("{table}");
    let within = |at: Option<f64>| at.is_some_and(|s| s <= 5.0);
    let (back, stayed) = (
        changes.iter().all(|[first, _]| within(*first)),
        changes.iter().all(|[_, stays]| within(*stays)),
    );
    println!(
        "\nAfter each change of C, the limit was back within 0.75-1.5x the new C within 5 s: {} \
         ({}); and stayed there from within 5 s to the phase's end: {} ({})",
        if back { "yes" } else { "no" },
        changes
            .iter()
            .map(|[first, _]| seconds(*first))
            .collect::<Vec<_>>()
            .join(", "),
        if stayed { "yes" } else { "no" },
        changes
            .iter()
            .map(|[_, stays]| seconds(*stays))
            .collect::<Vec<_>>()
            .join(", "),
    );
    if let Some(outcomes) = outcomes {
        println!(
            "\nThe built-in load generator ({:.0}/s offered, open loop; latency from due to end of body, 200s only):\n",
            options.arrival_rate()
        );
        print!("{}", client_table(&options, &outcomes));
    }
}
