//! The tenants demo: per-tenant bulkheads on one real axum server.
//!
//! One handler on 127.0.0.1 stands in for a dependency that serves C = 96
//! calls at once in 100 ms ± 30 % each: 960 calls/s. Six tenants share it,
//! picked by an `x-tenant` header; a fair share is C / 6 = 16 calls at once,
//! 160 calls/s. One noisy tenant offers ten times its share (1,600/s), five
//! quiet tenants half of theirs (80/s each), all with Poisson arrivals from
//! an open-loop generator. (`--capacity`, `--service-ms` and `--jitter`
//! change the dependency, and every rate with it.) The same load meets each
//! layer in turn:
//!
//! - `keyed`: a `KeyedHttpConcurrencyLayer`, each tenant limited to C (it may
//!   borrow all idle capacity), a ceiling of C for all, C / 6 slots of it
//!   guaranteed to each tenant;
//! - `shared`: one `HttpConcurrencyLayer` of C for everyone;
//! - `per_tenant_no_ceiling`: C per tenant and no ceiling;
//! - `quiet_alone`: `keyed` with the quiet tenants' load only, their baseline.
//!
//! ```text
//! cargo run --release --example tenants --features axum             # 5 s a variant, ~30 s
//! cargo run --release --example tenants --features axum -- --quick  # 2 s a variant
//! cargo run --release --example tenants --features axum -- --help   # every option, every file
//! ```
//!
//! It prints a row per variant and class of tenants, checks the targets
//! against the `keyed` rows, prints a `RESULT` line per variant for scripts
//! (`tests/tenants_demo.rs` reads them), and writes a CSV and an SVG plot.

#[path = "../shared/demo.rs"]
mod demo;
mod load;
mod server;
mod stats;
mod svg;

use load::{Outcome, Tenant};
use server::{Dependency, Setup, Variant, NOISY_TENANT};
use stats::Class;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use svg::{Figure, Panel};
use tower_inflight::keyed::KeyedBulkhead;

/// C, the dependency's calls at once, unless `--capacity` says otherwise.
const CAPACITY: usize = 96;
/// The dependency's mean time a call, at or under C calls inside, unless
/// `--service-ms` says otherwise.
const SERVICE: Duration = Duration::from_millis(100);
/// How far each call's time strays from the mean, unless `--jitter` says
/// otherwise: drawn evenly from `SERVICE × (1 ± JITTER)`.
const JITTER: f64 = 0.3;
/// The most calls a second the dependency may serve (C over its mean time a
/// call): past it, one machine's HTTP client and server, sending nearly
/// twice that, would be measured more than the layers.
const MAX_RATE: f64 = 2_000.0;
const QUIET_TENANTS: usize = 5;
const TENANTS: usize = QUIET_TENANTS + 1;
/// The noisy tenant's offered load, in fair shares.
const NOISY_LOAD: f64 = 10.0;
/// Each quiet tenant's offered load, in fair shares.
const QUIET_LOAD: f64 = 0.5;
/// The client gives up on a request after this long: a response later than
/// that is no use to anyone, so it counts as failed, not as goodput.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(1);
/// Goodput is counted among the requests sent from this long after the
/// load starts (the dependency fills in one service time) to this long
/// before it ends (the last requests meet a line that no longer grows).
const WARM_UP: f64 = 0.25;

/// The issue's targets, checked against the `keyed` rows.
const TARGET_QUIET_SUCCESS: f64 = 99.0;
const TARGET_QUIET_P99_OVER_ALONE: f64 = 0.10;
const TARGET_GOODPUT: f64 = 98.0;

struct Options {
    quick: bool,
    /// C: the dependency's calls at once.
    capacity: usize,
    /// The dependency's mean time a call, at or under C calls inside.
    service: Duration,
    seconds: f64,
    wait: Duration,
    jitter: f64,
    noisy_limit: usize,
    seed: u64,
    out: PathBuf,
}

