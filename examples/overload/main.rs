//! The overload demo: one real axum server on 127.0.0.1, its handler standing
//! in for a dependency, served behind each limiter in turn and offered an
//! open-loop load from 25 % to 400 % of its capacity.
//!
//! ```text
//! cargo run --release --example overload --features axum                      # the grid, a few minutes
//! cargo run --release --example overload --features axum -- --quick           # a reduced grid, for CI
//! cargo run --release --example overload --features axum -- --arrivals paced  # evenly spaced arrivals
//! cargo run --release --example overload --features axum -- --scenario degrade
//! ```
//!
//! Options: `--service-ms N` (20), `--limit N` (8), `--seconds S` (4 per load),
//! `--seed N` (1), `--out DIR` (target/overload).
//!
//! It prints one row per limiter and load, writes them as CSV, and draws SVG
//! plots beside them.

mod load;
mod server;
mod stats;
mod svg;

use load::{Arrivals, Outcome, Rng, Status};
use server::{Dependency, Variant};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use svg::{Chart, Series};

struct Options {
    quick: bool,
    degrade: bool,
    arrivals: Arrivals,
    service_time: Duration,
    limit: usize,
    seconds: f64,
    seed: u64,
    out: PathBuf,
}

fn options() -> Options {
    let mut options = Options {
        quick: false,
        degrade: false,
        arrivals: Arrivals::Poisson,
        service_time: Duration::from_millis(20),
        limit: 8,
        seconds: 4.0,
        seed: 1,
        out: PathBuf::from("target/overload"),
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || {
            args.next()
                .unwrap_or_else(|| usage(&format!("{arg} needs a value")))
        };
        match arg.as_str() {
            "--quick" => options.quick = true,
            "--scenario" => match value().as_str() {
                "degrade" => options.degrade = true,
                "grid" => options.degrade = false,
                other => usage(&format!("unknown scenario {other:?}")),
            },
            "--arrivals" => match value().as_str() {
                "poisson" => options.arrivals = Arrivals::Poisson,
                "paced" => options.arrivals = Arrivals::Paced,
                other => usage(&format!("unknown arrivals {other:?}")),
            },
            "--service-ms" => options.service_time = Duration::from_millis(number(&value())),
            "--limit" => options.limit = number(&value()) as usize,
            "--seconds" => {
                options.seconds = value()
                    .parse()
                    .unwrap_or_else(|_| usage("--seconds takes a number"))
            }
            "--seed" => options.seed = number(&value()),
            "--out" => options.out = PathBuf::from(value()),
            other => usage(&format!("unknown option {other:?}")),
        }
    }
    if options.quick {
        options.seconds = options.seconds.min(1.5);
    }
    if options.limit == 0 || options.service_time.is_zero() {
        usage("--limit and --service-ms must be at least 1");
    }
    options
}

fn number(text: &str) -> u64 {
    text.parse()
        .unwrap_or_else(|_| usage(&format!("{text:?} is not a whole number")))
}

fn usage(problem: &str) -> ! {
    eprintln!("overload: {problem}\nsee the header of examples/overload/main.rs for the options");
    std::process::exit(2)
}

#[tokio::main]
async fn main() {
    let options = options();
    std::fs::create_dir_all(&options.out).expect("create the output folder");
    let measured = measure_service_time(options.service_time).await;
    let capacity = options.limit as f64 / measured.as_secs_f64();
    println!(
        "limit {}, service time {:?} (measured {:.2} ms): capacity {:.0} calls/s; {:?} arrivals, seed {}",
        options.limit,
        options.service_time,
        measured.as_secs_f64() * 1e3,
        capacity,
        options.arrivals,
        options.seed
    );
    if options.degrade {
        degrade(&options, capacity).await;
    } else {
        grid(&options, measured, capacity).await;
        per_connection_trap(&options, capacity).await;
    }
}

/// What the handler's sleep really takes: timers round up, so the true
/// capacity is a little under the nominal one.
async fn measure_service_time(nominal: Duration) -> Duration {
    let rounds = 50;
    let start = tokio::time::Instant::now();
    for _ in 0..rounds {
        tokio::time::sleep(nominal).await;
    }
    start.elapsed() / rounds
}

