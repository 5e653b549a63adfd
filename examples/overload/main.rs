//! The overload demo: one real axum server on 127.0.0.1, its handler standing
//! in for a dependency that serves `--limit` calls at once (the rest wait in
//! its line), served behind each limiter in turn and offered an open-loop
//! load from 25 % to 400 % of its capacity.
//!
//! ```text
//! cargo run --release --example overload --features axum                      # the grid, a few minutes
//! cargo run --release --example overload --features axum -- --quick           # a reduced grid, for CI
//! cargo run --release --example overload --features axum -- --arrivals paced  # evenly spaced arrivals
//! cargo run --release --example overload --features axum -- --scenario degrade
//! cargo run --release --example overload --features axum -- --help            # every option, every file
//! ```
//!
//! Options: `--service-ms N` (20), `--limit N` (8), `--deadline-ms N` (500),
//! `--seconds S` (4 per load), `--seed N` (1), `--out DIR` (target/overload).
//!
//! It prints a legend of the columns and one row per limiter and load, writes
//! the rows as CSV, draws SVG plots beside them, and lists the files written.
//! A `--quick` run writes the same names prefixed `quick-`, so that it never
//! overwrites a full run's files.

#[path = "../shared/demo.rs"]
mod demo;
mod load;
mod server;
mod stats;
mod svg;

use demo::Rng;
use load::{Arrivals, Outcome, Status};
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
    /// A call answered later than this is not goodput.
    deadline: Duration,
    seconds: f64,
    seed: u64,
    out: PathBuf,
    /// Set by the parent for a child process that runs one limiter.
    variant: Option<usize>,
    measured: Option<Duration>,
}

