//! One ceiling for four replicas: four processes of this example, each with
//! its own bulkhead (a local limit of 8) in front of one real HTTP
//! dependency, first with their local limits alone, then with a cluster
//! ceiling of 10 on Redis.
//!
//! ```text
//! cargo run --release --example cluster --features redis              # starts its own redis-server
//! cargo run --release --example cluster --features redis -- --redis redis://127.0.0.1:6379/
//! ```
//!
//! Options: `--seconds S` (4 per run), `--route-ms N` (50), `--min-goodput F`
//! (0.95), `--json` (a last line for tests). It needs `redis-server` on
//! `PATH` unless `--redis` is given. It exits with an error if calls
//! admitted on a lease ever exceed the ceiling inside the route, if a call
//! fails, or if goodput under the ceiling is below `--min-goodput` of what
//! 10 slots can serve (a release build on an idle machine serves 98.5 % or
//! more). Goodput is the demo's figure, and a coarse check: a ceiling left
//! idle, or slots handed on slowly, shows in it, where a lease or two lost
//! in a run may not (`tests/cluster.rs` counts leases exactly).
//!
//! Each replica runs 16 workers that call the dependency as fast as their
//! bulkhead lets them, waiting up to a second for a slot. The dependency
//! counts the calls inside its route at once, and how long each took. A
//! replica whose Redis did not answer in time admits calls under its local
//! limit alone for the backoff (`FailOpen`, the default): it marks the calls
//! it may have admitted so, and the route counts them apart, so that the
//! ceiling is checked on the calls admitted on a lease (`--timeout-ms N`
//! sets the replicas' timeout for Redis, 100 by default).
//!
//! `--replicas-start-late` runs something else: replicas offered the same
//! load above a ceiling of 8 (`--fleet-ceiling`), the last one started a
//! second late (`--late-ms`; `--late N` of them), and a table of each
//! one's share of the calls served from a second after the last start, with
//! its lowest and highest share over any 2 s within, over its fair share
//! (1.00: fair). Options: `--replicas N` (4), `--workers N` (8 a replica,
//! each its local limit too), `--wait-ms N` (0: no wait budget; a shed
//! worker asks again after a millisecond), `--light-workers N` (the first
//! replica's workers), `--weights 2,1,1` (one a replica), `--seconds S`
//! (4, after the late start), `--route-ms N` (50), `--name NAME` (the
//! ceiling's name), `--lease-ms N` and `--timeout-ms N` (passed on to the
//! replicas), `--json` (with the route's peaks by tenth of a second since
//! the run's epoch). The replicas share a ceiling on `--redis URL`, on a
//! Redis Cluster (`--redis-cluster URL,URL,...`: any of its nodes) or on
//! the primary that Sentinel names (`--sentinels URL,URL,...`, the primary
//! `mymaster` or `--primary-name NAME`). `tests/cluster_processes.rs` runs
//! it on each.
//!
//! ```text
//! cargo run --release --example cluster --features redis -- --replicas-start-late
//! ```
//!
//! The same binary is the replica (`--node ...`) and a replica that takes
//! leases and hangs until it is killed (`--hold N ...`, for the tests).

use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use redis::sentinel::{SentinelClient, SentinelServerType};
use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_inflight::redis::ClusterCeiling;
use tower_inflight::{Bulkhead, ConcurrencyLayer, Config, Event, ServiceSaturated};

const REPLICAS: usize = 4;
const LOCAL_LIMIT: usize = 8;
const CEILING: usize = 10;
const WORKERS: usize = 16;

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|arg| arg == name)
        .and_then(|at| args.get(at + 1).cloned())
}

fn flag(name: &str) -> bool {
    std::env::args().any(|arg| arg == name)
}

fn number(name: &str, default: u64) -> u64 {
    arg(name).map_or(default, |value| {
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name} takes a whole number, not {value:?}"))
    })
}

/// The Redis to use: `--redis`, or a server of the demo's own, running
/// while the second value lives.
fn redis() -> (String, Option<OwnRedis>) {
    match arg("--redis") {
        Some(url) => (url, None),
        None => {
            let server = OwnRedis::start();
            (server.url(), Some(server))
        }
    }
}

