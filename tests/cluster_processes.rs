//! The cluster ceiling across real processes: replicas of
//! `examples/cluster.rs`, a real HTTP dependency and a real `redis-server`
//! (see `support/redis_server.rs`). By hand:
//!
//! ```text
//! apt-get install redis-server
//! cargo test --features redis --examples --test cluster_processes
//! ```
//!
//! The fair shares' tests run the example's `--replicas-start-late` run and
//! print its table (`--nocapture`): each replica's share of the calls
//! served, from a second after the last replica started, and its lowest and
//! highest share over any 2 s within, over its fair share (1.00: fair).
//! `TOWER_INFLIGHT_CLUSTER_EXAMPLE` names another build of the example to
//! run (one from before fair shares fails them: measured, a replica started
//! late got none, and four started together split the calls 0, 0, 0.14 and
//! 0.86). The runs take turns: on two cores, four replicas of one run beside
//! four of another would measure the machine.
//!
//! The same replicas run on the other deployments, started by the tests
//! (see `support/redis_topology.rs`): a three-primary Redis Cluster whose
//! ceiling's slot moves mid-run, and a primary behind Sentinel, killed
//! mid-run. Without `redis-server` or `redis-cli` on `PATH` those say they
//! are skipped (and fail with `TOWER_INFLIGHT_REQUIRE_REDIS` set).

mod support;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use support::redis_server::RedisServer;
use support::redis_topology::{Node, RedisCluster, RedisSentinel, PRIMARY_NAME};
use tower_inflight::redis::ClusterCeiling;
use tower_inflight::{Bulkhead, Config, ShedReason};

/// The example's binary, built beside this test by `cargo test`.
fn example() -> PathBuf {
    if let Some(path) = std::env::var_os("TOWER_INFLIGHT_CLUSTER_EXAMPLE") {
        return path.into();
    }
    let mut path = std::env::current_exe().unwrap();
    path.pop(); // deps/
    path.pop();
    path.push("examples");
    path.push(format!("cluster{}", std::env::consts::EXE_SUFFIX));
    assert!(
        path.exists(),
        "{} is missing: `cargo test --features redis` builds it (or `cargo build --features redis --example cluster`)",
        path.display()
    );
    path
}

/// One run of replicas at a time.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static RUNS: Mutex<()> = Mutex::new(());
    RUNS.lock().unwrap_or_else(PoisonError::into_inner)
}

fn field(json: &str, name: &str) -> f64 {
    let at = json
        .find(&format!("\"{name}\":"))
        .unwrap_or_else(|| panic!("no {name} in {json}"));
    let rest = &json[at + name.len() + 3..];
    let end = rest.find([',', '}']).unwrap();
    rest[..end].parse().unwrap()
}

fn list(json: &str, name: &str) -> Vec<f64> {
    let at = json
        .find(&format!("\"{name}\":["))
        .unwrap_or_else(|| panic!("no {name} in {json}"));
    let rest = &json[at + name.len() + 4..];
    rest[..rest.find(']').unwrap()]
        .split(',')
        .map(|value| value.parse().unwrap())
        .collect()
}

