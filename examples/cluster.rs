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
//! `PATH` unless `--redis` is given. It exits with an error if the ceiling
//! is ever exceeded inside the route, if a call fails, or if goodput under
//! the ceiling is below `--min-goodput` of what 10 slots can serve (a
//! release build on an idle machine serves 98.5 % or more). Goodput is the
//! demo's figure, and a coarse check: a ceiling left idle, or slots handed
//! on slowly, shows in it, where a lease or two lost in a run may not
//! (`tests/cluster.rs` counts leases exactly).
//!
//! Each replica runs 16 workers that call the dependency as fast as their
//! bulkhead lets them, waiting up to a second for a slot. The dependency
//! counts the calls inside its route at once, and how long each took.
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
use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_inflight::redis::ClusterCeiling;
use tower_inflight::{Bulkhead, ConcurrencyLayer, Config, ServiceSaturated};

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
    } else if let Some(count) = arg("--hold") {
        hold(count.parse().expect("--hold takes a count")).await;
    } else {
        std::process::exit(parent().await);
    }
}

/// What the dependency saw: calls inside its route now and at most, and the
/// calls served and the time they spent inside.
#[derive(Default)]
struct Route {
    inside: AtomicUsize,
    peak: AtomicUsize,
    served: AtomicU64,
    busy_micros: AtomicU64,
}

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
    let _own_redis;
    let redis_url = match arg("--redis") {
        Some(url) => url,
        None => {
            let server = OwnRedis::start();
            let url = server.url();
            _own_redis = server;
            url
        }
    };

    let route = Arc::new(Route::default());
    let app = Router::new().route(
        "/work",
        get({
            let route = route.clone();
            move || {
                let route = route.clone();
                async move {
                    let started = Instant::now();
                    let inside = route.inside.fetch_add(1, Ordering::SeqCst) + 1;
                    route.peak.fetch_max(inside, Ordering::SeqCst);
                    tokio::time::sleep(route_time).await;
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

    println!(
        "{REPLICAS} replicas, each a bulkhead of {LOCAL_LIMIT} with {WORKERS} workers, \
         in front of one route of {} ms, {seconds} s a run\n",
        route_time.as_millis()
    );
    println!(
        "{:<28} {:>10} {:>10} {:>12} {:>12} {:>10}",
        "", "peak", "served/s", "goodput", "shed", "errors"
    );
    let mut failed = false;
    let mut summary = String::new();
    for ceiling in [None, Some(CEILING)] {
        let run = run(&route, &dependency, &redis_url, ceiling, seconds).await;
        let label = match ceiling {
            None => "local limits alone".to_string(),
            Some(ceiling) => format!("with a ceiling of {ceiling}"),
        };
        // What `ceiling` slots can serve in the window, at the route's
        // measured time a call.
        let capacity = ceiling.map(|ceiling| ceiling as f64 * run.window / run.route_time);
        let goodput = capacity.map(|capacity| run.served as f64 / capacity);
        println!(
            "{label:<28} {:>10} {:>10.0} {:>12} {:>12} {:>10}",
            run.peak,
            run.served as f64 / run.window,
            goodput.map_or("-".into(), |goodput| format!("{:.1} %", goodput * 100.0)),
            run.shed,
            run.errors,
        );
        if let (Some(ceiling), Some(goodput)) = (ceiling, goodput) {
            if run.peak > ceiling || goodput < min_goodput || run.errors > 0 {
                failed = true;
            }
            summary = format!(
                r#"{{"ceiling":{ceiling},"peak":{},"served":{},"capacity":{:.1},"goodput":{goodput:.4},"errors":{}}}"#,
                run.peak,
                run.served,
                capacity.unwrap_or_default(),
                run.errors
            );
        }
    }
    println!(
        "\npeak: calls inside the route at once, across all replicas; goodput: calls \
         served in the measured window over what {CEILING} slots serve at the route's time."
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

struct Run {
    peak: usize,
    served: u64,
    window: f64,
    route_time: f64,
    shed: u64,
    errors: u64,
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
            command.spawn().expect("a replica starts")
        })
        .collect();

    // Measured from a little after the start to a little before the end,
    // when every replica is running.
    let (from, to) = (start_at + 300, start_at + seconds * 1_000 - 100);
    tokio::time::sleep(Duration::from_millis(from.saturating_sub(unix_millis()))).await;
    route
        .peak
        .store(route.inside.load(Ordering::SeqCst), Ordering::SeqCst);
    let (served, busy) = (
        route.served.load(Ordering::SeqCst),
        route.busy_micros.load(Ordering::SeqCst),
    );
    tokio::time::sleep(Duration::from_millis(to.saturating_sub(unix_millis()))).await;
    let served = route.served.load(Ordering::SeqCst) - served;
    let busy = route.busy_micros.load(Ordering::SeqCst) - busy;
    let peak = route.peak.load(Ordering::SeqCst);

    let (mut shed, mut errors) = (0, 0);
    for child in children {
        let output = tokio::task::spawn_blocking(|| child.wait_with_output().unwrap())
            .await
            .unwrap();
        let line = String::from_utf8_lossy(&output.stdout);
        let counts: Vec<u64> = line
            .split_whitespace()
            .map(|count| count.parse().unwrap())
            .collect();
        shed += counts[1];
        errors += counts[2];
    }
    Run {
        peak,
        served,
        window: (to - from) as f64 / 1_000.0,
        route_time: busy as f64 / 1e6 / served.max(1) as f64,
        shed,
        errors,
    }
}

fn ceiling_config(local: usize, wait: Option<Duration>) -> Config {
    let mut config = Config::new(local, Duration::from_secs(30));
    if let Some(wait) = wait {
        config = config.wait(wait);
    }
    if let Some(ceiling) = arg("--ceiling") {
        let client = redis::Client::open(arg("--redis").expect("--redis")).unwrap();
        let mut ceiling = ClusterCeiling::new(
            client,
            arg("--name").expect("--name"),
            ceiling.parse().unwrap(),
        );
        if let Some(lease) = arg("--lease-ms") {
            ceiling = ceiling.lease(Duration::from_millis(lease.parse().unwrap()));
        }
        config = config.cluster_ceiling(ceiling);
    }
    config
}

/// A replica: its workers call the dependency through its bulkhead until
/// the run ends, then it prints `admitted shed errors`.
async fn node() {
    let dependency: http::Uri = arg("--dependency").expect("--dependency").parse().unwrap();
    let start_at = number("--start-at", 0);
    let end_at = start_at + number("--seconds", 4) * 1_000;
    let layer = ConcurrencyLayer::new(ceiling_config(LOCAL_LIMIT, Some(Duration::from_secs(1))));
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let service = ServiceBuilder::new().layer(layer).service(client);
    tokio::time::sleep(Duration::from_millis(
        start_at.saturating_sub(unix_millis()),
    ))
    .await;

    let counts = Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let (mut service, dependency, counts) =
                (service.clone(), dependency.clone(), counts.clone());
            tokio::spawn(async move {
                while unix_millis() < end_at {
                    let request = Request::get(dependency.clone()).body(Empty::new()).unwrap();
                    let outcome = match service.ready().await {
                        Ok(ready) => ready.call(request).await,
                        Err(error) => Err(error),
                    };
                    let counted = match outcome {
                        Ok(response) => {
                            let _ = response.into_body().collect().await;
                            0
                        }
                        Err(error) if error.is::<ServiceSaturated>() => 1,
                        Err(_) => 2,
                    };
                    counts[counted].fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.unwrap();
    }
    let [admitted, shed, errors] = &*counts;
    println!(
        "{} {} {}",
        admitted.load(Ordering::Relaxed),
        shed.load(Ordering::Relaxed),
        errors.load(Ordering::Relaxed)
    );
}

/// Takes `count` leases, says so, and hangs until killed.
async fn hold(count: usize) {
    let bulkhead = Bulkhead::new(ceiling_config(count, None));
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