/// Where the replicas' ceiling lives, as they are told it: a Redis Cluster
/// (`--redis-cluster`), a primary found through Sentinel (`--sentinels`),
/// or one node (`--redis`, a server of the demo's own if not given, running
/// while the second value lives).
fn deployment() -> (Vec<String>, Option<OwnRedis>) {
    for option in ["--redis-cluster", "--sentinels"] {
        if let Some(urls) = arg(option) {
            let mut args = vec![option.to_string(), urls];
            if let Some(name) = arg("--primary-name") {
                args.extend(["--primary-name".into(), name]);
            }
            return (args, None);
        }
    }
    let (url, own) = redis();
    (vec!["--redis".into(), url], own)
}

/// What the route did from `from` to `to` (Unix milliseconds).
struct Measured {
    /// Calls served.
    served: u64,
    /// Microseconds they spent inside.
    busy_micros: u64,
    /// The most calls inside the route at once.
    peak: usize,
    /// The most calls inside at once that their replica admitted on a
    /// lease: the ceiling's promise is that these never exceed it.
    peak_leased: usize,
    /// Calls that entered the route admitted, maybe, without a lease: their
    /// replica found Redis away around their admission (fail-open).
    without_lease: u64,
}

async fn measure(route: &Route, from: u64, to: u64) -> Measured {
    tokio::time::sleep(Duration::from_millis(from.saturating_sub(unix_millis()))).await;
    route
        .peak
        .store(route.inside.load(Ordering::SeqCst), Ordering::SeqCst);
    route
        .peak_leased
        .store(route.inside_leased.load(Ordering::SeqCst), Ordering::SeqCst);
    let (served, busy, without_lease) = (
        route.served.load(Ordering::SeqCst),
        route.busy_micros.load(Ordering::SeqCst),
        route.without_lease.load(Ordering::SeqCst),
    );
    tokio::time::sleep(Duration::from_millis(to.saturating_sub(unix_millis()))).await;
    Measured {
        served: route.served.load(Ordering::SeqCst) - served,
        busy_micros: route.busy_micros.load(Ordering::SeqCst) - busy,
        peak: route.peak.load(Ordering::SeqCst),
        peak_leased: route.peak_leased.load(Ordering::SeqCst),
        without_lease: route.without_lease.load(Ordering::SeqCst) - without_lease,
    }
}

fn unix_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[tokio::main]
async fn main() {
    if flag("--node") {
        node().await;
    } else if flag("--replicas-start-late") {
        std::process::exit(shares().await);
    } else if let Some(count) = arg("--hold") {
        hold(count.parse().expect("--hold takes a count")).await;
    } else {
        std::process::exit(parent().await);
    }
}

/// What the dependency saw: calls inside its route now and at most (all of
/// them, and those admitted on a lease), the calls served and the time
/// they spent inside, and in a shares run its peaks over time.
#[derive(Default)]
struct Route {
    inside: AtomicUsize,
    peak: AtomicUsize,
    inside_leased: AtomicUsize,
    peak_leased: AtomicUsize,
    served: AtomicU64,
    busy_micros: AtomicU64,
    without_lease: AtomicU64,
    timeline: OnceLock<Timeline>,
}

/// The route's peaks by tenth of a second since an epoch, for a test to
/// look at the moments it chose (a failover, and after): in each tenth, the
/// most calls inside at once, of those the most admitted on a lease, and
/// the calls that entered without one. Read at each call's entry: the most
/// at once is always reached at an entry.
struct Timeline {
    epoch: u64,
    peak: Vec<AtomicUsize>,
    peak_leased: Vec<AtomicUsize>,
    without_lease: Vec<AtomicUsize>,
}

impl Timeline {
    fn new(epoch: u64, end_at: u64) -> Self {
        let tenths = (end_at.saturating_sub(epoch) / 100 + 1) as usize;
        let counts = || (0..tenths).map(|_| AtomicUsize::new(0)).collect();
        Self {
            epoch,
            peak: counts(),
            peak_leased: counts(),
            without_lease: counts(),
        }
    }