#[test]
fn four_replicas_never_exceed_the_ceiling_and_keep_it_busy() {
    let _turn = one_at_a_time();
    let server = RedisServer::start();
    let output = Command::new(example())
        .args(["--redis", &server.url(), "--seconds", "3", "--json"])
        // Kept busy, a coarse check (the example fails under it): a debug
        // build serves less than the demo's 95 %, down to 58 % measured
        // while other builds loaded both cores (every lease's round trip
        // waits for a core, with fair shares or without), so the bound is
        // half the ceiling's capacity: a ceiling left idle by a lost
        // hand-off serves less. Leases are counted exactly in
        // `tests/cluster.rs`; goodput is the demo's to measure.
        .args(["--min-goodput", "0.5"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let summary = stdout.lines().last().unwrap_or_default();
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    println!("{stdout}");
    within_the_ceiling(summary, &stdout);
    assert_eq!(field(summary, "errors"), 0.0, "{stdout}");
}

/// Inside the route, across the replica processes: never more calls on a
/// lease than the ceiling, though their local limits add up to more; more
/// calls in all only with calls admitted without a lease inside, Redis
/// away (`FailOpen`, the documented exception: docs/cluster.md).
fn within_the_ceiling(summary: &str, stdout: &str) {
    let (ceiling, peak) = (field(summary, "ceiling"), field(summary, "peak"));
    // A build of the example from before it counted them apart (see
    // `TOWER_INFLIGHT_CLUSTER_EXAMPLE`): every call as if on a lease.
    let counted_apart = summary.contains("\"peak_leased\":");
    let (peak_leased, without_lease) = match counted_apart {
        true => (
            field(summary, "peak_leased"),
            field(summary, "without_lease"),
        ),
        false => (peak, 0.0),
    };
    assert!(
        peak_leased <= ceiling,
        "more calls on a lease than the ceiling: {stdout}"
    );
    assert!(
        peak <= ceiling || without_lease > 0.0,
        "more calls than the ceiling, none of them without a lease: {stdout}"
    );
}

#[tokio::test]
// The turn is held for the whole test, on its own thread: nothing else in
// its runtime takes it.
#[allow(clippy::await_holding_lock)]
async fn a_killed_replica_s_slots_come_back_after_its_lease_not_before() {
    let _turn = one_at_a_time();
    let server = RedisServer::start();
    let lease = Duration::from_millis(1_500);
    let started = Instant::now();
    let mut replica = Command::new(example())
        .args(["--hold", "3", "--ceiling", "3", "--name", "killed"])
        .args([
            "--redis",
            &server.url(),
            "--lease-ms",
            &lease.as_millis().to_string(),
            // A round trip slower than the default 100 ms on a loaded
            // machine would admit a call without a lease (`FailOpen`).
            "--timeout-ms",
            "1000",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(replica.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "held 3");
    replica.kill().unwrap(); // SIGKILL: no release, no goodbye
    replica.wait().unwrap();

    let bulkhead = Bulkhead::new(
        Config::new(3, Duration::from_secs(30)).cluster_ceiling(
            ClusterCeiling::new(server.client(), "killed", 3)
                .lease(lease)
                .timeout(Duration::from_secs(1)),
        ),
    );
    // The three leases were taken one after another: each comes back at
    // its own deadline.
    let mut admitted = Vec::new();
    while admitted.len() < 3 {
        match bulkhead.acquire().await {
            Ok(permit) => {
                // The leases were taken after `started`: none ran out before.
                assert!(
                    started.elapsed() >= lease,
                    "back after {:?}",
                    started.elapsed()
                );
                admitted.push(permit);
            }
            Err(shed) => assert_eq!(shed.reason(), ShedReason::ClusterLimit),
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "never came back"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(bulkhead.status().cluster.unwrap().leases_reclaimed, 3);
    drop(admitted);
}

/// The last line of a shares run (its table printed), which must have
/// kept the ceiling (see [`within_the_ceiling`]) and failed no call.
fn shares_summary(child: Child) -> String {
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    println!("{stdout}");
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let summary = stdout.lines().last().unwrap_or_default().to_owned();
    within_the_ceiling(&summary, &stdout);
    assert_eq!(field(&summary, "errors"), 0.0, "{stdout}");
    summary
}

/// A shares run against `server` with `args`. Its replicas give Redis 1 s
/// a request unless `args` says otherwise: a debug build on a loaded
/// machine can take longer than the default 100 ms, and a replica that
/// times out admits without leases for its backoff (`FailOpen`), which is
/// not what the shares measure (see
/// `a_frozen_redis_over_admits_only_calls_without_a_lease`).
fn spawn_shares(server: &RedisServer, args: &[&str]) -> Child {
    spawn_shares_on(&["--redis".into(), server.url()], args)
}

/// A shares run whose replicas find their ceiling through `deployment`
/// (`--redis URL`, `--redis-cluster URL,...`, `--sentinels URL,...`), as
/// [`spawn_shares`] runs them.
fn spawn_shares_on(deployment: &[String], args: &[&str]) -> Child {
    let timeout = match args.contains(&"--timeout-ms") {
        true => None,
        false => Some(["--timeout-ms", "1000"]),
    };
    Command::new(example())
        .args(["--replicas-start-late", "--json"])
        .args(deployment)
        .args(timeout.iter().flatten())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Runs the example's shares run against `server` with `args`.
fn shares(server: &RedisServer, args: &[&str]) -> String {
    shares_summary(spawn_shares(server, args))
}

/// Each of `replicas` got from 0.8 to 1.2 of its fair share over every
/// 2 s of the measured window.
fn each_within_a_fifth(summary: &str, replicas: std::ops::Range<usize>) {
    let (low, high) = (list(summary, "low"), list(summary, "high"));
    for replica in replicas {
        assert!(
            low[replica] >= 0.8 && high[replica] <= 1.2,
            "replica {replica}: from {} to {} of its fair share over 2 s: {summary}",
            low[replica],
            high[replica],
        );
    }
}

/// Promise (docs/cluster.md, "Fair shares"): replicas offered equal load
/// above the ceiling each get within 20 % of an equal share of the calls
/// over any 2 s, with or without a wait budget. Four replicas of eight
/// callers (each its local limit) under a ceiling of 8, measured over 3.9 s
/// from a second after they start.
#[test]
fn replicas_under_equal_load_share_the_ceiling_equally() {
    let _turn = one_at_a_time();
    let server = RedisServer::start();
    for wait in ["0", "100"] {
        let summary = shares(
            &server,
            &["--late-ms", "0", "--seconds", "5", "--wait-ms", wait],
        );
        each_within_a_fifth(&summary, 0..4);
    }
}

/// Promise: three replicas under a ceiling of 8 share it equally over any
/// 2 s, though at any moment one holds two places and the others three:
/// the extra places go round (without that, one replica would get 2/8 of
/// the calls, 0.75 of its share, for as long as the load lasts).
#[test]
fn a_ceiling_that_does_not_divide_evenly_goes_round() {
    let _turn = one_at_a_time();
    let server = RedisServer::start();
    let summary = shares(
        &server,
        &["--replicas", "3", "--late-ms", "0", "--seconds", "5"],
    );
    each_within_a_fifth(&summary, 0..3);
}

/// Promise: a replica that starts late, the ceiling held by the others,
/// reaches its share within a second: measured from a second after it
/// started, its share over any 2 s is within 20 % of a fair one.
#[test]
fn a_replica_started_late_reaches_its_share_within_a_second() {
    let _turn = one_at_a_time();
    let server = RedisServer::start();
    let summary = shares(&server, &["--late-ms", "1500", "--seconds", "4"]);
    each_within_a_fifth(&summary, 0..4);
}

/// Promise: after Redis restarts empty (every replica admits under its
/// local limit alone meanwhile, then asks again after its backoff of 1 s),
/// the replicas share the ceiling again within a second more. The replicas
/// start together; Redis is restarted 1.5 s later, back by 2 s, asked again
/// by 3 s; measured from 4 s (`--late-ms 3000` with no late replica).
#[test]
fn after_a_redis_restart_the_replicas_share_again() {
    let _turn = one_at_a_time();
    let mut server = RedisServer::start();
    let started = Instant::now();
    let child = spawn_shares(
        &server,
        &["--late", "0", "--late-ms", "3000", "--seconds", "4"],
    );
    // The run's epoch is a second after it starts.
    std::thread::sleep(Duration::from_millis(2_500).saturating_sub(started.elapsed()));
    server.restart();
    let summary = shares_summary(child);
    each_within_a_fifth(&summary, 0..4);
}

/// Promise (docs/cluster.md, "When Redis is slow or away"): while Redis
/// does not answer, each replica admits under its local limit alone
/// (`FailOpen`, the default), and only those calls, admitted without a
/// lease, take the fleet over the ceiling; the calls on a lease never do.
/// The replicas start a second after the run; measured from 2 s to 3.9 s,
/// Redis frozen (`SIGSTOP`) from 2.5 s to 2.9 s: the replicas' requests
/// time out, and they admit without leases until their backoff has passed.
#[test]
fn a_frozen_redis_over_admits_only_calls_without_a_lease() {
    let _turn = one_at_a_time();
    let server = RedisServer::start();
    let started = Instant::now();
    let child = spawn_shares(
        &server,
        &["--late-ms", "0", "--seconds", "3", "--timeout-ms", "100"],
    );
    std::thread::sleep(Duration::from_millis(2_500).saturating_sub(started.elapsed()));
    server.freeze();
    std::thread::sleep(Duration::from_millis(400));
    server.thaw();
    let summary = shares_summary(child);
    // Over the ceiling, as the policy says, and so counted: not a run in
    // which nothing was admitted without a lease.
    assert!(
        field(&summary, "peak") > field(&summary, "ceiling")
            && field(&summary, "without_lease") > 0.0,
        "{summary}"
    );
}

/// Promise: a replica that asks for less than its share lends the rest. One
/// replica of a single caller (it holds at most one place of 8) beside three
/// of eight: it is served whenever it asks (its one place), the other three
/// split the other seven places equally, and the ceiling is kept about as
/// busy as under equal load, measured beside it in the same test (a debug
/// build on a loaded machine serves less than a release build's figures in
/// docs/cluster.md, and runs vary by a few percent): a place of the 8 kept
/// idle for the light replica would serve an eighth less.
#[test]
fn a_light_replica_lends_what_it_leaves_to_the_others() {
    let _turn = one_at_a_time();
    let server = RedisServer::start();
    let equal = shares(&server, &["--late-ms", "0", "--seconds", "4"]);
    let light = shares(
        &server,
        &["--light-workers", "1", "--late-ms", "0", "--seconds", "4"],
    );
    let shares = list(&light, "shares");
    assert!(
        (0.08..=0.17).contains(&shares[0]),
        "the light replica, one place of 8 at most: {light}"
    );
    let fair = (1.0 - shares[0]) / 3.0;
    for (replica, share) in shares.iter().enumerate().skip(1) {
        assert!(
            (share / fair - 1.0).abs() <= 0.2,
            "replica {replica}: {share} of the calls, {fair} fair: {light}"
        );
    }
    let (lent, busy) = (field(&light, "goodput"), field(&equal, "goodput"));
    assert!(
        lent >= 0.9 * busy,
        "goodput {lent} with a light replica, {busy} under equal load"
    );
}

/// Weights: a replica of weight 2 beside two of weight 1 gets half the
/// calls, each within 20 % of its share over any 2 s.
#[test]
fn weighted_replicas_share_in_proportion() {
    let _turn = one_at_a_time();
    let server = RedisServer::start();
    let summary = shares(
        &server,
        &[
            "--replicas",
            "3",
            "--weights",
            "2,1,1",
            "--late-ms",
            "0",
            "--seconds",
            "4",
        ],
    );
    each_within_a_fifth(&summary, 0..3);
}

/// Promise (docs/cluster.md, "Redis Cluster and Sentinel"): on a
/// three-primary Redis Cluster, four replica processes under one ceiling
/// keep it while its slot moves to another primary mid-run (`ASK` while
/// its key moves, then `MOVED`): the calls on a lease never pass the
/// ceiling, and each replica is served at least half its fair share of
/// the run. Half, not the single node's fifth over any 2 s: the migration
/// delays some replicas' requests more than others'.
#[test]
fn replicas_on_a_redis_cluster_keep_its_ceiling_as_its_slot_moves() {
    let _turn = one_at_a_time();
    let Some(cluster) =
        RedisCluster::start("replicas_on_a_redis_cluster_keep_its_ceiling_as_its_slot_moves")
    else {
        return;
    };
    let name = "fleet-on-a-cluster";
    let key = format!("tower-inflight:{{{name}}}:leases");
    let slot = cluster.slot(&key);
    let from = cluster.owner(slot);
    let to = (from + 1) % cluster.nodes.len();
    let (asked, moved) = (cluster.calls(to, "asking"), cluster.errors(from, "MOVED"));
    let nodes: Vec<String> = cluster.nodes.iter().map(Node::url).collect();
    let started = Instant::now();
    let child = spawn_shares_on(
        &["--redis-cluster".into(), nodes.join(",")],
        &["--name", name, "--late-ms", "0", "--seconds", "5"],
    );
    // The run's epoch is a second after it starts, measured from 2 s to
    // 5.9 s: the slot moves from 2.5 s to about 4 s, 700 ms with its key
    // on the source, 700 ms with it on the target.
    std::thread::sleep(Duration::from_millis(2_500).saturating_sub(started.elapsed()));
    cluster.migrate(slot, from, to, Duration::from_millis(700));
    let summary = shares_summary(child);
    assert_eq!(cluster.owner(slot), to);
    assert!(
        cluster.calls(to, "asking") > asked,
        "the replicas never followed an ASK to the target: {summary}"
    );
    assert!(
        cluster.errors(from, "MOVED") > moved,
        "the replicas never met a MOVED: {summary}"
    );
    let shares = list(&summary, "shares");
    let fair = 1.0 / shares.len() as f64;
    for (replica, share) in shares.iter().enumerate() {
        assert!(
            *share >= fair / 2.0,
            "replica {replica}: {share} of the calls, {fair} fair: {summary}"
        );
    }
}

/// The tokens' replicas (a token's first 16 characters are its replica's
/// id) of the leases that `node` holds under `key` with a deadline after
/// `after` (milliseconds of the server's clock).
fn leases_after(node: &Node, key: &str, after: u64) -> Vec<String> {
    let tokens: Vec<String> = node
        .command(&["ZRANGEBYSCORE", key, &format!("({after}"), "+inf"])
        .unwrap_or_default();
    tokens.into_iter().map(|token| token[..16].into()).collect()
}

/// `node`'s clock, in milliseconds.
fn server_millis(node: &Node) -> u64 {
    let (seconds, micros): (u64, u64) = node.command(&["TIME"]).unwrap();
    seconds * 1_000 + micros / 1_000
}

/// Promise (docs/cluster.md, "Redis Cluster and Sentinel"): four replica
/// processes (local limit 8 each) under a ceiling of 8 on the primary that
/// Sentinel names, the primary killed (`SIGKILL`) mid-run and its replica
/// promoted. The calls on a lease never pass the ceiling. Every replica
/// holds a lease granted by the promoted replica within 10 s of the
/// promotion; meanwhile the fleet never has more calls inside than the sum
/// of the local limits; and from half a second after (the calls admitted
/// before have ended), calls on a lease are inside again and no more calls
/// than the ceiling, as before the kill. The leases last 3 s: those granted
/// before the kill and replicated, never released, hold places on the
/// promoted replica for no longer.
#[test]
fn replicas_through_sentinel_get_the_ceiling_back_after_a_failover() {
    const CEILING: f64 = 8.0;
    const LOCAL_LIMITS: f64 = 4.0 * 8.0;
    const LEASE_MS: u64 = 3_000;
    let _turn = one_at_a_time();
    let Some(mut topology) =
        RedisSentinel::start("replicas_through_sentinel_get_the_ceiling_back_after_a_failover")
    else {
        return;
    };
    let name = "fleet-through-sentinel";
    let key = format!("tower-inflight:{{{name}}}:leases");
    let started = Instant::now();
    let child = spawn_shares_on(
        &[
            "--sentinels".into(),
            topology.sentinel_urls().join(","),
            "--primary-name".into(),
            PRIMARY_NAME.into(),
        ],
        &[
            "--name",
            name,
            "--late-ms",
            "0",
            "--seconds",
            "15",
            "--lease-ms",
            &LEASE_MS.to_string(),
        ],
    );
    // The run's epoch is a second after it starts; the primary dies 1.5 s
    // into the run, the sentinels call it down a second later, and the
    // run lasts long enough to see the ceiling back within 10 s of the
    // promotion and a second after.
    std::thread::sleep(Duration::from_millis(2_500).saturating_sub(started.elapsed()));
    let killed_at = unix_millis();
    topology.primary.kill();
    let replica_port = topology.replica.port;
    let kill = Instant::now();
    let named_by_all = |topology: &RedisSentinel| {
        topology.sentinels.iter().all(|sentinel| {
            sentinel
                .command::<(String, u16)>(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", PRIMARY_NAME])
                .is_ok_and(|(_, port)| port == replica_port)
        })
    };
    while !named_by_all(&topology) {
        assert!(
            kill.elapsed() < Duration::from_secs(60),
            "the sentinels never promoted the replica"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let promoted = Instant::now();
    let promoted_at = server_millis(&topology.replica);

    // Back: each of the four replicas holds a lease granted since, one
    // whose deadline is past the promotion's by more than a lease.
    let mut granted = std::collections::HashSet::new();
    while granted.len() < 4 {
        granted.extend(leases_after(
            &topology.replica,
            &key,
            promoted_at + LEASE_MS,
        ));
        assert!(
            promoted.elapsed() < Duration::from_secs(10),
            "10 s after the promotion, only {} of 4 replicas granted a lease",
            granted.len()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let back_at = unix_millis();
    let back = promoted.elapsed();
    let summary = shares_summary(child);

    let epoch = field(&summary, "epoch") as u64;
    let tenth = |at: u64| (at.saturating_sub(epoch) / 100) as usize;
    let (peak, peak_leased, without_lease) = (
        list(&summary, "tenth_peak"),
        list(&summary, "tenth_peak_leased"),
        list(&summary, "tenth_without_lease"),
    );
    let most = |tenths: &[f64]| tenths.iter().copied().fold(0.0, f64::max);
    let sum = |tenths: &[f64]| tenths.iter().sum::<f64>();
    // The last tenth is the run's end, unfinished.
    let end = peak.len() - 1;
    let (killed, after) = (tenth(killed_at), tenth(back_at + 500));
    eprintln!(
        "promoted {:?} after the kill, the ceiling back {back:?} after that; meanwhile at most \
         {} inside, {} calls without a lease; after, at most {} inside",
        promoted - kill,
        most(&peak[killed..after.min(end)]),
        sum(&without_lease[killed..after.min(end)]),
        most(&peak[after.min(end)..end]),
    );
    assert!(
        end >= after + 10,
        "the ceiling came back too late in the run to measure a second after: {summary}"
    );
    // Under the ceiling before the kill and again after, as in
    // `within_the_ceiling`: more calls only with calls admitted without a
    // lease inside (a request timed out on a loaded machine: `FailOpen`).
    let (before, again) = (0..killed, after..end);
    for (when, tenths) in [("before the kill", before), ("after", again.clone())] {
        assert!(
            most(&peak[tenths.clone()]) <= CEILING || sum(&without_lease[tenths]) > 0.0,
            "{when}, more calls than the ceiling, none of them without a lease: {summary}"
        );
    }
    assert!(
        most(&peak) <= LOCAL_LIMITS,
        "more calls inside than the sum of the local limits: {summary}"
    );
    // The primary's death was felt: calls admitted without a lease.
    assert!(sum(&without_lease[killed..after]) > 0.0, "{summary}");
    assert!(
        most(&peak_leased[again]) > 0.0,
        "no call on a lease after: {summary}"
    );
}

fn unix_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}