fn options() -> Options {
    let mut options = Options {
        quick: false,
        capacity: CAPACITY,
        service: SERVICE,
        seconds: 5.0,
        wait: Duration::from_millis(100),
        jitter: JITTER,
        noisy_limit: 0,
        seed: 1,
        out: PathBuf::from("target/tenants"),
    };
    let mut seconds = None;
    let mut noisy_limit = None;
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
            "--seconds" => seconds = Some(fraction(&value(), "--seconds")),
            "--wait-ms" => options.wait = Duration::from_millis(number(&value())),
            "--jitter" => options.jitter = fraction(&value(), "--jitter"),
            "--capacity" => options.capacity = count(&value()),
            "--service-ms" => options.service = Duration::from_millis(number(&value())),
            "--noisy-limit" => noisy_limit = Some(count(&value())),
            "--seed" => options.seed = number(&value()),
            "--out" => options.out = PathBuf::from(value()),
            other => usage(&format!("unknown option {other:?}")),
        }
    }
    options.seconds = seconds.unwrap_or(if options.quick { 2.0 } else { 5.0 });
    if !(2.0 * WARM_UP < options.seconds && options.seconds <= 600.0) {
        usage("--seconds must be more than 0.5 and at most 600");
    }
    if options.capacity < TENANTS {
        usage(&format!(
            "--capacity must be at least {TENANTS}: a share is C / {TENANTS}"
        ));
    }
    // Goodput is counted from `WARM_UP` on, when the dependency is full.
    if !(1..=250).contains(&options.service.as_millis()) {
        usage("--service-ms must be 1 ..= 250");
    }
    if options.capacity as f64 / options.service.as_secs_f64() > MAX_RATE {
        usage(&format!(
            "--capacity over --service-ms (in seconds) must be at most {MAX_RATE} calls/s"
        ));
    }
    options.noisy_limit = noisy_limit.unwrap_or(options.capacity);
    if !(1..=options.capacity).contains(&options.noisy_limit) {
        usage("--noisy-limit must be 1 ..= the capacity");
    }
    // Past 0.9, a call's time may round to nothing.
    if !(0.0..=0.9).contains(&options.jitter) {
        usage("--jitter must be from 0 to 0.9");
    }
    // A request may wait its budget twice (its tenant's slot, then the
    // ceiling's) before its call: all of it must fit in the client's
    // timeout, or the layers would be judged by the client.
    let longest =
        options.wait.as_secs_f64() * 2.0 + options.service.as_secs_f64() * (1.0 + options.jitter);
    if longest >= CLIENT_TIMEOUT.as_secs_f64() {
        usage(&format!(
            "twice --wait-ms plus the longest call must be under the client's timeout of {CLIENT_TIMEOUT:?}"
        ));
    }
    options
}

fn count(text: &str) -> usize {
    text.parse()
        .unwrap_or_else(|_| usage(&format!("{text:?} is not a whole number")))
}

fn number(text: &str) -> u64 {
    text.parse()
        .unwrap_or_else(|_| usage(&format!("{text:?} is not a whole number")))
}

fn fraction(text: &str, option: &str) -> f64 {
    text.parse::<f64>()
        .ok()
        .filter(|value| value.is_finite())
        .unwrap_or_else(|| usage(&format!("{option} takes a number, not {text:?}")))
}

/// What `--help` prints, and what a wrong option is answered with.
const USAGE: &str = "\
usage: tenants [OPTIONS]

Serves one axum handler (a stand-in dependency: C calls at once, each taking a time
drawn around a mean) to six tenants, one noisy (10x its fair share of C / 6) and five
quiet (half of theirs), behind each layer in turn: keyed (per tenant, with a ceiling
and guaranteed shares), shared (one bulkhead), per_tenant_no_ceiling, and keyed with
the quiet tenants alone.