    /// A call entered, with `inside` calls inside now, and `leased` of them
    /// on a lease if it is on one.
    fn enter(&self, inside: usize, leased: Option<usize>) {
        let Some(tenth) = unix_millis()
            .checked_sub(self.epoch)
            .map(|since| (since / 100) as usize)
            .filter(|&tenth| tenth < self.peak.len())
        else {
            return;
        };
        self.peak[tenth].fetch_max(inside, Ordering::SeqCst);
        if let Some(leased) = leased {
            self.peak_leased[tenth].fetch_max(leased, Ordering::SeqCst);
        } else {
            self.without_lease[tenth].fetch_add(1, Ordering::SeqCst);
        }
    }

    /// `"epoch":...,"tenth_peak":[...],...`, for the JSON line.
    fn json(&self) -> String {
        let list = |counts: &[AtomicUsize]| {
            let counts: Vec<String> = counts
                .iter()
                .map(|count| count.load(Ordering::SeqCst).to_string())
                .collect();
            counts.join(",")
        };
        format!(
            r#""epoch":{},"tenth_peak":[{}],"tenth_peak_leased":[{}],"tenth_without_lease":[{}]"#,
            self.epoch,
            list(&self.peak),
            list(&self.peak_leased),
            list(&self.without_lease),
        )
    }
}

/// The header a replica sends with a call it may have admitted without a
/// lease (Redis away, under the default `FailOpen`).
const WITHOUT_LEASE: &str = "x-without-lease";

async fn parent() -> i32 {
    let seconds = number("--seconds", 4);
    let route_time = Duration::from_millis(number("--route-ms", 50));
    let min_goodput = arg("--min-goodput").map_or(0.95, |value| {
        value
            .parse::<f64>()
            .ok()
            .filter(|fraction| (0.0..=1.0).contains(fraction))
            .unwrap_or_else(|| panic!("--min-goodput takes a fraction from 0 to 1, not {value:?}"))
    });
    let (redis_url, _own_redis) = redis();

    let (route, dependency) = serve_route(route_time).await;

    println!(
        "{REPLICAS} replicas, each a bulkhead of {LOCAL_LIMIT} with {WORKERS} workers, \
         in front of one route of {} ms, {seconds} s a run\n",
        route_time.as_millis()
    );
    println!(
        "{:<28} {:>6} {:>8} {:>10} {:>10} {:>10} {:>8} {:>8}",
        "", "peak", "leased", "served/s", "goodput", "shed", "errors", "no lease"
    );
    let mut failed = false;
    let mut summary = String::new();
    for ceiling in [None, Some(CEILING)] {
        let run = run(&route, &dependency, &redis_url, ceiling, seconds).await;
        let label = match ceiling {
            None => "local limits alone".to_string(),
            Some(ceiling) => format!("with a ceiling of {ceiling}"),
        };
        let measured = &run.measured;
        // What `ceiling` slots can serve in the window, at the route's
        // measured time a call.
        let route_time = measured.busy_micros as f64 / 1e6 / measured.served.max(1) as f64;
        let capacity = ceiling.map(|ceiling| ceiling as f64 * run.window / route_time);
        let goodput = capacity.map(|capacity| measured.served as f64 / capacity);
        println!(
            "{label:<28} {:>6} {:>8} {:>10.0} {:>10} {:>10} {:>8} {:>8}",
            measured.peak,
            ceiling.map_or("-".into(), |_| measured.peak_leased.to_string()),
            measured.served as f64 / run.window,
            goodput.map_or("-".into(), |goodput| format!("{:.1} %", goodput * 100.0)),
            run.shed,
            run.errors,
            ceiling.map_or("-".into(), |_| run.admitted_without_lease.to_string()),
        );
        if let (Some(ceiling), Some(goodput)) = (ceiling, goodput) {
            if measured.peak_leased > ceiling || goodput < min_goodput || run.errors > 0 {
                failed = true;
            }
            summary = format!(
                r#"{{"ceiling":{ceiling},"peak":{},"peak_leased":{},"without_lease":{},"admitted_without_lease":{},"redis_errors":{},"refused":{},"deferred":{},"served":{},"capacity":{:.1},"goodput":{goodput:.4},"errors":{}}}"#,
                measured.peak,
                measured.peak_leased,
                measured.without_lease,
                run.admitted_without_lease,
                run.redis_errors,
                run.refused,
                run.deferred,
                measured.served,
                capacity.unwrap_or_default(),
                run.errors
            );
        }
    }
    println!(
        "\npeak: calls inside the route at once, across all replicas; leased: of those, \
         calls admitted on a lease (the ceiling's promise: never more than it); no lease: \
         calls the replicas admitted without one, Redis away (FailOpen), over the whole \
         run; goodput: calls served in the measured window over what {CEILING} slots \
         serve at the route's time."
    );
    if flag("--json") {
        println!("{summary}");
    }
    if failed {
        eprintln!(
            "the ceiling did not hold, a call failed, or goodput under it was below {:.0} %",
            min_goodput * 100.0
        );
        1
    } else {
        0
    }
}