struct Row {
    variant: Variant,
    load: f64,
    offered: f64,
    achieved: f64,
    shed: f64,
    goodput: f64,
    p50: Duration,
    p99: Duration,
    max: Duration,
    shed_p99: Duration,
    peak_inside: usize,
    peak_memory: f64,
    erlang_b: f64,
}

async fn grid(options: &Options, measured: Duration, capacity: f64) {
    let loads: &[f64] = if options.quick {
        &[0.5, 1.0, 2.0, 4.0]
    } else {
        &[0.25, 0.5, 1.0, 2.0, 4.0]
    };
    let seconds = Duration::from_secs_f64(options.seconds);
    let client = load::client();
    let mut rows = Vec::new();
    println!(
        "\n{:<38} {:>5} {:>8} {:>8} {:>6} {:>7} {:>7} {:>8} {:>8} {:>8} {:>5} {:>6} {:>7}",
        "limiter",
        "load",
        "offered",
        "achieved",
        "shed",
        "goodput",
        "p50",
        "p99",
        "max",
        "shed p99",
        "peak",
        "MiB",
        "Erlang-B"
    );
    for variant in Variant::ALL {
        let dependency = Dependency::new(options.service_time);
        let app = variant.app(options.limit, options.service_time, dependency.clone());
        let (addr, server) = server::serve(app).await;
        for (i, &load) in loads.iter().enumerate() {
            let mut rng = Rng::new(options.seed.wrapping_add(i as u64));
            let rate = capacity * load;
            dependency.take_peak();
            stats::reset_peak_memory();
            let outcomes = load::offer(
                &client,
                addr,
                rate,
                seconds,
                options.arrivals,
                &mut rng,
                Duration::from_secs(30),
            )
            .await;
            let row = row(
                variant,
                load,
                rate,
                seconds,
                capacity,
                measured,
                options.limit,
                &outcomes,
                &dependency,
            );
            print_row(&row);
            rows.push(row);
            settle(&dependency).await;
        }
        server.abort();
    }
    write_grid(options, &rows);
}

#[allow(clippy::too_many_arguments)]
fn row(
    variant: Variant,
    load: f64,
    rate: f64,
    seconds: Duration,
    capacity: f64,
    measured: Duration,
    limit: usize,
    outcomes: &[Outcome],
    dependency: &Dependency,
) -> Row {
    let ok = stats::count(outcomes, Status::Ok);
    let shed = outcomes.len() - ok;
    let achieved = ok as f64 / seconds.as_secs_f64();
    let mut ok_latencies = stats::latencies(outcomes, Status::Ok);
    let mut shed_latencies: Vec<Duration> = outcomes
        .iter()
        .filter(|o| o.status != Status::Ok)
        .map(|o| o.latency)
        .collect();
    Row {
        variant,
        load,
        offered: outcomes.len() as f64 / seconds.as_secs_f64(),
        achieved,
        shed: 100.0 * shed as f64 / outcomes.len().max(1) as f64,
        goodput: 100.0 * achieved / capacity,
        p50: stats::quantile(&mut ok_latencies, 0.50),
        p99: stats::quantile(&mut ok_latencies, 0.99),
        max: stats::quantile(&mut ok_latencies, 1.0),
        shed_p99: stats::quantile(&mut shed_latencies, 0.99),
        peak_inside: dependency.peak_inside.load(Ordering::SeqCst),
        peak_memory: stats::peak_memory_mib().unwrap_or(f64::NAN),
        erlang_b: 100.0 * stats::erlang_b(rate * measured.as_secs_f64(), limit),
    }
}

fn print_row(row: &Row) {
    let erlang = if row.variant.is_ours() {
        format!("{:.1}%", row.erlang_b)
    } else {
        String::new()
    };
    println!(
        "{:<38} {:>4.0}% {:>7.0}/s {:>7.0}/s {:>5.1}% {:>6.1}% {:>7} {:>8} {:>8} {:>8} {:>5} {:>6.0} {:>7}",
        row.variant.label(),
        row.load * 100.0,
        row.offered,
        row.achieved,
        row.shed,
        row.goodput,
        ms(row.p50),
        ms(row.p99),
        ms(row.max),
        ms(row.shed_p99),
        row.peak_inside,
        row.peak_memory,
        erlang
    );
}

