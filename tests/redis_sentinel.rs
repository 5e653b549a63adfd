//! The cluster ceiling through Redis Sentinel: a primary, a replica and
//! three sentinels on loopback ports, started by the test (see
//! `support/redis_topology.rs`); the primary killed mid-run, the replica
//! promoted, the ceiling back. By hand:
//!
//! ```text
//! apt-get install redis-server
//! cargo test --features redis --test redis_sentinel
//! ```
//!
//! Without `redis-server` on `PATH`, the test says it is skipped and passes.

mod support;

use redis::sentinel::{SentinelClient, SentinelServerType};
use redis::AsyncCommands;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::redis_topology::{RedisSentinel, PRIMARY_NAME};
use tower_inflight::redis::ClusterCeiling;
use tower_inflight::{Bulkhead, Config, ShedReason};

const LONG: Duration = Duration::from_secs(30);
const CEILING: usize = 6;
const LOCAL: usize = 4;
const REPLICAS: usize = 3;

fn ceiling(topology: &RedisSentinel, name: &str) -> ClusterCeiling {
    let client = SentinelClient::build(
        topology.sentinel_urls(),
        String::from(PRIMARY_NAME),
        None,
        SentinelServerType::Master,
    )
    .unwrap();
    ClusterCeiling::sentinel(client, name, CEILING)
        // A loaded two-core machine: a command may take a while.
        .timeout(Duration::from_secs(1))
        .backoff(Duration::from_millis(100))
        // Leases lost (or left behind) in the failover end within 3 s.
        .lease(Duration::from_secs(3))
}

/// The calls in flight across the fleet, with the most seen since the last
/// `window`.
#[derive(Default)]
struct Fleet {
    in_flight: AtomicUsize,
    peak: AtomicUsize,
    admitted: AtomicU64,
}

impl Fleet {
    fn enter(&self) {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        self.admitted.fetch_add(1, Ordering::SeqCst);
    }

    fn leave(&self) {
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
    }

    /// The peak since the last window, and a new window begun.
    fn window(&self) -> usize {
        self.peak
            .swap(self.in_flight.load(Ordering::SeqCst), Ordering::SeqCst)
    }
}

fn without_lease(bulkheads: &[Bulkhead]) -> u64 {
    bulkheads
        .iter()
        .map(|bulkhead| bulkhead.status().cluster.unwrap().admitted_without_lease)
        .sum()
}

/// How the primary goes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    /// SIGKILL: its connections break at once.
    Killed,
    /// SIGSTOP: its connections stay open and commands go unanswered (a
    /// stall, a network split); thawed once the replica is promoted, it
    /// comes back and is demoted to a replica.
    Frozen,
}

/// Three replicas (local limit 4 each: 12 in all) under a ceiling of 6,
/// `FailOpen` (the default), each with 6 callers taking a permit, holding
/// it 10 to 30 ms and asking again. The primary is killed; the sentinels
/// promote the replica; the ceiling must be back (every replica granted
/// leases again) within 10 s of the promotion. Meanwhile the fleet never
/// has more than 12 calls in flight, and once the calls admitted before
/// the ceiling came back have ended, never more than 6.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_brings_the_ceiling_back_within_the_local_limits_meanwhile() {
    failover(
        "a_failover_brings_the_ceiling_back_within_the_local_limits_meanwhile",
        Fault::Killed,
    )
    .await;
}

/// The same with the primary frozen rather than killed: the connection to
/// it stays open, so only commands unanswered until their timeout tell the
/// ceiling to ask the sentinels again: the ceiling is back while the old
/// primary is still frozen. Thawed then, it comes back and is demoted, and
/// the ceiling stays on the new primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_primary_is_left_for_the_promoted_replica() {
    failover(
        "a_stalled_primary_is_left_for_the_promoted_replica",
        Fault::Frozen,
    )
    .await;
}

