//! Faults of the cluster ceiling found by an adversarial reading, each a
//! promise an earlier version broke: a burst of callers shed by their own
//! last leases, a burst on a healthy Redis taken for an outage (every
//! request carried the same releases), releases of a dropped bulkhead lost
//! in a short outage, and leases ending up to a millisecond early. Each test
//! starts a `redis-server` of its own (`redis-server` must be on `PATH`):
//!
//! ```text
//! cargo test --features redis --test cluster_faults
//! ```
#![cfg(feature = "redis")]

#[path = "support/redis_server.rs"]
#[allow(dead_code)] // the tests' helper: these use part of it
mod redis_server;

use redis::AsyncCommands;
use redis_server::RedisServer;
use std::future::Future;
use std::task::Poll;
use std::time::{Duration, Instant};
use tower_inflight::redis::ClusterCeiling;
use tower_inflight::{Bulkhead, Config, ShedReason};

const LONG: Duration = Duration::from_secs(30);

async fn admin(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

fn key(server: &RedisServer, name: &str) -> String {
    ClusterCeiling::new(server.client(), name, 1).key()
}

async fn leases(server: &RedisServer, name: &str) -> usize {
    admin(server).await.zcard(key(server, name)).await.unwrap()
}

/// Polls every future on each wake-up, all in one go (as callers arriving
/// together on a multi-threaded server would ask within microseconds), and
/// collects their outputs in order.
async fn all_at_once<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<_> = futures.into_iter().map(|f| Some(Box::pin(f))).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if let Some(pending) = future {
                if let Poll::Ready(done) = pending.as_mut().poll(cx) {
                    *output = Some(done);
                    *future = None;
                }
            }
        }
        if futures.iter().all(Option::is_none) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    outputs.into_iter().map(Option::unwrap).collect()
}

/// Promise (docs/cluster.md, step 4; releases.rs): "every lease request
/// carries the newest pending releases ... so a caller's next call never
/// finds its own last lease still held, on any thread".
///
/// 300 callers, one call at a time each, never more than the ceiling (300)
/// in all: they all end their calls at once, then all call again. Each
/// request carries only the newest 256 releases (`BATCH`), so the 44
/// oldest releases are still held when the requests count, and 44 callers
/// are shed with `ClusterLimit` by their own last leases.
#[tokio::test]
async fn a_burst_of_callers_is_never_shed_by_its_own_last_leases() {
    let server = RedisServer::start();
    const CALLERS: usize = 300;
    let bulkhead = Bulkhead::new(Config::new(CALLERS, LONG).cluster_ceiling(
        // A generous timeout: 300 requests carrying 256 releases each keep
        // Redis busy, and none may fall back to `FailOpen`.
        ClusterCeiling::new(server.client(), "burst", CALLERS).timeout(Duration::from_secs(10)),
    ));
    let mut held = Vec::new();
    for _ in 0..CALLERS {
        held.push(bulkhead.acquire().await.unwrap());
    }
    assert_eq!(leases(&server, "burst").await, CALLERS);
    // Every call ends, then every caller calls again: never more than
    // CALLERS calls in flight.
    drop(held);
    let again = all_at_once((0..CALLERS).map(|_| bulkhead.acquire()).collect()).await;
    let shed: Vec<ShedReason> = again
        .iter()
        .filter_map(|outcome| outcome.as_ref().err().map(|shed| shed.reason()))
        .collect();
    assert!(
        shed.is_empty(),
        "{} of {CALLERS} callers shed by their own last leases: {:?}; {:?}",
        shed.len(),
        shed.first(),
        bulkhead.status().cluster
    );
}

/// Promise (docs/cluster.md, step 4): "releases pending as the bulkhead
/// goes are still sent while the runtime runs"; releases.rs: "releases
/// added as the bulkhead goes are still sent while its runtime runs".
///
/// Redis is away for a second (killed and restarted from its last save, as
/// a failover or a restart would bring it back) just as a bulkhead is
/// dropped (a configuration reload). The task tries twice, 100 ms apart,
/// then drops the release: the lease is held in Redis for its whole lease
/// (30 s here), a slot lost to the whole fleet, though the runtime runs on.
#[tokio::test]
async fn releases_of_a_dropped_bulkhead_survive_a_short_redis_outage() {
    let mut server = RedisServer::start();
    let bulkhead = Bulkhead::new(Config::new(4, LONG).cluster_ceiling(ClusterCeiling::new(
        server.client(),
        "reload",
        4,
    )));
    let permit = bulkhead.acquire().await.unwrap();
    let _: () = redis::cmd("SAVE")
        .query_async(&mut admin(&server).await)
        .await
        .unwrap();
    server.stop();
    drop(permit);
    drop(bulkhead); // a reload: a new bulkhead takes over
    tokio::time::sleep(Duration::from_secs(1)).await;
    server.restart(); // from the save: the lease is back in Redis
    assert_eq!(leases(&server, "reload").await, 1, "the save was loaded");
    let started = Instant::now();
    while leases(&server, "reload").await != 0 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the dropped bulkhead's release was never sent: the lease stays held for its whole lease"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The Redis server's clock, in microseconds.
async fn server_micros(connection: &mut redis::aio::MultiplexedConnection) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(connection).await.unwrap();
    secs * 1_000_000 + micros
}