fn ms(duration: Duration) -> String {
    let ms = duration.as_secs_f64() * 1e3;
    if ms < 10.0 {
        format!("{ms:.2}ms")
    } else {
        format!("{ms:.0}ms")
    }
}

/// Waits until every request has left the server before the next load.
async fn settle(dependency: &Dependency) {
    for _ in 0..3000 {
        if dependency.in_process.load(Ordering::SeqCst) == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
}

fn write_grid(options: &Options, rows: &[Row]) {
    let mut csv = String::from("limiter,load_pct,offered_per_s,achieved_per_s,shed_pct,goodput_pct,p50_ms,p99_ms,max_ms,shed_p99_ms,peak_inside,peak_mib,erlang_b_pct\n");
    for row in rows {
        let _ = writeln!(
            csv,
            "{},{:.0},{:.1},{:.1},{:.2},{:.2},{:.3},{:.3},{:.3},{:.3},{},{:.1},{:.2}",
            row.variant.label(),
            row.load * 100.0,
            row.offered,
            row.achieved,
            row.shed,
            row.goodput,
            row.p50.as_secs_f64() * 1e3,
            row.p99.as_secs_f64() * 1e3,
            row.max.as_secs_f64() * 1e3,
            row.shed_p99.as_secs_f64() * 1e3,
            row.peak_inside,
            row.peak_memory,
            row.erlang_b
        );
    }
    let series = |value: fn(&Row) -> f64| -> Vec<Series> {
        Variant::ALL
            .iter()
            .map(|&variant| Series {
                label: variant.label().to_owned(),
                points: rows
                    .iter()
                    .filter(|r| r.variant == variant)
                    .map(|r| (r.load * 100.0, value(r)))
                    .collect(),
                dashed: false,
            })
            .collect()
    };
    let mut shed = series(|r| r.shed);
    shed.push(Series {
        label: "Erlang-B floor".to_owned(),
        points: rows
            .iter()
            .filter(|r| r.variant == Variant::Ours)
            .map(|r| (r.load * 100.0, r.erlang_b))
            .collect(),
        dashed: true,
    });
    let arrivals = format!("{:?} arrivals", options.arrivals).to_lowercase();
    let shed_chart = Chart {
        title: &format!("Shed % against offered load ({arrivals})"),
        x_label: "offered load, % of capacity",
        y_label: "shed %",
        log_y: false,
        series: shed,
    };
    let p99_chart = Chart {
        title: &format!("p99 latency of successful calls ({arrivals})"),
        x_label: "offered load, % of capacity",
        y_label: "p99 ms (log)",
        log_y: true,
        series: series(|r| r.p99.as_secs_f64() * 1e3),
    };
    let name = arrivals.replace(' ', "-");
    write(options, &format!("grid-{name}.csv"), &csv);
    write(options, &format!("shed-{name}.svg"), &shed_chart.render());
    write(options, &format!("p99-{name}.svg"), &p99_chart.render());
}

fn write(options: &Options, name: &str, contents: &str) {
    let path = options.out.join(name);
    std::fs::write(&path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    println!("wrote {}", path.display());
}

/// A limiting layer applied per connection: tower's `ConcurrencyLimitLayer`
/// builds a semaphore per `layer()` call, ours shares the layer's bulkhead.
async fn per_connection_trap(options: &Options, capacity: f64) {
    let seconds = Duration::from_secs_f64(options.seconds.min(2.0));
    let client = load::client();
    println!("\nlayer applied per connection (a hand-rolled accept loop), 400 % load:");
    for ours in [false, true] {
        let dependency = Dependency::new(options.service_time);
        let app = Variant::NoLimit.app(options.limit, options.service_time, dependency.clone());
        let (addr, server) = if ours {
            server::serve_layered_per_connection(server::ours_per_connection(options.limit).0, app)
                .await
        } else {
            server::serve_layered_per_connection(server::tower_per_connection(options.limit), app)
                .await
        };
        let mut rng = Rng::new(options.seed);
        let outcomes = load::offer(
            &client,
            addr,
            capacity * 4.0,
            seconds,
            options.arrivals,
            &mut rng,
            Duration::from_secs(30),
        )
        .await;
        let name = if ours {
            "tower-inflight HttpConcurrencyLayer"
        } else {
            "tower ConcurrencyLimitLayer"
        };
        println!(
            "  {name:<38} peak calls inside the handler: {:>4} (limit {}), shed {:.1}%",
            dependency.peak_inside.load(Ordering::SeqCst),
            options.limit,
            100.0 * (outcomes.len() - stats::count(&outcomes, Status::Ok)) as f64
                / outcomes.len().max(1) as f64
        );
        settle(&dependency).await;
        server.abort();
    }
}

/// The dependency slows from its service time to 2 s a call a third of the
/// way in; every 250 ms, print what is inside the handler and parked in the
/// process, and how the calls that finished fared.
async fn degrade(options: &Options, capacity: f64) {
    let total = if options.quick { 3.0 } else { 6.0 };
    let slow_at = total / 3.0;
    let slow = Duration::from_secs(2);
    let client = load::client();
    let variants = [
        Variant::NoLimit,
        Variant::TowerQueue,
        Variant::Ours,
        Variant::OursWait,
    ];
    let mut timelines = Vec::new();
    for variant in variants {
        let dependency = Dependency::new(options.service_time);
        let app = variant.app(options.limit, options.service_time, dependency.clone());
        let (addr, server) = server::serve(app).await;
        stats::reset_peak_memory();
        let sampler = tokio::spawn(sample(dependency.clone(), total, slow_at, slow));
        let mut rng = Rng::new(options.seed);
        // Clients give up after 5 s; what they leave behind is cut off too.
        let outcomes = load::offer(
            &client,
            addr,
            capacity,
            Duration::from_secs_f64(total),
            options.arrivals,
            &mut rng,
            Duration::from_secs(5),
        )
        .await;
        let samples = sampler.await.expect("sampler");
        println!(
            "\n{} (dependency slows to {slow:?} at t = {slow_at:.1} s; offered {capacity:.0}/s):",
            variant.label()
        );
        println!(
            "{:>6} {:>8} {:>10} {:>9} {:>10}",
            "t (s)", "inside", "in process", "p99", "goodput/s"
        );
        let mut timeline = Vec::new();
        for &(t, inside, in_process) in &samples {
            let window: Vec<&Outcome> = outcomes
                .iter()
                .filter(|o| o.finished() > t - 0.25 && o.finished() <= t)
                .collect();
            let mut ok: Vec<Duration> = window
                .iter()
                .filter(|o| o.status == Status::Ok)
                .map(|o| o.latency)
                .collect();
            let goodput = ok.len() as f64 / 0.25;
            let p99 = stats::quantile(&mut ok, 0.99);
            println!(
                "{t:>6.2} {inside:>8} {in_process:>10} {:>9} {goodput:>10.0}",
                ms(p99)
            );
            timeline.push((t, inside as f64, in_process as f64));
        }
        println!(
            "peak memory {:.0} MiB",
            stats::peak_memory_mib().unwrap_or(f64::NAN)
        );
        timelines.push((variant, timeline));
        server.abort();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let chart = Chart {
        title: "Requests in the process while the dependency slows (from t = 1/3)",
        x_label: "seconds",
        y_label: "requests in process (log)",
        log_y: true,
        series: timelines
            .iter()
            .map(|(variant, timeline)| Series {
                label: variant.label().to_owned(),
                points: timeline
                    .iter()
                    .map(|&(t, _, in_process)| (t, in_process.max(0.5)))
                    .collect(),
                dashed: false,
            })
            .collect(),
    };
    write(options, "degrade.svg", &chart.render());
}

async fn sample(
    dependency: Arc<Dependency>,
    total: f64,
    slow_at: f64,
    slow: Duration,
) -> Vec<(f64, usize, usize)> {
    let start = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let mut samples = Vec::new();
    let mut slowed = false;
    loop {
        tick.tick().await;
        let t = start.elapsed().as_secs_f64();
        if !slowed && t >= slow_at {
            dependency.set_service_time(slow);
            slowed = true;
        }
        samples.push((
            t,
            dependency.inside.load(Ordering::SeqCst),
            dependency.in_process.load(Ordering::SeqCst),
        ));
        if t >= total {
            return samples;
        }
    }
}