async fn failover(test: &str, fault: Fault) {
    let Some(topology) = RedisSentinel::start(test) else {
        return;
    };
    let topology = Arc::new(std::sync::Mutex::new(topology));
    let (primary_port, replica_port, key) = {
        let topology = topology.lock().unwrap();
        (
            topology.primary.port,
            topology.replica.port,
            ceiling(&topology, "failover").key(),
        )
    };
    let bulkheads: Vec<Bulkhead> = {
        let topology = topology.lock().unwrap();
        (0..REPLICAS)
            .map(|_| {
                Bulkhead::new(
                    Config::new(LOCAL, LONG).cluster_ceiling(ceiling(&topology, "failover")),
                )
            })
            .collect()
    };

    // The ceiling holds through Sentinel's primary.
    let mut held = Vec::new();
    for n in 0..CEILING {
        held.push(bulkheads[n % REPLICAS].acquire().await.unwrap());
    }
    let shed = bulkheads[0].acquire().await.map(|_| ()).unwrap_err();
    assert_eq!(shed.reason(), ShedReason::ClusterLimit);
    drop(held);

    let fleet = Arc::new(Fleet::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut callers = Vec::new();
    for (replica, bulkhead) in bulkheads.iter().enumerate() {
        for caller in 0..6 {
            let (bulkhead, fleet, stop) = (bulkhead.clone(), fleet.clone(), stop.clone());
            callers.push(tokio::spawn(async move {
                let mut n = (replica * 7 + caller) as u64;
                while !stop.load(Ordering::SeqCst) {
                    match bulkhead.acquire().await {
                        Ok(permit) => {
                            fleet.enter();
                            n = n.wrapping_mul(6364136223846793005).wrapping_add(1);
                            tokio::time::sleep(Duration::from_millis(10 + (n >> 33) % 21)).await;
                            fleet.leave();
                            drop(permit);
                        }
                        Err(shed) => {
                            // The ceiling, or the replica's own limit (6 callers, 4 slots).
                            assert!(
                                matches!(
                                    shed.reason(),
                                    ShedReason::ClusterLimit | ShedReason::LimitReached
                                ),
                                "{shed:?}"
                            );
                            tokio::time::sleep(Duration::from_millis(2)).await;
                        }
                    }
                }
            }));
        }
    }

    // Healthy: the ceiling holds.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let healthy = fleet.window();
    assert!(
        healthy <= CEILING,
        "{healthy} in flight under a ceiling of {CEILING}"
    );
    assert_eq!(without_lease(&bulkheads), 0);

    // The primary dies; the sentinels promote the replica.
    let killed = Instant::now();
    match fault {
        Fault::Killed => topology.lock().unwrap().primary.kill(),
        Fault::Frozen => topology.lock().unwrap().primary.freeze(),
    }
    let promoted = {
        let topology = topology.clone();
        tokio::task::spawn_blocking(move || {
            let topology = topology.lock().unwrap();
            loop {
                let named: Vec<Option<u16>> = topology
                    .sentinels
                    .iter()
                    .map(|sentinel| {
                        sentinel
                            .command::<(String, u16)>(&[
                                "SENTINEL",
                                "GET-MASTER-ADDR-BY-NAME",
                                PRIMARY_NAME,
                            ])
                            .ok()
                            .map(|(_, port)| port)
                    })
                    .collect();
                if named.iter().all(|port| *port == Some(replica_port)) {
                    return Instant::now();
                }
                assert!(
                    killed.elapsed() < Duration::from_secs(90),
                    "the sentinels never promoted the replica: {named:?} (primary was {primary_port})"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        })
        .await
        .unwrap()
    };
    let granted_at_promotion: Vec<u64> = bulkheads
        .iter()
        .map(|bulkhead| bulkhead.status().cluster.unwrap().leases_granted)
        .collect();

    // The ceiling comes back: every replica is granted leases again.
    let back = loop {
        let all_back = bulkheads
            .iter()
            .zip(&granted_at_promotion)
            .all(|(bulkhead, before)| {
                let status = bulkhead.status().cluster.unwrap();
                status.reachable && status.leases_granted > *before
            });
        if all_back {
            break Instant::now();
        }
        assert!(
            promoted.elapsed() < Duration::from_secs(10),
            "the ceiling was not back 10 s after the promotion"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    if fault == Fault::Frozen {
        // Back while the old primary is still frozen; thawed, it is
        // demoted, and the ceiling stays on the new one.
        topology.lock().unwrap().primary.thaw();
    }
    let meanwhile = fleet.window();
    let admitted_without_lease = without_lease(&bulkheads);
    eprintln!(
        "{fault:?}: promoted {:?} after the fault; ceiling back {:?} after the promotion; \
         meanwhile at most {meanwhile} in flight, {admitted_without_lease} calls \
         admitted without a lease",
        promoted - killed,
        back - promoted,
    );
    assert!(
        meanwhile <= REPLICAS * LOCAL,
        "{meanwhile} in flight: more than the sum of the local limits"
    );

    // The calls admitted before it came back end (within 30 ms, and the
    // leases lost with the old primary with them): under the ceiling again.
    tokio::time::sleep(Duration::from_millis(500)).await;
    fleet.window();
    let admitted = fleet.admitted.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let after = fleet.window();
    assert_eq!(
        without_lease(&bulkheads),
        admitted_without_lease,
        "Redis failed again after the failover"
    );
    assert!(
        fleet.admitted.load(Ordering::SeqCst) > admitted,
        "no call admitted after the failover"
    );
    assert!(
        after <= CEILING,
        "{after} in flight under a ceiling of {CEILING}"
    );

    stop.store(true, Ordering::SeqCst);
    for caller in callers {
        caller.await.unwrap();
    }
    // Every lease granted by the new primary is given back to it.
    let promoted_client = topology.lock().unwrap().replica.client();
    let mut connection = promoted_client
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let started = Instant::now();
    loop {
        // The leases: the members with a deadline.
        let held: usize = connection.zcount(&key, "(0", "+inf").await.unwrap();
        if held == 0 {
            break;
        }
        assert!(started.elapsed() < LONG, "{held} leases never given back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