/// Promise (docs/cluster.md): leases are "reclaimed after their lease, never
/// before"; a lease's score is its deadline.
///
/// The script dates a lease `floor(now in ms) + lease_ms`, and reclaims
/// it once `floor(now in ms) >= score`: a lease granted 0.9 ms into a
/// millisecond is reclaimable up to 0.9 ms before its lease has run (and
/// `Lease::lapsed`, which counts a whole `lease` from the request, still
/// takes it for live). The score is read here and compared with the
/// server's clock just before the request: a deadline earlier than that
/// plus the lease is a lease cut short.
#[tokio::test]
async fn a_lease_never_ends_before_its_lease_has_run() {
    let server = RedisServer::start();
    let lease = Duration::from_millis(1_000);
    let bulkhead = Bulkhead::new(
        Config::new(4, LONG)
            .cluster_ceiling(ClusterCeiling::new(server.client(), "early", 4).lease(lease)),
    );
    let mut connection = admin(&server).await;
    let key = key(&server, "early");
    drop(bulkhead.acquire().await.unwrap()); // connected, script loaded
    let mut cut_short = Vec::new();
    for _ in 0..20 {
        let before = server_micros(&mut connection).await;
        let permit = bulkhead.acquire().await.unwrap();
        let after = server_micros(&mut connection).await;
        let held: Vec<(String, u64)> = connection.zrange_withscores(&key, 0, -1).await.unwrap();
        assert_eq!(held.len(), 1, "only this permit's lease: {held:?}");
        let deadline_micros = held[0].1 * 1_000;
        // Granted between `before` and `after`: its lease runs until at
        // least `before + lease`.
        if deadline_micros < before + lease.as_micros() as u64 {
            cut_short.push(format!(
                "granted in [{before}, {after}] µs, reclaimable from {deadline_micros} µs: {} µs early at least",
                before + lease.as_micros() as u64 - deadline_micros
            ));
        }
        drop(permit);
        let started = Instant::now();
        while leases(&server, "early").await != 0 {
            assert!(started.elapsed() < Duration::from_secs(10));
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    assert!(
        cut_short.is_empty(),
        "{} of 20 leases cut short: {cut_short:#?}",
        cut_short.len()
    );
}

/// Promise (docs/cluster.md, "When Redis is slow or away"): the policy is for
/// a Redis whose commands fail or take longer than `timeout`.
///
/// Here Redis is healthy and local. 600 callers end their calls and call
/// again together, as a busy replica does: each of the 600 requests
/// carries the same 256 newest releases (`Outbox::newest` hands every
/// request the same tokens, already carried by others), so Redis runs
/// 600 × 256 `ZREM`s instead of 600, requests queue behind them past the
/// default 100 ms timeout, and the replica declares Redis unreachable,
/// skips it for the backoff and admits calls without a lease (`FailOpen`).
#[tokio::test]
async fn a_burst_on_a_healthy_redis_is_not_taken_for_an_outage() {
    let server = RedisServer::start();
    const CALLERS: usize = 600;
    let bulkhead = Bulkhead::new(
        Config::new(CALLERS, LONG).cluster_ceiling(ClusterCeiling::new(
            server.client(),
            "healthy",
            CALLERS,
        )),
    );
    let mut held = Vec::new();
    for _ in 0..CALLERS {
        held.push(bulkhead.acquire().await.unwrap());
    }
    let before = bulkhead.status().cluster.unwrap();
    assert_eq!(before.errors, 0);
    drop(held);
    let again = all_at_once((0..CALLERS).map(|_| bulkhead.acquire()).collect()).await;
    drop(again);
    let cluster = bulkhead.status().cluster.unwrap();
    assert!(
        cluster.errors == 0 && cluster.admitted_without_lease == 0,
        "a healthy Redis taken for unreachable: {cluster:?}"
    );
}