options [default]:
  --quick          a shorter run, for CI: 2 s a variant; its files are named quick-*,
                   so it never overwrites a full run's files
  --seconds S      seconds of load per variant [5, or 2 with --quick]
  --capacity N     C, the dependency's calls at once, at least 6 [96]
  --service-ms N   the dependency's mean time a call, 1 ..= 250 [100];
                   C / its time must be at most 2000 calls/s
  --wait-ms N      every wait budget (a tenant's, the ceiling's, the shared bulkhead's) [100]
                   twice it, plus the longest call, must be under the client's 1 s
  --jitter F       each call's time drawn evenly from the mean x (1 +- F), F <= 0.9 [0.3]
  --noisy-limit N  the noisy tenant's own limit under keyed, 1 ..= C [C]
  --seed N         the seed of the arrival schedule [1]
  --out DIR        where the files go [target/tenants]
  -h, --help       this text

files written to DIR (with --quick, each name prefixed quick-):
  tenants.csv      a row per variant and class of tenants
  tenants.svg      success %, p99 and goodput per variant and class
";

/// A wrong option: says what is wrong, then the usage, and exits non-zero.
fn usage(problem: &str) -> ! {
    eprint!("tenants: {problem}\n\n{USAGE}");
    std::process::exit(2)
}

/// How one variant fared.
struct Report {
    variant: Variant,
    /// C, the dependency's calls at once.
    c: usize,
    quiet: Class,
    /// All zero when the noisy tenant sent nothing.
    noisy: Class,
    /// What the dependency could serve in this run, calls/s: C over the
    /// mean time a call really took (its timer rounds up).
    capacity: f64,
    /// Both classes' goodput, in % of `capacity`.
    goodput: f64,
    peak_inside: usize,
    /// The mean of the run's snapshots, every 50 ms.
    mean_inside: f64,
    /// How long the quiet tenants' calls waited in the layer, server side:
    /// from the outermost middleware to the handler.
    quiet_wait_p50: Duration,
    quiet_wait_p99: Duration,
    keyed: Option<KeyedMeans>,
}

#[tokio::main]
async fn main() {
    let options = options();
    std::fs::create_dir_all(&options.out).expect("create the output folder");
    let (c, service) = (options.capacity, options.service);
    let nominal = c as f64 / service.as_secs_f64();
    let share = nominal / TENANTS as f64;
    let setup = Setup {
        capacity: c,
        guarantee: c / TENANTS,
        noisy_limit: options.noisy_limit,
        wait: options.wait,
    };
    let mut tenants = vec![Tenant {
        name: NOISY_TENANT.to_owned(),
        rate: share * NOISY_LOAD,
        noisy: true,
    }];
    tenants.extend((1..=QUIET_TENANTS).map(|i| Tenant {
        name: format!("quiet-{i}"),
        rate: share * QUIET_LOAD,
        noisy: false,
    }));
    println!(
        "dependency: {c} calls at once, {service:?} a call{}: {nominal:.0} calls/s nominal",
        if options.jitter > 0.0 {
            format!(" (each drawn from +-{:.0}%)", options.jitter * 100.0)
        } else {
            String::new()
        }
    );
    println!(
        "tenants: 1 noisy at {:.0}/s ({NOISY_LOAD}x its fair share of {share:.0}/s), {QUIET_TENANTS} quiet at {:.0}/s each; Poisson arrivals, seed {}, {} s a variant",
        share * NOISY_LOAD,
        share * QUIET_LOAD,
        options.seed,
        options.seconds
    );
    let noisy_limit = if options.noisy_limit < c {
        format!(" (the noisy one {} under keyed)", options.noisy_limit)
    } else {
        String::new()
    };
    println!(
        "layers: limit {c} per tenant{noisy_limit} and for the ceiling or the shared bulkhead, {} guaranteed per tenant, every wait budget {:?}; client timeout {CLIENT_TIMEOUT:?}",
        setup.guarantee, options.wait
    );
    print_header();
    let client = demo::client();
    let mut reports = Vec::new();
    for variant in Variant::ALL {
        let report = run(&options, &setup, &tenants, &client, variant).await;
        print_report(&report);
        reports.push(report);
    }
    print_legend();
    print_targets(&reports, nominal);
    println!();
    for report in &reports {
        println!("{}", result_line(report));
    }
    let written = [
        write(&options, "tenants.csv", &csv(&reports)),
        write(
            &options,
            "tenants.svg",
            &figure(&options, &reports, &tenants).render(),
        ),
    ];
    println!("\nfiles written:");
    for path in written {
        println!("  {}", path.display());
    }
}

/// One variant: a server of its own, the load, the figures.
async fn run(
    options: &Options,
    setup: &Setup,
    tenants: &[Tenant],
    client: &demo::HttpClient,
    variant: Variant,
) -> Report {
    let seconds = Duration::from_secs_f64(options.seconds);
    let dependency = Dependency::new(options.capacity, options.service, options.jitter);
    let (app, keyed) = variant.app(setup, dependency.clone());
    let (addr, server) = server::serve(app).await;
    let offered: Vec<Tenant> = tenants
        .iter()
        .map(|tenant| Tenant {
            rate: if tenant.noisy && !variant.with_noisy() {
                0.0
            } else {
                tenant.rate
            },
            ..tenant.clone()
        })
        .collect();
    let arrivals = load::schedule(&offered, seconds, options.seed);
    let sampler = tokio::spawn(sample(dependency.clone(), keyed, seconds));
    let outcomes = load::offer(client, addr, &offered, &arrivals, CLIENT_TIMEOUT).await;
    let (mean_inside, keyed) = sampler.await.expect("the sampler");
    settle(&dependency).await;
    server.abort();
    let class = |noisy: bool| {
        Class::new(
            outcomes
                .iter()
                .filter(|o: &&Outcome| offered[o.tenant].noisy == noisy),
            options.seconds,
            WARM_UP,
        )
    };
    let (quiet, noisy) = (class(false), class(true));
    let record = dependency.take_record();
    let real_service = record
        .real_service(options.service)
        .unwrap_or(options.service);
    let capacity = options.capacity as f64 / real_service.as_secs_f64();
    let mut quiet_waits: Vec<Duration> = record
        .waits
        .iter()
        .filter(|(tenant, _)| tenants.iter().any(|t| !t.noisy && t.name == *tenant))
        .map(|&(_, waited)| waited)
        .collect();
    Report {
        variant,
        c: options.capacity,
        quiet,
        noisy,
        capacity,
        goodput: 100.0 * (quiet.goodput + noisy.goodput) / capacity,
        peak_inside: dependency.peak_inside(),
        mean_inside,
        quiet_wait_p50: stats::quantile(&mut quiet_waits, 0.50),
        quiet_wait_p99: stats::quantile(&mut quiet_waits, 0.99),
        keyed,
    }
}

/// Means of what a keyed bulkhead holds, over the run's snapshots.
#[derive(Clone, Copy, Debug, Default)]
struct KeyedMeans {
    ceiling_held: f64,
    ceiling_waiting: f64,
    /// Of the ceiling's waiting callers, those of tenants below their share.
    below_share_waiting: f64,
    /// The noisy tenant's own slots held (inside, or waiting for the
    /// ceiling), and its callers waiting for one.
    noisy_held: f64,
    noisy_waiting: f64,
    /// The quiet tenants' own slots held, all together.
    quiet_held: f64,
}

/// Every 50 ms while the load runs: how many calls are inside the
/// dependency, and what the keyed bulkhead (if any) holds, from its
/// `status`. Returns the means.
async fn sample(
    dependency: Arc<Dependency>,
    keyed: Option<KeyedBulkhead<String>>,
    seconds: Duration,
) -> (f64, Option<KeyedMeans>) {
    let start = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    let (mut count, mut inside, mut sum) = (0.0, 0.0, KeyedMeans::default());
    loop {
        tick.tick().await;
        let t = start.elapsed();
        if t >= seconds {
            break;
        }
        if t.as_secs_f64() < WARM_UP {
            continue;
        }
        count += 1.0;
        inside += dependency.inside() as f64;
        let Some(keyed) = &keyed else {
            continue;
        };
        let status = keyed.status(TENANTS);
        if let Some(ceiling) = &status.ceiling {
            sum.ceiling_held += ceiling.in_flight as f64;
            sum.ceiling_waiting += ceiling.waiting as f64;
            // A caller below its share waits at (or just above) the lowest
            // priority there is; the others at their turn, from 0 up.
            sum.below_share_waiting += ceiling
                .waiting_by_priority
                .range(..i32::MIN / 2)
                .map(|(_, &n)| n as f64)
                .sum::<f64>();
        }
        for key in &status.busiest {
            if key.key == NOISY_TENANT {
                sum.noisy_held += key.in_flight as f64;
                sum.noisy_waiting += key.waiting as f64;
            } else {
                sum.quiet_held += key.in_flight as f64;
            }
        }
    }
    let count = f64::max(count, 1.0);
    let means = keyed.map(|_| KeyedMeans {
        ceiling_held: sum.ceiling_held / count,
        ceiling_waiting: sum.ceiling_waiting / count,
        below_share_waiting: sum.below_share_waiting / count,
        noisy_held: sum.noisy_held / count,
        noisy_waiting: sum.noisy_waiting / count,
        quiet_held: sum.quiet_held / count,
    });
    (inside / count, means)
}

/// Waits until every request has left the server before the next variant.
async fn settle(dependency: &Dependency) {
    for _ in 0..3000 {
        if dependency.in_process() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
}

fn print_header() {
    println!(
        "\n{:<22} {:<6} {:>8} {:>8} {:>6} {:>6} {:>8} {:>8} {:>9}",
        "variant", "class", "offered", "success", "503", "failed", "p50", "p99", "goodput"
    );
}

fn print_report(report: &Report) {
    let mut classes = vec![("quiet", &report.quiet)];
    if report.variant.with_noisy() {
        classes.push(("noisy", &report.noisy));
    }
    for (i, (name, class)) in classes.into_iter().enumerate() {
        let variant = if i == 0 { report.variant.label() } else { "" };
        println!(
            "{variant:<22} {name:<6} {:>6.0}/s {:>7.1}% {:>5.1}% {:>5.1}% {:>8} {:>8} {:>7.0}/s",
            class.offered,
            class.success,
            class.shed,
            class.failed,
            ms(class.p50),
            ms(class.p99),
            class.goodput
        );
    }
    let indent = "";
    println!(
        "{indent:<22} total goodput {:.1}% of capacity ({:.0}/s); inside the dependency: peak {} (C = {}), mean {:.1}",
        report.goodput, report.capacity, report.peak_inside, report.c, report.mean_inside
    );
    println!(
        "{indent:<22} quiet tenants' wait in the layer (server side): p50 {}, p99 {}",
        ms(report.quiet_wait_p50),
        ms(report.quiet_wait_p99)
    );
    if let Some(keyed) = report.keyed {
        let ceiling = if report.variant == Variant::PerTenantNoCeiling {
            String::new()
        } else {
            format!(
                "ceiling {:.1} held, {:.1} waiting ({:.1} below their share); ",
                keyed.ceiling_held, keyed.ceiling_waiting, keyed.below_share_waiting
            )
        };
        let noisy = if report.variant.with_noisy() {
            format!(
                "noisy {:.1} held, {:.1} waiting for its own; ",
                keyed.noisy_held, keyed.noisy_waiting
            )
        } else {
            String::new()
        };
        println!(
            "{indent:<22} mean slots: {ceiling}{noisy}quiet {:.1} held",
            keyed.quiet_held
        );
    }
}

fn ms(duration: Duration) -> String {
    format!("{:.1}ms", duration.as_secs_f64() * 1e3)
}

/// What each column means, under the table's own names.
fn print_legend() {
    let columns = [
        (
            "class",
            "quiet: the five quiet tenants together; noisy: the noisy one",
        ),
        (
            "offered",
            "requests sent per second (open loop: a slow server does not slow them down)",
        ),
        (
            "success",
            "% of requests answered 200 within the client's timeout (1 s)",
        ),
        ("503", "% of requests shed by the layer"),
        (
            "failed",
            "% of requests the client gave up on at 1 s, or that failed otherwise",
        ),
        (
            "p50, p99",
            "latency of the successful requests, from when each was due",
        ),
        (
            "goodput",
            "successful requests per second, of those sent from 0.25 s into the load to",
        ),
        ("", "0.25 s before its end"),
        (
            "capacity",
            "C / the mean time a call took inside the dependency (a sleep rounds up to",
        ),
        (
            "",
            "the timer's next millisecond: a little under the nominal rate)",
        ),
        (
            "wait",
            "from the server's outermost middleware to the handler: time spent in the layer",
        ),
        (
            "mean slots",
            "the keyed bulkhead's status every 50 ms: slots held (a tenant's include its",
        ),
        ("", "callers waiting for the ceiling's) and callers waiting"),
    ];
    println!("\ncolumns:");
    for (name, meaning) in columns {
        println!("  {name:<10}  {meaning}");
    }
}

fn find(reports: &[Report], variant: Variant) -> Option<&Report> {
    reports.iter().find(|report| report.variant == variant)
}

/// The issue's targets, against the `keyed` rows, with the numbers.
fn print_targets(reports: &[Report], nominal: f64) {
    let (Some(keyed), Some(alone)) = (
        find(reports, Variant::Keyed),
        find(reports, Variant::QuietAlone),
    ) else {
        return;
    };
    let verdict = |met: bool| if met { "met" } else { "NOT MET" };
    println!("\ntargets, checked against keyed:");
    println!(
        "  quiet tenants' success >= {TARGET_QUIET_SUCCESS}%: {} ({:.2}%)",
        verdict(keyed.quiet.success >= TARGET_QUIET_SUCCESS),
        keyed.quiet.success
    );
    let over = p99_over_alone(keyed, alone);
    println!(
        "  quiet tenants' p99 within {:.0}% of quiet_alone's: {} ({} against {} alone: {:+.1}%)",
        TARGET_QUIET_P99_OVER_ALONE * 100.0,
        verdict(over <= TARGET_QUIET_P99_OVER_ALONE),
        ms(keyed.quiet.p99),
        ms(alone.quiet.p99),
        over * 100.0
    );
    let goodput = keyed.goodput * keyed.capacity / 100.0;
    println!(
        "  total goodput >= {TARGET_GOODPUT}% of capacity: {} ({:.1}%: {goodput:.0}/s of {:.0}/s; {:.1}% of the nominal {nominal:.0}/s)",
        verdict(keyed.goodput >= TARGET_GOODPUT),
        keyed.goodput,
        keyed.capacity,
        100.0 * goodput / nominal
    );
}

/// How much longer `report`'s quiet p99 is than `alone`'s, as a fraction.
fn p99_over_alone(report: &Report, alone: &Report) -> f64 {
    let alone = alone.quiet.p99.as_secs_f64();
    if alone > 0.0 {
        report.quiet.p99.as_secs_f64() / alone - 1.0
    } else {
        f64::INFINITY
    }
}

/// One line per variant for scripts: `RESULT variant=... key=value ...`.
fn result_line(report: &Report) -> String {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    format!(
        "RESULT variant={} c={} quiet_success={:.2} quiet_p50_ms={:.2} quiet_p99_ms={:.2} quiet_wait_p99_ms={:.2} noisy_success={:.2} noisy_p99_ms={:.2} goodput_pct={:.2} capacity_per_s={:.1} peak_inside={}",
        report.variant.label(),
        report.c,
        report.quiet.success,
        ms(report.quiet.p50),
        ms(report.quiet.p99),
        ms(report.quiet_wait_p99),
        report.noisy.success,
        ms(report.noisy.p99),
        report.goodput,
        report.capacity,
        report.peak_inside
    )
}

fn csv(reports: &[Report]) -> String {
    let mut csv = String::from(
        "variant,class,offered_per_s,requests,success_pct,shed_pct,failed_pct,p50_ms,p99_ms,goodput_per_s,capacity_per_s,total_goodput_pct,peak_inside,mean_inside\n",
    );
    for report in reports {
        for (name, class) in [("quiet", &report.quiet), ("noisy", &report.noisy)] {
            if name == "noisy" && !report.variant.with_noisy() {
                continue;
            }
            let _ = writeln!(
                csv,
                "{},{name},{:.1},{},{:.3},{:.3},{:.3},{:.3},{:.3},{:.1},{:.1},{:.2},{},{:.2}",
                report.variant.label(),
                class.offered,
                class.requests,
                class.success,
                class.shed,
                class.failed,
                class.p50.as_secs_f64() * 1e3,
                class.p99.as_secs_f64() * 1e3,
                class.goodput,
                report.capacity,
                report.goodput,
                report.peak_inside,
                report.mean_inside
            );
        }
    }
    csv
}

/// Three panels, a group of bars per variant: success %, p99, goodput.
fn figure(options: &Options, reports: &[Report], tenants: &[Tenant]) -> Figure {
    let values = |get: &dyn Fn(&Class) -> f64| -> Vec<Vec<f64>> {
        reports
            .iter()
            .map(|report| {
                let noisy = if report.variant.with_noisy() {
                    get(&report.noisy)
                } else {
                    f64::NAN
                };
                vec![get(&report.quiet), noisy]
            })
            .collect()
    };
    let alone_p99 = find(reports, Variant::QuietAlone).map(|alone| alone.quiet.p99);
    let capacity = find(reports, Variant::Keyed).map_or(0.0, |keyed| keyed.capacity);
    let peaks: Vec<String> = reports
        .iter()
        .map(|report| format!("{} {}", report.variant.label(), report.peak_inside))
        .collect();
    let jitter = if options.jitter > 0.0 {
        format!(" (+-{:.0}%)", options.jitter * 100.0)
    } else {
        String::new()
    };
    Figure {
        title: format!(
            "1 noisy tenant at {:.0}/s, {QUIET_TENANTS} quiet at {:.0}/s each, on a dependency of {} calls at once, {:?} each{jitter}",
            tenants[0].rate, tenants[1].rate, options.capacity, options.service
        ),
        groups: reports
            .iter()
            .map(|report| report.variant.label().to_owned())
            .collect(),
        series: vec!["quiet tenants".to_owned(), "noisy tenant".to_owned()],
        panels: vec![
            Panel {
                title: "Requests served".to_owned(),
                y_label: "success %".to_owned(),
                stacked: false,
                values: values(&|class| class.success),
                y_max: Some(110.0),
                reference: Some((
                    TARGET_QUIET_SUCCESS,
                    format!("target for the quiet: {TARGET_QUIET_SUCCESS}%"),
                )),
                decimals: 1,
            },
            Panel {
                title: "p99 latency of successes".to_owned(),
                y_label: "ms".to_owned(),
                stacked: false,
                values: values(&|class| class.p99.as_secs_f64() * 1e3),
                y_max: None,
                reference: alone_p99.map(|p99| {
                    (
                        p99.as_secs_f64() * 1e3 * (1.0 + TARGET_QUIET_P99_OVER_ALONE),
                        "quiet_alone's quiet p99 + 10%".to_owned(),
                    )
                }),
                decimals: 0,
            },
            Panel {
                title: "Goodput (stacked)".to_owned(),
                y_label: "successful requests / s".to_owned(),
                stacked: true,
                values: values(&|class| class.goodput),
                y_max: None,
                reference: Some((capacity, format!("capacity {capacity:.0}/s"))),
                decimals: 0,
            },
        ],
        note: format!(
            "peak calls inside the dependency (C = {}): {}; {} s a variant, seed {}, every wait budget {:?}",
            options.capacity,
            peaks.join(", "),
            options.seconds,
            options.seed,
            options.wait
        ),
    }
}

/// Where the file `name` goes: in the output folder, prefixed `quick-` for a
/// quick run so that it never overwrites a full run's files.
fn write(options: &Options, name: &str, contents: &str) -> PathBuf {
    let path = if options.quick {
        options.out.join(format!("quick-{name}"))
    } else {
        options.out.join(name)
    };
    std::fs::write(&path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    path
}