/// The dependency: one route that takes `route_time`, counting the calls
/// inside it. Returns its counts and its address.
async fn serve_route(route_time: Duration) -> (Arc<Route>, String) {
    let route = Arc::new(Route::default());
    let app = Router::new().route(
        "/work",
        get({
            let route = route.clone();
            move |headers: http::HeaderMap| {
                let route = route.clone();
                async move {
                    let started = Instant::now();
                    let leased = !headers.contains_key(WITHOUT_LEASE);
                    let inside = route.inside.fetch_add(1, Ordering::SeqCst) + 1;
                    route.peak.fetch_max(inside, Ordering::SeqCst);
                    let inside_leased = match leased {
                        true => {
                            let inside = route.inside_leased.fetch_add(1, Ordering::SeqCst) + 1;
                            route.peak_leased.fetch_max(inside, Ordering::SeqCst);
                            Some(inside)
                        }
                        false => {
                            route.without_lease.fetch_add(1, Ordering::SeqCst);
                            None
                        }
                    };
                    if let Some(timeline) = route.timeline.get() {
                        timeline.enter(inside, inside_leased);
                    }
                    tokio::time::sleep(route_time).await;
                    if leased {
                        route.inside_leased.fetch_sub(1, Ordering::SeqCst);
                    }
                    route.inside.fetch_sub(1, Ordering::SeqCst);
                    route.served.fetch_add(1, Ordering::SeqCst);
                    route
                        .busy_micros
                        .fetch_add(started.elapsed().as_micros() as u64, Ordering::SeqCst);
                    "done"
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dependency = format!("http://{}/work", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (route, dependency)
}

struct Run {
    measured: Measured,
    window: f64,
    shed: u64,
    errors: u64,
    /// The replicas' calls admitted without a lease, over the whole run.
    admitted_without_lease: u64,
    /// The replicas' commands to Redis that failed or timed out.
    redis_errors: u64,
    /// Leases refused, and of those, refused while places were free, kept
    /// for replicas ahead.
    refused: u64,
    deferred: u64,
}

async fn run(
    route: &Arc<Route>,
    dependency: &str,
    redis_url: &str,
    ceiling: Option<usize>,
    seconds: u64,
) -> Run {
    // A name of its own for each run: no lease of an earlier run counts.
    let name = format!("demo-{}-{}", std::process::id(), unix_millis());
    let start_at = unix_millis() + 1_000;
    let children: Vec<Child> = (0..REPLICAS)
        .map(|_| {
            let mut command = Command::new(std::env::current_exe().unwrap());
            command
                .args(["--node", "--dependency", dependency, "--redis", redis_url])
                .args(["--name", &name, "--seconds", &seconds.to_string()])
                .args(["--start-at", &start_at.to_string()])
                .stdout(Stdio::piped());
            if let Some(ceiling) = ceiling {
                command.args(["--ceiling", &ceiling.to_string()]);
            }
            command.args(passed_on());
            command.spawn().expect("a replica starts")
        })
        .collect();

    // Measured from a little after the start to a little before the end,
    // when every replica is running.
    let (from, to) = (start_at + 300, start_at + seconds * 1_000 - 100);
    let measured = measure(route, from, to).await;

    let mut run = Run {
        measured,
        window: (to - from) as f64 / 1_000.0,
        shed: 0,
        errors: 0,
        admitted_without_lease: 0,
        redis_errors: 0,
        refused: 0,
        deferred: 0,
    };
    for child in children {
        let output = tokio::task::spawn_blocking(|| child.wait_with_output().unwrap())
            .await
            .unwrap();
        let counts = NodeCounts::read(&String::from_utf8_lossy(&output.stdout));
        run.shed += counts.shed;
        run.errors += counts.errors;
        run.admitted_without_lease += counts.admitted_without_lease;
        run.redis_errors += counts.redis_errors;
        run.refused += counts.refused;
        run.deferred += counts.deferred;
    }
    run
}

/// What a replica counted: the first line of its output (see [`node`]).
struct NodeCounts {
    shed: u64,
    /// Calls that failed (1 if the replica said nothing).
    errors: u64,
    refused: u64,
    deferred: u64,
    admitted_without_lease: u64,
    redis_errors: u64,
}

impl NodeCounts {
    fn read(stdout: &str) -> Self {
        let counts: Vec<u64> = stdout
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .map(|count| count.parse().unwrap())
            .collect();
        let count = |at: usize| counts.get(at).copied().unwrap_or_default();
        Self {
            shed: count(1),
            errors: counts.get(2).copied().unwrap_or(1),
            refused: count(3),
            deferred: count(4),
            admitted_without_lease: count(5),
            redis_errors: count(6),
        }
    }
}

/// `--replicas-start-late`: replicas offered the same load above the
/// ceiling, the last of them starting late; prints each one's share of the
/// calls served once all have run for a second, and its lowest and highest
/// share over any 2 s within, against its fair share (1.00: fair).
async fn shares() -> i32 {
    let replicas = number("--replicas", REPLICAS as u64) as usize;
    let late = number("--late", 1) as usize;
    let late_ms = number("--late-ms", 1_000);
    let ceiling = number("--fleet-ceiling", 8);
    let workers = number("--workers", 8);
    let wait_ms = number("--wait-ms", 0);
    let seconds = number("--seconds", 4);
    let route_time = Duration::from_millis(number("--route-ms", 50));
    // A light replica: the first runs this many workers.
    let light = arg("--light-workers").map(|light| light.parse::<u64>().unwrap());
    let weights: Vec<u64> = match arg("--weights") {
        Some(weights) => weights.split(',').map(|w| w.parse().unwrap()).collect(),
        None => vec![1; replicas],
    };
    assert_eq!(weights.len(), replicas, "--weights: one per replica");
    assert!(
        seconds >= 3,
        "--seconds: at least 3 (a second to settle, 2 s measured)"
    );
    let (deployment, _own_redis) = deployment();
    let (route, dependency) = serve_route(route_time).await;

    let name =
        arg("--name").unwrap_or_else(|| format!("shares-{}-{}", std::process::id(), unix_millis()));
    let epoch = unix_millis() + 1_000;
    let late_at = epoch + late_ms;
    let end_at = late_at + seconds * 1_000;
    let _ = route.timeline.set(Timeline::new(epoch, end_at));
    let starts: Vec<u64> = (0..replicas)
        .map(|i| {
            if i >= replicas - late.min(replicas) {
                late_at
            } else {
                epoch
            }
        })
        .collect();
    let children: Vec<Child> = (0..replicas)
        .map(|i| {
            let workers = match light {
                Some(light) if i == 0 => light,
                _ => workers,
            };
            Command::new(std::env::current_exe().unwrap())
                .args(["--node", "--dependency", &dependency])
                .args(&deployment)
                .args(["--name", &name, "--ceiling", &ceiling.to_string()])
                .args(["--start-at", &starts[i].to_string()])
                .args(["--end-at", &end_at.to_string()])
                .args(["--epoch", &epoch.to_string()])
                .args(["--workers", &workers.to_string()])
                .args(["--local", &workers.max(1).to_string()])
                .args(["--wait-ms", &wait_ms.to_string()])
                .args(["--shed-pause-ms", "1"])
                .args(["--weight", &weights[i].to_string()])
                .args(passed_on())
                .stdout(Stdio::piped())
                .spawn()
                .expect("a replica starts")
        })
        .collect();

    // Measured once every replica has run for a second, to a little
    // before the end.
    let (from, to) = (late_at + 1_000, end_at - 100);
    let measured = measure(&route, from, to).await;
    let window = (to - from) as f64 / 1_000.0;
    let call_time = measured.busy_micros as f64 / 1e6 / measured.served.max(1) as f64;
    let goodput = measured.served as f64 / (ceiling as f64 * window / call_time);

    let mut tenths = Vec::new();
    let mut nodes = Vec::new();
    for child in children {
        let output = tokio::task::spawn_blocking(|| child.wait_with_output().unwrap())
            .await
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        nodes.push(NodeCounts::read(&stdout));
        tenths.push(
            stdout
                .lines()
                .nth(1)
                .unwrap_or_default()
                .split_whitespace()
                .map(|count| count.parse::<u64>().unwrap())
                .collect::<Vec<_>>(),
        );
    }
    let errors: u64 = nodes.iter().map(|node| node.errors).sum();
    let admitted_without_lease: u64 = nodes.iter().map(|node| node.admitted_without_lease).sum();
    let redis_errors: u64 = nodes.iter().map(|node| node.redis_errors).sum();
    // Calls served by each replica in the tenths of a second [a, b) since
    // the epoch.
    let tenth = |at: u64| ((at - epoch) / 100) as usize;
    let in_range = |replica: usize, a: usize, b: usize| -> u64 {
        tenths[replica].iter().skip(a).take(b - a).sum()
    };
    let total_weight: u64 = weights.iter().sum();
    let fair = |replica: usize| weights[replica] as f64 / total_weight as f64;
    let share = |replica: usize, a: usize, b: usize| {
        let all: u64 = (0..replicas).map(|r| in_range(r, a, b)).sum();
        in_range(replica, a, b) as f64 / all.max(1) as f64
    };
    let (a, b) = (tenth(from), tenth(to));
    println!(
        "{replicas} replicas, each {workers} workers{}, under a ceiling of {ceiling}, \
         wait budget {wait_ms} ms; {late} started {late_ms} ms late; route {} ms\n",
        light.map_or(String::new(), |light| format!(" (the first {light})")),
        route_time.as_millis()
    );
    println!(
        "{:<8} {:>6} {:>9} {:>7} {:>7} {:>8} {:>10} {:>11} {:>9} {:>9} {:>9}",
        "replica",
        "weight",
        "starts",
        "served",
        "share",
        "vs fair",
        "lowest 2s",
        "highest 2s",
        "refused",
        "deferred",
        "no lease"
    );
    let (mut lows, mut highs, mut shares) = (Vec::new(), Vec::new(), Vec::new());
    for (replica, start_at) in starts.iter().enumerate() {
        let (mut low, mut high) = (f64::MAX, 0f64);
        // Every 2 s window within, a tenth of a second apart.
        for start in a..=b.saturating_sub(20).max(a) {
            let end = (start + 20).min(b);
            let ratio = share(replica, start, end) / fair(replica);
            low = low.min(ratio);
            high = high.max(ratio);
        }
        let whole = share(replica, a, b);
        println!(
            "{:<8} {:>6} {:>9} {:>7} {:>6.1}% {:>8.2} {:>10.2} {:>11.2} {:>9} {:>9} {:>9}",
            replica,
            weights[replica],
            format!("+{} ms", start_at - epoch),
            in_range(replica, a, b),
            whole * 100.0,
            whole / fair(replica),
            low,
            high,
            nodes[replica].refused,
            nodes[replica].deferred,
            nodes[replica].admitted_without_lease,
        );
        shares.push(format!("{whole:.4}"));
        lows.push(format!("{low:.3}"));
        highs.push(format!("{high:.3}"));
    }
    println!(
        "\nmeasured from 1 s after the late start, {window:.1} s; peak {} inside the route, \
         {} of them on a lease, {} calls in the window maybe without one; goodput {:.1} % \
         of what {ceiling} slots serve; vs fair: a share over its weight's (1.00 = fair); \
         lowest/highest 2s: over any 2 s within; refused: leases refused over the whole \
         run, deferred: of those, refused while places were free, kept for replicas ahead \
         in line; no lease: calls admitted without a lease over the whole run, Redis away \
         (FailOpen; {redis_errors} commands failed or timed out)",
        measured.peak,
        measured.peak_leased,
        measured.without_lease,
        goodput * 100.0
    );
    if flag("--json") {
        println!(
            r#"{{"replicas":{replicas},"ceiling":{ceiling},"peak":{},"peak_leased":{},"without_lease":{},"admitted_without_lease":{admitted_without_lease},"redis_errors":{redis_errors},"goodput":{goodput:.4},"errors":{errors},"shares":[{}],"low":[{}],"high":[{}],{}}}"#,
            measured.peak,
            measured.peak_leased,
            measured.without_lease,
            shares.join(","),
            lows.join(","),
            highs.join(","),
            route.timeline.get().unwrap().json(),
        );
    }
    // The ceiling's promise: calls admitted on a lease never exceed it;
    // calls admitted without one, Redis away, are the documented fail-open.
    if measured.peak_leased > ceiling as usize || errors > 0 {
        eprintln!("the ceiling did not hold, or a call failed");
        1
    } else {
        0
    }
}

/// `--timeout-ms` and `--lease-ms`, those given, passed on to a replica.
fn passed_on() -> Vec<String> {
    ["--timeout-ms", "--lease-ms"]
        .into_iter()
        .filter_map(|option| arg(option).map(|value| [option.to_string(), value]))
        .flatten()
        .collect()
}

/// Whether a replica's ceiling has found Redis away (its
/// `ClusterReachable` events): calls admitted meanwhile may hold no lease
/// (`FailOpen`). With how many times that changed, so that a call that
/// straddles a change is counted as maybe without a lease too.
#[derive(Default)]
struct Reach {
    away: AtomicBool,
    changes: AtomicU64,
}

impl Reach {
    fn see(&self, event: &Event) {
        if let Event::ClusterReachable { reachable } = event {
            self.away.store(!reachable, Ordering::SeqCst);
            self.changes.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn now(&self) -> (bool, u64) {
        (
            self.away.load(Ordering::SeqCst),
            self.changes.load(Ordering::SeqCst),
        )
    }
}

fn ceiling_config(local: usize, wait: Option<Duration>, reach: Arc<Reach>) -> Config {
    let mut config =
        Config::new(local, Duration::from_secs(30)).on_event(move |event| reach.see(event));
    if let Some(wait) = wait {
        config = config.wait(wait);
    }
    if let Some(ceiling) = arg("--ceiling") {
        let (name, limit) = (arg("--name").expect("--name"), ceiling.parse().unwrap());
        let mut ceiling = if let Some(nodes) = arg("--redis-cluster") {
            let nodes: Vec<&str> = nodes.split(',').collect();
            let client = redis::cluster::ClusterClient::new(nodes).unwrap();
            ClusterCeiling::cluster(client, name, limit)
        } else if let Some(sentinels) = arg("--sentinels") {
            let client = SentinelClient::build(
                sentinels.split(',').collect(),
                arg("--primary-name").unwrap_or_else(|| "mymaster".into()),
                None,
                SentinelServerType::Master,
            )
            .unwrap();
            ClusterCeiling::sentinel(client, name, limit)
        } else {
            let client = redis::Client::open(arg("--redis").expect("--redis")).unwrap();
            ClusterCeiling::new(client, name, limit)
        };
        if let Some(lease) = arg("--lease-ms") {
            ceiling = ceiling.lease(Duration::from_millis(lease.parse().unwrap()));
        }
        if let Some(weight) = arg("--weight") {
            ceiling = ceiling.weight(weight.parse().unwrap());
        }
        if let Some(timeout) = arg("--timeout-ms") {
            ceiling = ceiling.timeout(Duration::from_millis(timeout.parse().unwrap()));
        }
        config = config.cluster_ceiling(ceiling);
    }
    config
}

/// A replica: its workers call the dependency through its bulkhead until
/// the run ends, then it prints `admitted shed errors refused deferred
/// without-lease redis-errors` (its leases refused, and of those the ones
/// refused while places were free, kept for replicas ahead in line; calls
/// admitted without a lease, Redis away; commands to Redis that failed or
/// timed out), and on a second line the calls served in each tenth of a
/// second since `--epoch`. A call it may have admitted without a lease
/// carries the `x-without-lease` header, for the route to count apart.
async fn node() {
    let dependency: http::Uri = arg("--dependency").expect("--dependency").parse().unwrap();
    let start_at = number("--start-at", 0);
    let end_at = number("--end-at", start_at + number("--seconds", 4) * 1_000);
    let epoch = number("--epoch", start_at);
    let workers = number("--workers", WORKERS as u64) as usize;
    let wait = Duration::from_millis(number("--wait-ms", 1_000));
    let shed_pause = Duration::from_millis(number("--shed-pause-ms", 0));
    let reach = Arc::new(Reach::default());
    let layer = ConcurrencyLayer::new(ceiling_config(
        number("--local", LOCAL_LIMIT as u64) as usize,
        (!wait.is_zero()).then_some(wait),
        reach.clone(),
    ));
    let bulkhead = layer.bulkhead();
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let service = ServiceBuilder::new().layer(layer).service(client);
    tokio::time::sleep(Duration::from_millis(
        start_at.saturating_sub(unix_millis()),
    ))
    .await;

    let counts = Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
    let tenths = (end_at.saturating_sub(epoch) / 100 + 1) as usize;
    let served: Arc<Vec<AtomicU64>> = Arc::new((0..tenths).map(|_| AtomicU64::new(0)).collect());
    let workers: Vec<_> = (0..workers)
        .map(|_| {
            let (mut service, dependency, counts, served, reach) = (
                service.clone(),
                dependency.clone(),
                counts.clone(),
                served.clone(),
                reach.clone(),
            );
            tokio::spawn(async move {
                while unix_millis() < end_at {
                    let before = reach.now();
                    let outcome = match service.ready().await {
                        Ok(ready) => {
                            // The slot and the lease are taken in
                            // `poll_ready`: Redis away at either end, or
                            // away and back between, the call may hold
                            // no lease.
                            let after = reach.now();
                            let mut request = Request::get(dependency.clone());
                            if before.0 || after.0 || before.1 != after.1 {
                                request = request.header(WITHOUT_LEASE, "1");
                            }
                            ready.call(request.body(Empty::new()).unwrap()).await
                        }
                        Err(error) => Err(error),
                    };
                    let counted = match outcome {
                        Ok(response) => {
                            let _ = response.into_body().collect().await;
                            let tenth = unix_millis().saturating_sub(epoch) / 100;
                            if let Some(served) = served.get(tenth as usize) {
                                served.fetch_add(1, Ordering::Relaxed);
                            }
                            0
                        }
                        Err(error) if error.is::<ServiceSaturated>() => 1,
                        Err(_) => 2,
                    };
                    counts[counted].fetch_add(1, Ordering::Relaxed);
                    if counted == 1 && !shed_pause.is_zero() {
                        tokio::time::sleep(shed_pause).await;
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.unwrap();
    }
    let [admitted, shed, errors] = &*counts;
    let cluster = bulkhead.status().cluster.unwrap_or_default();
    println!(
        "{} {} {} {} {} {} {}",
        admitted.load(Ordering::Relaxed),
        shed.load(Ordering::Relaxed),
        errors.load(Ordering::Relaxed),
        cluster.leases_refused,
        cluster.leases_deferred,
        cluster.admitted_without_lease,
        cluster.errors,
    );
    let served: Vec<String> = served
        .iter()
        .map(|tenth| tenth.load(Ordering::Relaxed).to_string())
        .collect();
    println!("{}", served.join(" "));
}

/// Takes `count` leases, says so, and hangs until killed.
async fn hold(count: usize) {
    let bulkhead = Bulkhead::new(ceiling_config(count, None, Arc::default()));
    let mut held = Vec::new();
    for _ in 0..count {
        match bulkhead.acquire().await {
            Ok(permit) => held.push(permit),
            Err(shed) => panic!("no lease: {shed}"),
        }
    }
    let status = bulkhead.status().cluster.expect("a ceiling");
    assert_eq!(
        status.leases_granted, count as u64,
        "leases, not a fallback"
    );
    println!("held {count}");
    std::io::stdout().flush().unwrap();
    std::future::pending::<()>().await;
}

/// A `redis-server` of the demo's own, on a free loopback port.
struct OwnRedis {
    child: Child,
    port: u16,
    dir: std::path::PathBuf,
}

impl OwnRedis {
    fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = std::env::temp_dir().join(format!("tower-inflight-demo-{port}"));
        std::fs::create_dir_all(&dir).unwrap();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server on PATH (apt-get install redis-server), or pass --redis URL");
        let server = Self { child, port, dir };
        let started = Instant::now();
        while !server.answers() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "redis-server never answered"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    fn answers(&self) -> bool {
        let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let mut reply = [0; 7];
        stream.write_all(b"PING\r\n").is_ok()
            && stream.read_exact(&mut reply).is_ok()
            && &reply == b"+PONG\r\n"
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