fn options() -> Options {
    let mut options = Options {
        quick: false,
        degrade: false,
        arrivals: Arrivals::Poisson,
        service_time: Duration::from_millis(20),
        limit: 8,
        deadline: Duration::from_millis(500),
        seconds: 4.0,
        seed: 1,
        out: PathBuf::from("target/overload"),
        variant: None,
        measured: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || {
            args.next()
                .unwrap_or_else(|| usage(&format!("{arg} needs a value")))
        };
        match arg.as_str() {
            "-h" | "--help" => {
                print!("{USAGE}");
                std::process::exit(0)
            }
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
            "--deadline-ms" => options.deadline = Duration::from_millis(number(&value())),
            "--seconds" => {
                options.seconds = value()
                    .parse()
                    .unwrap_or_else(|_| usage("--seconds takes a number"))
            }
            "--seed" => options.seed = number(&value()),
            "--out" => options.out = PathBuf::from(value()),
            "--variant" => options.variant = Some(number(&value()) as usize),
            "--measured-us" => options.measured = Some(Duration::from_micros(number(&value()))),
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

/// What `--help` prints, and what a wrong option is answered with.
const USAGE: &str = "\
usage: overload [OPTIONS]

Serves one axum handler (a stand-in dependency that serves --limit calls at once,
the rest waiting in its line) behind each limiter in turn, each in a process of
its own, and offers it an open-loop load from 25 % to 400 % of capacity.

options [default]:
  --quick                    a reduced run, for CI: loads 50 % to 400 %, at most 1.5 s
                             a load (degrade: 3 s in all instead of 6 s); its files are
                             named quick-*, so it never overwrites a full run's files
  --scenario grid|degrade    grid: every limiter at every load; degrade: at 100 % load,
                             the dependency slows to 2 s a call a third of the way in [grid]
  --arrivals poisson|paced   exponential gaps between arrivals, or even ones [poisson]
  --service-ms N             the handler's service time, in milliseconds [20]
  --limit N                  the dependency's capacity and every limiter's limit,
                             in calls in flight [8]
  --deadline-ms N            a call answered later is not goodput [500]
  --seconds S                seconds of load per row of the grid [4]
  --seed N                   the seed of the arrival schedule [1]
  --out DIR                  where the files go [target/overload]
  -h, --help                 this text
  (--variant and --measured-us are set by the demo for its child processes)

files written to DIR (ARRIVALS: poisson or paced; with --quick, each name prefixed quick-):
  grid:     grid-ARRIVALS.csv   every row of the table
            shed-ARRIVALS.svg   shed % against load, with the floors
            p99-ARRIVALS.svg    p99 latency of successful calls against load
  degrade:  degrade.csv         each limiter's timeline
            degrade.svg         requests in the process over time
  (each limiter's process writes a part-*.csv, removed once merged)
";

/// A wrong option: says what is wrong, then the usage, and exits non-zero.
fn usage(problem: &str) -> ! {
    eprint!("overload: {problem}\n\n{USAGE}");
    std::process::exit(2)
}

#[tokio::main]
async fn main() {
    let options = options();
    std::fs::create_dir_all(&options.out).expect("create the output folder");
    let measured = match options.measured {
        Some(measured) => measured,
        None => measure_service_time(options.service_time).await,
    };
    let capacity = options.limit as f64 / measured.as_secs_f64();
    if let Some(index) = options.variant {
        let variants = if options.degrade {
            &DEGRADE_VARIANTS[..]
        } else {
            &Variant::ALL[..]
        };
        let variant = *variants
            .get(index)
            .unwrap_or_else(|| usage("no such variant"));
        if options.degrade {
            degrade(&options, variant, capacity).await;
        } else {
            grid(&options, variant, measured, capacity).await;
        }
        return;
    }
    println!(
        "the dependency serves {} calls at once, the rest in line, {:?} each (measured {:.2} ms):",
        options.limit,
        options.service_time,
        measured.as_secs_f64() * 1e3,
    );
    println!(
        "capacity {:.0} calls/s; every limiter's limit {}; deadline {:?}; {} arrivals, seed {}",
        capacity,
        options.limit,
        options.deadline,
        options.arrivals.name(),
        options.seed
    );
    println!("each limiter runs in a process of its own, so that its peak memory is its own");
    let written = if options.degrade {
        print_degrade_legend();
        run_children(DEGRADE_VARIANTS.len(), measured);
        write_degrade(&options)
    } else {
        print_legend(&options);
        print_header();
        run_children(Variant::ALL.len(), measured);
        let written = write_grid(&options);
        per_connection_trap(&options, capacity).await;
        written
    };
    println!("\nfiles written:");
    for path in written {
        println!("  {}", path.display());
    }
}

/// Runs this program again for each limiter, with the same options.
fn run_children(count: usize, measured: Duration) {
    let exe = std::env::current_exe().expect("this program's path");
    for index in 0..count {
        let status = std::process::Command::new(&exe)
            .args(std::env::args().skip(1))
            .args(["--variant", &index.to_string()])
            .args(["--measured-us", &measured.as_micros().to_string()])
            .status()
            .expect("run a limiter's process");
        if !status.success() {
            eprintln!("overload: the process for limiter {index} failed: {status}");
            std::process::exit(1);
        }
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

/// The limiters the degrade scenario compares.
const DEGRADE_VARIANTS: [Variant; 4] = [
    Variant::NoLimit,
    Variant::TowerQueue,
    Variant::Ours,
    Variant::OursWait,
];

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
    /// The least any limiter of this kind can shed at this load: Erlang-B
    /// for one that never queues, an ideal FIFO queue with the same patience
    /// for one that waits.
    floor: f64,
}

const CSV_HEADER: &str = "limiter,load_pct,offered_per_s,achieved_per_s,shed_pct,goodput_pct,p50_ms,p99_ms,max_ms,shed_p99_ms,peak_inside,peak_mib,floor_pct\n";

impl Row {
    fn csv(&self) -> String {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        format!(
            "{},{:.0},{:.1},{:.1},{:.2},{:.2},{:.3},{:.3},{:.3},{:.3},{},{:.1},{:.2}\n",
            self.variant.label(),
            self.load * 100.0,
            self.offered,
            self.achieved,
            self.shed,
            self.goodput,
            ms(self.p50),
            ms(self.p99),
            ms(self.max),
            ms(self.shed_p99),
            self.peak_inside,
            self.peak_memory,
            self.floor
        )
    }
}

fn print_header() {
    println!(
        "\n{:<38} {:>5} {:>8} {:>8} {:>6} {:>7} {:>7} {:>8} {:>8} {:>8} {:>11} {:>8} {:>6}",
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
        "peak inside",
        "peak MiB",
        "floor"
    );
}

/// What each column of the grid's table means, under the table's own names.
fn print_legend(options: &Options) {
    let goodput = format!(
        "calls answered within the deadline ({} ms), in % of the capacity: their",
        options.deadline.as_millis()
    );
    let columns = [
        (
            "limiter",
            "what stands in front of the handler; every one gets the same limit (--limit)",
        ),
        (
            "load",
            "the offered load, in % of the capacity: limit / measured service time",
        ),
        (
            "offered",
            "requests sent per second (open loop: a slow server does not slow them down)",
        ),
        (
            "achieved",
            "successful calls per second, counted until the last one was served",
        ),
        (
            "shed",
            "% of requests not served: refused with 503, or failed",
        ),
        ("goodput", goodput.as_str()),
        (
            "",
            "count times the dependency's mean time a call, over limit x the time until",
        ),
        (
            "",
            "the last was served: the share of its capacity that gave timely answers",
        ),
        ("p50", "median latency of the successful calls"),
        ("p99", "p99 latency of the successful calls"),
        ("max", "slowest successful call"),
        (
            "shed p99",
            "p99 latency of the requests not served: how soon a refusal comes back",
        ),
        (
            "peak inside",
            "the most calls inside the handler (the stand-in dependency) at once,",
        ),
        ("", "served or in its line"),
        (
            "peak MiB",
            "the process's peak resident memory at that load, the load generator's included",
        ),
        (
            "floor",
            "the least any limiter of that kind can shed at that load (Erlang-B for one",
        ),
        (
            "",
            "that never waits, under Poisson arrivals; else an ideal FIFO line with the",
        ),
        ("", "same patience); shown beside tower-inflight's rows"),
    ];
    println!("\ncolumns:");
    for (name, meaning) in columns {
        println!("  {name:<11}  {meaning}");
    }
}

/// What each column of the degrade scenario's tables means.
fn print_degrade_legend() {
    let columns = [
        (
            "t (s)",
            "seconds since the load started; the dependency slows a third of the way in",
        ),
        (
            "inside",
            "calls inside the handler (the stand-in dependency, served or in its line)",
        ),
        (
            "in process",
            "requests anywhere in the server: inside, or parked in a limiter",
        ),
        (
            "p99",
            "p99 latency of the calls that succeeded in the last 250 ms",
        ),
        (
            "goodput/s",
            "successful calls per second over the last 250 ms",
        ),
    ];
    println!("\ncolumns:");
    for (name, meaning) in columns {
        println!("  {name:<10}  {meaning}");
    }
}

/// One limiter against every load, each row printed and kept as CSV.
async fn grid(options: &Options, variant: Variant, measured: Duration, capacity: f64) {
    let loads: &[f64] = if options.quick {
        &[0.5, 1.0, 2.0, 4.0]
    } else {
        &[0.25, 0.5, 1.0, 2.0, 4.0]
    };
    let seconds = Duration::from_secs_f64(options.seconds);
    let client = demo::client();
    let dependency = Dependency::new(options.service_time, options.limit);
    let app = variant.app(options.limit, options.service_time, dependency.clone());
    let (addr, _server) = server::serve(app).await;
    let mut csv = String::new();
    for (i, &load) in loads.iter().enumerate() {
        let mut rng = Rng::new(options.seed.wrapping_add(i as u64));
        let rate = capacity * load;
        dependency.take_peak();
        dependency.take_work();
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
            options,
            variant,
            load,
            seconds,
            measured,
            &outcomes,
            &dependency,
        );
        print_row(&row);
        csv.push_str(&row.csv());
        settle(&dependency).await;
    }
    write(options, &format!("part-{}.csv", variant as usize), &csv);
}

#[allow(clippy::too_many_arguments)]
fn row(
    options: &Options,
    variant: Variant,
    load: f64,
    seconds: Duration,
    measured: Duration,
    outcomes: &[Outcome],
    dependency: &Dependency,
) -> Row {
    let ok = stats::count(outcomes, Status::Ok);
    // Over the time it took to serve them: a queueing limiter is still
    // answering long after the last arrival.
    let served_in = outcomes
        .iter()
        .map(Outcome::finished)
        .fold(seconds.as_secs_f64(), f64::max);
    let achieved = ok as f64 / served_in;
    // Goodput: the calls answered in time, times what each cost the
    // dependency, over all it could give in that time. The dependency serves
    // at most `limit` calls at once, so this is at most 100 %, and it counts
    // its own mean time a call rather than the measured one (timers round).
    let (_, mean_call) = dependency.take_work();
    let in_time = outcomes
        .iter()
        .filter(|o| o.status == Status::Ok && o.latency <= options.deadline)
        .count();
    let goodput =
        100.0 * in_time as f64 * mean_call.as_secs_f64() / (options.limit as f64 * served_in);
    let mut ok_latencies = stats::latencies(outcomes, Status::Ok);
    let mut shed_latencies: Vec<Duration> = outcomes
        .iter()
        .filter(|o| o.status != Status::Ok)
        .map(|o| o.latency)
        .collect();
    let patience = if variant == Variant::OursWait {
        options.service_time
    } else {
        Duration::ZERO
    };
    // The floor at the load really offered: the generator's timer rounds it
    // a little off the nominal rate.
    let offered = outcomes.len() as f64 / seconds.as_secs_f64();
    let floor = match (options.arrivals, patience.is_zero()) {
        (Arrivals::Poisson, true) => {
            stats::erlang_b(offered * measured.as_secs_f64(), options.limit)
        }
        _ => stats::fifo_floor(
            offered,
            measured,
            options.limit,
            patience,
            options.arrivals,
            options.seed,
        ),
    };
    Row {
        variant,
        load,
        offered,
        achieved,
        shed: 100.0 * (outcomes.len() - ok) as f64 / outcomes.len().max(1) as f64,
        goodput,
        p50: stats::quantile(&mut ok_latencies, 0.50),
        p99: stats::quantile(&mut ok_latencies, 0.99),
        max: stats::quantile(&mut ok_latencies, 1.0),
        shed_p99: stats::quantile(&mut shed_latencies, 0.99),
        peak_inside: dependency.peak_inside.load(Ordering::SeqCst),
        peak_memory: stats::peak_memory_mib().unwrap_or(f64::NAN),
        floor: 100.0 * floor,
    }
}

fn print_row(row: &Row) {
    let floor = if row.variant.is_ours() {
        format!("{:.1}%", row.floor)
    } else {
        String::new()
    };
    println!(
        "{:<38} {:>4.0}% {:>7.0}/s {:>7.0}/s {:>5.1}% {:>6.1}% {:>7} {:>8} {:>8} {:>8} {:>11} {:>8.0} {:>6}",
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
        floor
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

/// Gathers the limiters' rows into one CSV and draws them; returns the
/// paths written.
fn write_grid(options: &Options) -> Vec<PathBuf> {
    let mut csv = String::from(CSV_HEADER);
    for variant in Variant::ALL {
        csv.push_str(&take(options, &format!("part-{}.csv", variant as usize)));
    }
    let rows: Vec<Vec<&str>> = csv
        .lines()
        .skip(1)
        .map(|line| line.split(',').collect())
        .collect();
    let column = |label: &str, index: usize| -> Vec<(f64, f64)> {
        rows.iter()
            .filter(|row| row[0] == label)
            .map(|row| {
                (
                    row[1].parse().unwrap_or(0.0),
                    row[index].parse().unwrap_or(0.0),
                )
            })
            .collect()
    };
    let series = |index: usize| -> Vec<Series> {
        Variant::ALL
            .iter()
            .map(|variant| Series {
                label: variant.label().to_owned(),
                points: column(variant.label(), index),
                dashed: false,
            })
            .collect()
    };
    let mut shed = series(4);
    shed.push(Series {
        label: "floor for no-wait limiters".to_owned(),
        points: column(Variant::Ours.label(), 12),
        dashed: true,
    });
    shed.push(Series {
        label: "floor for wait = 1 service".to_owned(),
        points: column(Variant::OursWait.label(), 12),
        dashed: true,
    });
    let arrivals = options.arrivals.name();
    let shed_chart = Chart {
        title: &format!("Shed % against offered load ({arrivals} arrivals)"),
        x_label: "offered load, % of capacity",
        y_label: "shed %",
        log_y: false,
        series: shed,
    };
    let p99_chart = Chart {
        title: &format!("p99 latency of successful calls ({arrivals} arrivals)"),
        x_label: "offered load, % of capacity",
        y_label: "p99 ms (log)",
        log_y: true,
        series: series(7),
    };
    vec![
        write(options, &format!("grid-{arrivals}.csv"), &csv),
        write(
            options,
            &format!("shed-{arrivals}.svg"),
            &shed_chart.render(),
        ),
        write(options, &format!("p99-{arrivals}.svg"), &p99_chart.render()),
    ]
}

/// Where the file `name` goes: in the output folder, prefixed `quick-` for a
/// quick run so that it never overwrites a full run's files.
fn path(options: &Options, name: &str) -> PathBuf {
    if options.quick {
        options.out.join(format!("quick-{name}"))
    } else {
        options.out.join(name)
    }
}

fn write(options: &Options, name: &str, contents: &str) -> PathBuf {
    let path = path(options, name);
    std::fs::write(&path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    path
}

/// Reads a limiter's part file and removes it: its rows are merged.
fn take(options: &Options, name: &str) -> String {
    let path = path(options, name);
    let contents =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let _ = std::fs::remove_file(&path);
    contents
}

/// A limiting layer applied per connection: tower's `ConcurrencyLimitLayer`
/// builds a semaphore per `layer()` call, ours shares the layer's bulkhead.
async fn per_connection_trap(options: &Options, capacity: f64) {
    let seconds = Duration::from_secs_f64(options.seconds.min(2.0));
    let client = demo::client();
    println!(
        "\nthe same layer value applied per connection (a hand-rolled accept loop), 400 % load:"
    );
    for ours in [false, true] {
        let dependency = Dependency::new(options.service_time, options.limit);
        let app = Variant::NoLimit.app(options.limit, options.service_time, dependency.clone());
        let (addr, server) = if ours {
            server::serve_layered_per_connection(server::ours_per_connection(options.limit), app)
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
/// way in; every 250 ms, print what is inside the handler and in the
/// process, and how the calls that finished fared.
async fn degrade(options: &Options, variant: Variant, capacity: f64) {
    let total = if options.quick { 3.0 } else { 6.0 };
    let slow_at = total / 3.0;
    let slow = Duration::from_secs(2);
    let client = demo::client();
    let dependency = Dependency::new(options.service_time, options.limit);
    let app = variant.app(options.limit, options.service_time, dependency.clone());
    let (addr, _server) = server::serve(app).await;
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
    let mut csv = String::new();
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
        let _ = writeln!(
            csv,
            "{},{t:.3},{inside},{in_process},{:.3},{goodput:.0}",
            variant.label(),
            p99.as_secs_f64() * 1e3
        );
    }
    println!(
        "peak memory {:.0} MiB",
        stats::peak_memory_mib().unwrap_or(f64::NAN)
    );
    let index = DEGRADE_VARIANTS
        .iter()
        .position(|&v| v == variant)
        .unwrap_or(0);
    write(options, &format!("degrade-part-{index}.csv"), &csv);
}

/// Gathers the limiters' timelines into one CSV and draws them; returns the
/// paths written.
fn write_degrade(options: &Options) -> Vec<PathBuf> {
    let mut csv = String::from("limiter,t_s,inside,in_process,p99_ms,goodput_per_s\n");
    for index in 0..DEGRADE_VARIANTS.len() {
        csv.push_str(&take(options, &format!("degrade-part-{index}.csv")));
    }
    let chart = Chart {
        title: "Requests in the process while the dependency slows (from t = 1/3)",
        x_label: "seconds",
        y_label: "requests in process (log)",
        log_y: true,
        series: DEGRADE_VARIANTS
            .iter()
            .map(|variant| Series {
                label: variant.label().to_owned(),
                points: csv
                    .lines()
                    .filter(|line| line.split(',').next() == Some(variant.label()))
                    .filter_map(|line| {
                        let fields: Vec<&str> = line.split(',').collect();
                        Some((
                            fields[1].parse().ok()?,
                            fields[3].parse::<f64>().ok()?.max(0.5),
                        ))
                    })
                    .collect(),
                dashed: false,
            })
            .collect(),
    };
    vec![
        write(options, "degrade.csv", &csv),
        write(options, "degrade.svg", &chart.render()),
    ]
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
