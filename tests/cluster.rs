//! The cluster ceiling against a real `redis-server`, one per test, started
//! on a free loopback port (see `support/redis_server.rs`). By hand:
//!
//! ```text
//! apt-get install redis-server   # or REDIS_SERVER=/path/to/redis-server
//! cargo test --features redis --test cluster
//! ```

mod support;

use redis::AsyncCommands;
use std::time::{Duration, Instant};
use support::redis_server::RedisServer;
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
use tower_inflight::keyed::{KeyedBulkhead, KeyedConcurrencyLayer, KeyedConfig};
use tower_inflight::redis::{ClusterCeiling, WhenUnreachable};
use tower_inflight::{BoxError, Bulkhead, ConcurrencyLayer, Config, ServiceSaturated, ShedReason};

const LONG: Duration = Duration::from_secs(30);

fn bulkhead(server: &RedisServer, name: &str, local: usize, ceiling: usize) -> Bulkhead {
    Bulkhead::new(
        Config::new(local, LONG).cluster_ceiling(ClusterCeiling::new(
            server.client(),
            name,
            ceiling,
        )),
    )
}

async fn leases(server: &RedisServer, name: &str) -> usize {
    let mut connection = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let key = ClusterCeiling::new(server.client(), name, 1).key();
    // The leases: the members with a deadline (the others, below zero, are
    // the fair shares' records).
    connection.zcount(key, "(0", "+inf").await.unwrap()
}

/// Waits (up to 10 s) until `name`'s set holds `count` leases: releases
/// reach Redis in the background.
async fn until_leases(server: &RedisServer, name: &str, count: usize) {
    let started = Instant::now();
    while leases(server, name).await != count {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never {count} leases"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn reason(shed: Result<impl Sized, ServiceSaturated>) -> ShedReason {
    match shed {
        Ok(_) => panic!("admitted"),
        Err(shed) => shed.reason(),
    }
}

#[tokio::test]
async fn replicas_share_one_ceiling_and_a_refused_lease_gives_the_local_slot_back() {
    let server = RedisServer::start();
    let (a, b) = (bulkhead(&server, "db", 4, 5), bulkhead(&server, "db", 4, 5));
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(a.acquire().await.unwrap());
    }
    held.push(b.acquire().await.unwrap());
    assert_eq!(leases(&server, "db").await, 5);

    // B has three local slots free, but the fleet holds five.
    assert_eq!(reason(b.acquire().await), ShedReason::ClusterLimit);
    assert_eq!(
        b.in_flight(),
        1,
        "the refused call's local slot was given back"
    );
    let status = b.status();
    assert_eq!(status.totals.rejected_cluster_limit, 1);
    let cluster = status.cluster.unwrap();
    assert_eq!((cluster.limit, cluster.leases_held), (5, 5));
    assert_eq!((cluster.leases_granted, cluster.leases_refused), (1, 1));

    // One of A's calls ends: its lease goes, and B may take it.
    drop(held.remove(0));
    until_leases(&server, "db", 4).await;
    held.push(b.acquire().await.unwrap());
    assert_eq!(b.in_flight(), 2);

    drop(held);
    until_leases(&server, "db", 0).await;
    assert_eq!((a.in_flight(), b.in_flight()), (0, 0));
    support::eventually("a's four releases answered", || {
        let a = a.status().cluster.unwrap();
        a.leases_released + a.releases_late + a.releases_lost >= 4
    })
    .await;
    let a = a.status().cluster.unwrap();
    assert_eq!(
        (a.leases_released, a.releases_late, a.releases_lost),
        (4, 0, 0)
    );
}

#[tokio::test]
async fn a_full_process_sheds_without_asking_redis() {
    let mut server = RedisServer::start();
    let bulkhead = Bulkhead::new(
        Config::new(1, LONG).cluster_ceiling(
            ClusterCeiling::new(server.client(), "local", 10)
                .when_unreachable(WhenUnreachable::FailClosed),
        ),
    );
    let held = bulkhead.acquire().await.unwrap();
    server.stop();
    // With Redis gone and `FailClosed`, asking would shed the call as
    // unavailable: the local limit answers first.
    for _ in 0..100 {
        assert_eq!(reason(bulkhead.acquire().await), ShedReason::LimitReached);
    }
    let cluster = bulkhead.status().cluster.unwrap();
    assert_eq!((cluster.errors, cluster.leases_granted), (0, 1));
    drop(held);
}

#[tokio::test]
async fn a_wait_budget_asks_again_until_a_lease_comes_free() {
    let server = RedisServer::start();
    let holder = bulkhead(&server, "wait", 1, 1);
    let waiter = Bulkhead::new(
        Config::new(1, LONG)
            .wait(Duration::from_secs(5))
            .cluster_ceiling(ClusterCeiling::new(server.client(), "wait", 1)),
    );
    let held = holder.acquire().await.unwrap();
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move { waiter.acquire().await.map(|_| ()) }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Waiting for the ceiling, it holds its local slot.
    assert_eq!(waiter.in_flight(), 1);
    drop(held);
    waiting.await.unwrap().unwrap();
    assert!(waiter.status().cluster.unwrap().leases_refused >= 1);
    // The waiter's release reaches Redis from its background task.
    until_leases(&server, "wait", 0).await;

    // No lease comes free: shed once the budget is spent, for the ceiling.
    let held = holder.acquire().await.unwrap();
    let short = Bulkhead::new(
        Config::new(1, LONG)
            .wait(Duration::from_millis(50))
            .cluster_ceiling(ClusterCeiling::new(server.client(), "wait", 1)),
    );
    assert_eq!(reason(short.acquire().await), ShedReason::ClusterLimit);
    assert_eq!(short.in_flight(), 0);
    drop(held);
}

#[tokio::test]
async fn a_lease_never_released_runs_out_and_is_reclaimed() {
    let server = RedisServer::start();
    let ceiling = |client| ClusterCeiling::new(client, "leak", 1).lease(Duration::from_millis(300));
    let leaky = Bulkhead::new(Config::new(1, LONG).cluster_ceiling(ceiling(server.client())));
    let other = Bulkhead::new(Config::new(1, LONG).cluster_ceiling(ceiling(server.client())));
    let started = Instant::now();
    std::mem::forget(leaky.acquire().await.unwrap());
    assert_eq!(reason(other.acquire().await), ShedReason::ClusterLimit);
    let admitted = loop {
        match other.acquire().await {
            Ok(permit) => break permit,
            Err(shed) => assert_eq!(shed.reason(), ShedReason::ClusterLimit),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "not before the lease ran out"
    );
    assert_eq!(other.status().cluster.unwrap().leases_reclaimed, 1);
    drop(admitted);
}

#[tokio::test]
async fn renewal_keeps_a_long_call_s_lease_until_its_permit_goes() {
    let server = RedisServer::start();
    let ceiling = |client| {
        ClusterCeiling::new(client, "renew", 1)
            .lease(Duration::from_millis(200))
            .renew(true)
    };
    let long = Bulkhead::new(Config::new(1, LONG).cluster_ceiling(ceiling(server.client())));
    let other = Bulkhead::new(Config::new(1, LONG).cluster_ceiling(ceiling(server.client())));
    let held = long.acquire().await.unwrap();
    // Five leases long: renewed all along.
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(reason(other.acquire().await), ShedReason::ClusterLimit);
    }
    drop(held);
    until_leases(&server, "renew", 0).await;
    assert!(other.acquire().await.is_ok());
    assert_eq!(other.status().cluster.unwrap().leases_reclaimed, 0);
}

#[tokio::test]
async fn a_renewed_lease_whose_permit_leaked_runs_out_after_reclaim_after() {
    let server = RedisServer::start();
    let ceiling = |client| {
        ClusterCeiling::new(client, "renew-leak", 1)
            .lease(Duration::from_millis(150))
            .timeout(Duration::from_millis(50))
            .renew(true)
    };
    let reclaim_after = Duration::from_millis(400);
    let leaky =
        Bulkhead::new(Config::new(1, reclaim_after).cluster_ceiling(ceiling(server.client())));
    let other = Bulkhead::new(Config::new(1, LONG).cluster_ceiling(ceiling(server.client())));
    let started = Instant::now();
    std::mem::forget(leaky.acquire().await.unwrap());
    let admitted = loop {
        if let Ok(permit) = other.acquire().await {
            break permit;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "renewed for ever"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(
        started.elapsed() >= reclaim_after,
        "renewed until reclaim_after"
    );
    drop(admitted);
}

/// Each policy for an unreachable Redis, with Redis stopped mid-run and
/// started again.
#[tokio::test]
async fn redis_stopped_and_restarted_under_each_policy() {
    for policy in [
        WhenUnreachable::FailOpen,
        WhenUnreachable::FailClosed,
        WhenUnreachable::LocalLimit(2),
    ] {
        let mut server = RedisServer::start();
        let backoff = Duration::from_millis(300);
        let bulkhead = Bulkhead::new(
            Config::new(8, LONG).cluster_ceiling(
                ClusterCeiling::new(server.client(), "down", 3)
                    .timeout(Duration::from_millis(100))
                    .backoff(backoff)
                    .when_unreachable(policy),
            ),
        );
        let leased = bulkhead.acquire().await.unwrap();
        server.stop();

        // The first call pays the failure; the others, within the
        // backoff, skip Redis: one error in all.
        let mut held = Vec::new();
        let mut shed = Vec::new();
        for _ in 0..3 {
            match bulkhead.acquire().await {
                Ok(permit) => held.push(permit),
                Err(refused) => shed.push(refused.reason()),
            }
        }
        let cluster = bulkhead.status().cluster.unwrap();
        assert!(!cluster.reachable, "{policy:?}");
        assert_eq!(cluster.errors, 1, "{policy:?}: skipped during the backoff");
        match policy {
            WhenUnreachable::FailOpen => {
                assert_eq!((held.len(), shed.len()), (3, 0));
                assert_eq!(cluster.admitted_without_lease, 3);
            }
            WhenUnreachable::FailClosed => {
                assert_eq!(shed, [ShedReason::ClusterUnavailable; 3]);
            }
            _ => {
                assert_eq!(shed, [ShedReason::ClusterUnavailable], "{policy:?}");
                assert_eq!(cluster.fallback_held, 2);
            }
        }
        assert_eq!(
            bulkhead.in_flight(),
            1 + held.len(),
            "{policy:?}: no local slot leaked"
        );

        // Back: within the backoff (and the reconnection), calls get
        // leases again.
        server.restart();
        let started = Instant::now();
        let lease = loop {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let granted = bulkhead.status().cluster.unwrap().leases_granted;
            if let Ok(permit) = bulkhead.acquire().await {
                if bulkhead.status().cluster.unwrap().leases_granted > granted {
                    break permit;
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{policy:?}: never recovered"
            );
        };
        assert!(bulkhead.status().cluster.unwrap().reachable);
        assert_eq!(leases(&server, "down").await, 1, "{policy:?}");

        drop((leased, lease, held));
        assert_eq!(bulkhead.in_flight(), 0, "{policy:?}");
        assert_eq!(
            bulkhead.status().cluster.unwrap().fallback_held,
            0,
            "{policy:?}"
        );
    }
}

#[tokio::test]
async fn a_deleted_set_over_admits_no_more_than_the_local_limits() {
    let server = RedisServer::start();
    let (a, b) = (
        bulkhead(&server, "deleted", 3, 4),
        bulkhead(&server, "deleted", 3, 4),
    );
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(a.acquire().await.unwrap());
    }
    held.push(b.acquire().await.unwrap());
    assert_eq!(reason(b.acquire().await), ShedReason::ClusterLimit);

    let mut connection = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let key = ClusterCeiling::new(server.client(), "deleted", 4).key();
    let _: () = connection.del(&key).await.unwrap();

    // The leases are lost: B admits up to its own limit, A stays full.
    held.push(b.acquire().await.unwrap());
    held.push(b.acquire().await.unwrap());
    assert_eq!(reason(b.acquire().await), ShedReason::LimitReached);
    assert_eq!(reason(a.acquire().await), ShedReason::LimitReached);
    assert_eq!(
        a.in_flight() + b.in_flight(),
        6,
        "over the ceiling, within 3 + 3"
    );

    // The releases of the lost leases remove nobody else's. The set is
    // empty once the two held leases are released; the four late releases
    // are answered on their own time, so the counts are waited for.
    drop(held);
    until_leases(&server, "deleted", 0).await;
    let counts = || {
        let (a, b) = (a.status().cluster.unwrap(), b.status().cluster.unwrap());
        (
            a.releases_late + b.releases_late,
            a.leases_released + b.leases_released,
        )
    };
    support::eventually("the six releases answered", || counts().0 + counts().1 >= 6).await;
    let (late, released) = counts();
    assert_eq!(late, 4);
    assert_eq!(released, 2);
}

#[tokio::test]
async fn calls_that_may_not_wait_follow_the_policy_for_an_unreachable_redis() {
    let server = RedisServer::start();
    let open = bulkhead(&server, "sync", 2, 1);
    assert!(
        open.try_acquire().is_ok(),
        "FailOpen: the local limit alone"
    );
    let closed = Bulkhead::new(
        Config::new(2, LONG).cluster_ceiling(
            ClusterCeiling::new(server.client(), "sync", 1)
                .when_unreachable(WhenUnreachable::LocalLimit(1)),
        ),
    );
    assert_eq!(reason(closed.try_acquire()), ShedReason::ClusterUnavailable);
    assert_eq!(
        reason(closed.try_acquire_weighted(1)),
        ShedReason::ClusterUnavailable
    );
    assert_eq!(closed.in_flight(), 0);
    assert_eq!(leases(&server, "sync").await, 0, "no lease taken");
}

#[tokio::test]
async fn the_layer_takes_a_lease_per_call() {
    let server = RedisServer::start();
    let layer = ConcurrencyLayer::new(Config::new(4, LONG).cluster_ceiling(ClusterCeiling::new(
        server.client(),
        "layer",
        1,
    )));
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let released = std::sync::Mutex::new(Some(released));
    let mut service = ServiceBuilder::new()
        .layer(layer.clone())
        .service(service_fn(move |_: ()| {
            let gate = released.lock().unwrap().take();
            async move {
                if let Some(gate) = gate {
                    let _ = gate.await;
                }
                Ok::<_, BoxError>("done")
            }
        }));
    let first = service.ready().await.unwrap().call(());
    let first = tokio::spawn(first);
    until_leases(&server, "layer", 1).await;

    // A second call: the fleet's one lease is taken.
    let error = service.ready().await.unwrap().call(()).await.unwrap_err();
    let shed = error.downcast_ref::<ServiceSaturated>().unwrap();
    assert_eq!(shed.reason(), ShedReason::ClusterLimit);
    assert_eq!(shed.http_status(), http::StatusCode::SERVICE_UNAVAILABLE);

    release.send(()).unwrap();
    assert_eq!(first.await.unwrap().unwrap(), "done");
    until_leases(&server, "layer", 0).await;
    assert_eq!(
        service.ready().await.unwrap().call(()).await.unwrap(),
        "done"
    );
    assert_eq!(layer.bulkhead().in_flight(), 0);
}

#[test]
fn bad_settings_are_refused_naming_the_field() {
    let client = redis::Client::open("redis://127.0.0.1:1/").unwrap();
    let refused = |ceiling: ClusterCeiling| {
        Bulkhead::try_new(Config::new(4, LONG).cluster_ceiling(ceiling))
            .unwrap_err()
            .field()
    };
    let ceiling = || ClusterCeiling::new(client.clone(), "db", 10);
    let named = |name: &str, limit| ClusterCeiling::new(client.clone(), name, limit);
    let refusals = [
        (named("", 10), "cluster_ceiling.name"),
        (named("a}b", 10), "cluster_ceiling.name"),
        (named("db", 0), "cluster_ceiling.limit"),
        (ceiling().lease(Duration::MAX), "cluster_ceiling.lease"),
        (
            ceiling().lease(Duration::from_micros(10)),
            "cluster_ceiling.lease",
        ),
        (ceiling().timeout(Duration::MAX), "cluster_ceiling.timeout"),
        (ceiling().timeout(Duration::ZERO), "cluster_ceiling.timeout"),
        (
            ceiling()
                .lease(Duration::from_millis(50))
                .timeout(Duration::from_millis(50)),
            "cluster_ceiling.timeout",
        ),
        (ceiling().backoff(Duration::MAX), "cluster_ceiling.backoff"),
        (ceiling().weight(0), "cluster_ceiling.weight"),
        (ceiling().weight(1_001), "cluster_ceiling.weight"),
        (
            ceiling().when_unreachable(WhenUnreachable::LocalLimit(0)),
            "cluster_ceiling.when_unreachable",
        ),
    ];
    for (ceiling, field) in refusals {
        assert_eq!(refused(ceiling), field);
    }
    // Built without a runtime or a server: the connection is made on first use.
    assert!(Bulkhead::try_new(Config::new(4, LONG).cluster_ceiling(ceiling())).is_ok());
    assert!(format!("{:?}", ceiling()).contains("\"db\""));
}

#[cfg(feature = "http")]
#[tokio::test]
async fn the_http_layer_answers_a_full_ceiling_with_503_and_retry_after() {
    use http::{Request, Response, StatusCode};
    use http_body_util::{BodyExt, Full};
    use tower_inflight::http::HttpConcurrencyLayer;

    let server = RedisServer::start();
    let ceiling = || ClusterCeiling::new(server.client(), "http", 1);
    let other = Bulkhead::new(Config::new(1, LONG).cluster_ceiling(ceiling()));
    let layer = HttpConcurrencyLayer::new(
        Config::new(4, LONG)
            .retry_after(Duration::from_secs(2))
            .cluster_ceiling(ceiling()),
    );
    let service = ServiceBuilder::new()
        .layer(layer.clone())
        .service(service_fn(|_: Request<_>| async {
            Ok::<_, BoxError>(Response::new(Full::new(bytes::Bytes::from("done"))))
        }));
    let request = || Request::new(Full::new(bytes::Bytes::new()));

    let response = service.clone().oneshot(request()).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    // The lease is held until the body ends.
    assert_eq!(
        response.into_body().collect().await.unwrap().to_bytes(),
        "done"
    );
    until_leases(&server, "http", 0).await;

    let held = other.acquire().await.unwrap();
    let response = service.clone().oneshot(request()).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["retry-after"], "2");
    assert_eq!(layer.bulkhead().in_flight(), 0);
    assert_eq!(layer.bulkhead().status().totals.rejected_cluster_limit, 1);
    drop(held);
}

/// Redis failing and answering again: one event each way, and the metrics.
#[cfg(feature = "metrics")]
#[tokio::test]
async fn an_unreachable_redis_is_reported_once_each_way() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use std::sync::{Arc, Mutex};
    use tower_inflight::Event;

    let mut server = RedisServer::start();
    let events = Arc::new(Mutex::new(Vec::new()));
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let bulkhead = metrics::with_local_recorder(&recorder, || {
        let events = events.clone();
        Bulkhead::new(
            Config::new(8, LONG)
                .name("flaky")
                .on_event(move |event| {
                    if let Event::ClusterReachable { reachable } = event {
                        events.lock().unwrap().push(*reachable);
                    }
                })
                .cluster_ceiling(
                    ClusterCeiling::new(server.client(), "flaky", 8).backoff(Duration::ZERO),
                ),
        )
    });
    drop(bulkhead.acquire().await.unwrap());
    server.stop();
    for _ in 0..3 {
        drop(bulkhead.acquire().await.unwrap()); // FailOpen
    }
    server.restart();
    let started = Instant::now();
    while !bulkhead.status().cluster.unwrap().reachable
        || bulkhead.status().cluster.unwrap().leases_granted < 2
    {
        drop(bulkhead.acquire().await.unwrap());
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never reached again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(*events.lock().unwrap(), [false, true]);

    // One snapshot: taking one resets what it read.
    let snapshot: Vec<(String, f64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let value = match value {
                DebugValue::Counter(n) => n as f64,
                DebugValue::Gauge(v) => v.into_inner(),
                DebugValue::Histogram(samples) => samples.len() as f64,
            };
            (key.key().name().to_owned(), value)
        })
        .collect();
    let metric = |name: &str| {
        snapshot
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| *value)
            .unwrap_or_else(|| panic!("no {name} in {snapshot:?}"))
    };
    let errors = metric("tower_inflight_cluster_errors_total");
    assert!(errors >= 3.0, "with no backoff, each call asked: {errors}");
    assert_eq!(metric("tower_inflight_cluster_reachable"), 1.0);
    assert_eq!(metric("tower_inflight_cluster_limit"), 8.0);
    assert!(metric("tower_inflight_cluster_round_trip_seconds") >= 2.0);
    assert_eq!(
        metric("tower_inflight_cluster_admitted_without_lease_total"),
        errors
    );
}

/// How many clients Redis sees connected (this one included).
async fn connected_clients(server: &RedisServer) -> usize {
    let mut connection = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let info: String = redis::cmd("INFO")
        .arg("clients")
        .query_async(&mut connection)
        .await
        .unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix("connected_clients:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// A ready service holds its slot and lease from `poll_ready`; called after
/// the lease may have run out (renewed or not), the call is shed: it never
/// runs on a lease another replica may hold by now.
#[tokio::test]
async fn a_ready_service_called_after_its_lease_ran_out_is_shed_not_run_over_the_ceiling() {
    let mut over = Vec::new();
    for renew in [false, true] {
        let server = RedisServer::start();
        let reclaim_after = Duration::from_millis(300); // the lease too
        let ceiling = |client| {
            ClusterCeiling::new(client, "ready", 1)
                .timeout(Duration::from_millis(50))
                .renew(renew)
        };
        let layer = ConcurrencyLayer::new(
            Config::new(4, reclaim_after).cluster_ceiling(ceiling(server.client())),
        );
        let other = Bulkhead::new(Config::new(4, LONG).cluster_ceiling(ceiling(server.client())));
        let mut service = ServiceBuilder::new()
            .layer(layer.clone())
            .service(service_fn(|_: ()| async { Ok::<_, BoxError>(()) }));
        // Ready: a local slot and the fleet's one lease, held until `call`.
        std::future::poll_fn(|cx| service.poll_ready(cx))
            .await
            .unwrap();
        assert_eq!(leases(&server, "ready").await, 1);

        // The connection idles past the lease (and its renewals, which stop
        // at `reclaim_after`): another replica takes it.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let _theirs = other.acquire().await.unwrap();

        let _mine = service.call(()); // the permit is made here
        let in_flight = (layer.bulkhead().in_flight(), other.in_flight());
        let in_redis = leases(&server, "ready").await;
        if in_flight.0 + in_flight.1 > 1 {
            over.push(format!(
                "renew {renew}: {} + {} calls in flight, {in_redis} lease in Redis, ceiling 1",
                in_flight.0, in_flight.1
            ));
        }
    }
    assert!(over.is_empty(), "{over:#?}");
}

/// A place under `LocalLimit` whose permit leaked comes back after
/// `reclaim_after`, as its local slot does.
#[tokio::test]
async fn a_leaked_permit_s_fallback_place_comes_back_with_its_slot() {
    let mut server = RedisServer::start();
    let reclaim_after = Duration::from_millis(200);
    let bulkhead = Bulkhead::new(
        Config::new(4, reclaim_after).cluster_ceiling(
            ClusterCeiling::new(server.client(), "fallback-leak", 10)
                .timeout(Duration::from_millis(50))
                .when_unreachable(WhenUnreachable::LocalLimit(1)),
        ),
    );
    server.stop();
    std::mem::forget(bulkhead.acquire().await.unwrap()); // under the fallback
    tokio::time::sleep(reclaim_after * 2).await;
    bulkhead.reset();
    assert_eq!(bulkhead.in_flight(), 0, "the local slot is back");
    let again = bulkhead.acquire().await;
    assert!(
        again.is_ok(),
        "shed with {:?}; fallback_held = {}",
        again.as_ref().err().map(ServiceSaturated::reason),
        bulkhead.status().cluster.unwrap().fallback_held
    );
}

/// The release task is started again in a later runtime when the first
/// one has gone: leases never pile up in Redis unreleased.
#[test]
fn releases_outlive_the_runtime_that_first_used_the_ceiling() {
    let server = RedisServer::start();
    let bulkhead = bulkhead(&server, "runtimes", 4, 2);
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    runtime().block_on(async {
        drop(bulkhead.acquire().await.unwrap());
        until_leases(&server, "runtimes", 0).await;
    });
    runtime().block_on(async {
        let mut outcomes = Vec::new();
        for _ in 0..4 {
            // One call at a time: never more than one in flight.
            outcomes.push(
                bulkhead
                    .acquire()
                    .await
                    .map(drop)
                    .map_err(|shed| shed.reason()),
            );
            tokio::time::sleep(Duration::from_millis(1100)).await; // past any backoff
        }
        let cluster = bulkhead.status().cluster.unwrap();
        assert_eq!(
            outcomes,
            [Ok(()), Ok(()), Ok(()), Ok(())],
            "leases left in Redis: {}; {cluster:?}",
            leases(&server, "runtimes").await
        );
    });
}

/// A dropped bulkhead's background task ends at once, and its connection
/// with it.
#[tokio::test]
async fn a_dropped_bulkhead_closes_its_redis_connection() {
    let server = RedisServer::start();
    assert_eq!(connected_clients(&server).await, 1);
    {
        let bulkhead = Bulkhead::new(
            Config::new(4, LONG)
                .cluster_ceiling(ClusterCeiling::new(server.client(), "gone", 4).renew(true)),
        );
        drop(bulkhead.acquire().await.unwrap());
        until_leases(&server, "gone", 0).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        connected_clients(&server).await,
        1,
        "the dropped bulkhead's connection is still open"
    );
}

/// `admitted_without_lease` counts the calls that may not wait and were
/// admitted, not those shed by the local limit.
#[tokio::test]
async fn admitted_without_lease_counts_only_calls_admitted() {
    let server = RedisServer::start();
    let bulkhead = bulkhead(&server, "count", 1, 10);
    let _held = bulkhead.try_acquire().unwrap();
    for _ in 0..10 {
        assert_eq!(reason(bulkhead.try_acquire()), ShedReason::LimitReached);
    }
    let cluster = bulkhead.status().cluster.unwrap();
    assert_eq!(cluster.admitted_without_lease, 1, "{cluster:?}");
}

/// A lease granted by a script whose reply came too late (the call timed
/// out), or whose acquire future was dropped mid-flight, is released once
/// Redis answers.
#[tokio::test]
async fn a_lease_granted_after_the_timeout_or_a_drop_is_released() {
    let server = RedisServer::start();
    let bulkhead = Bulkhead::new(
        Config::new(4, LONG).cluster_ceiling(
            ClusterCeiling::new(server.client(), "late", 4)
                .timeout(Duration::from_millis(100))
                .backoff(Duration::ZERO),
        ),
    );
    drop(bulkhead.acquire().await.unwrap()); // connected, script loaded
    until_leases(&server, "late", 0).await;

    server.freeze();
    let timed_out = bulkhead.acquire().await.unwrap(); // FailOpen after 100 ms
    let dropped = tokio::time::timeout(Duration::from_millis(30), bulkhead.acquire()).await;
    assert!(dropped.is_err());
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.thaw();
    until_leases(&server, "late", 0).await;
    assert_eq!(bulkhead.in_flight(), 1);
    drop(timed_out);
}

/// `close()` and `cancel_waiting()` turn away a caller waiting for the
/// ceiling (holding its local slot, asking again within its budget).
#[tokio::test]
async fn close_and_cancel_turn_away_a_caller_waiting_for_the_ceiling() {
    let server = RedisServer::start();
    let holder = bulkhead(&server, "close", 1, 1);
    let held = holder.acquire().await.unwrap();
    for close in [true, false] {
        let waiter = Bulkhead::new(
            Config::new(1, LONG)
                .wait(Duration::from_secs(5))
                .cluster_ceiling(ClusterCeiling::new(server.client(), "close", 1)),
        );
        let waiting = tokio::spawn({
            let waiter = waiter.clone();
            async move {
                waiter
                    .acquire()
                    .await
                    .map(drop)
                    .map_err(|shed| shed.reason())
            }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(waiter.in_flight(), 1, "asking Redis, holding its slot");
        if close {
            waiter.close();
        } else {
            waiter.cancel_waiting();
        }
        let started = Instant::now();
        let outcome = waiting.await.unwrap();
        let expected = if close {
            ShedReason::Closed
        } else {
            ShedReason::Cancelled
        };
        assert_eq!(
            outcome,
            Err(expected),
            "close: {close}; answered after {:?}",
            started.elapsed()
        );
    }
    drop(held);
}

/// `callers` callers each making `calls` calls one at a time, under a
/// ceiling of as many: how many were refused.
async fn refused_of_sequential_calls(server: &RedisServer, callers: usize, calls: usize) -> usize {
    let name = format!("sequential-{callers}");
    let bulkhead = bulkhead(server, &name, callers, callers);
    let callers: Vec<_> = (0..callers)
        .map(|_| tokio::spawn(refused_of(bulkhead.clone(), calls)))
        .collect();
    let mut refused = 0;
    for caller in callers {
        refused += caller.await.unwrap();
    }
    refused
}

async fn refused_of(bulkhead: Bulkhead, calls: usize) -> usize {
    let mut refused = 0;
    for _ in 0..calls {
        match bulkhead.acquire().await {
            Ok(permit) => drop(permit),
            Err(shed) => {
                assert_eq!(
                    shed.reason(),
                    ShedReason::ClusterLimit,
                    "in flight {}, {:?}",
                    bulkhead.in_flight(),
                    bulkhead.status()
                );
                refused += 1;
            }
        }
    }
    refused
}

/// Every lease request carries the newest releases pending, whoever's they
/// are: callers making one call at a time, never more than the ceiling in
/// all, are never refused for their own last lease, on any thread.
#[tokio::test]
async fn one_caller_one_call_at_a_time_is_never_shed_by_its_own_lease() {
    let server = RedisServer::start();
    assert_eq!(refused_of_sequential_calls(&server, 1, 500).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_one_call_at_a_time_are_never_shed_by_their_own_leases_on_many_threads() {
    let server = RedisServer::start();
    assert_eq!(refused_of_sequential_calls(&server, 1, 3_000).await, 0);
    assert_eq!(refused_of_sequential_calls(&server, 2, 2_000).await, 0);
}

/// Polls `future` once, then drops it: a caller that gives up (a client
/// gone, a `timeout`, a `select!`).
async fn poll_once_then_drop<F: std::future::Future>(future: F) {
    let mut future = Box::pin(future);
    std::future::poll_fn(|cx| {
        let _ = future.as_mut().poll(cx);
        std::task::Poll::Ready(())
    })
    .await;
}

/// An ask carries the releases queued; abandoned before its answer, it
/// queues them again.
#[tokio::test]
async fn a_release_carried_by_an_abandoned_ask_is_sent_again() {
    let server = RedisServer::start();
    let bulkhead = bulkhead(&server, "carried", 4, 1);
    drop(bulkhead.acquire().await.unwrap()); // its release queued
    poll_once_then_drop(bulkhead.acquire()).await; // carried, then abandoned
    until_leases(&server, "carried", 0).await;
    assert!(bulkhead.acquire().await.is_ok());
}

/// The same when the ask is turned away by `close()`, mid-ask.
#[tokio::test]
async fn a_release_carried_by_an_ask_turned_away_by_close_is_sent_again() {
    let server = RedisServer::start();
    let (closing, other) = (
        bulkhead(&server, "closed", 4, 1),
        bulkhead(&server, "closed", 4, 1),
    );
    drop(closing.acquire().await.unwrap());
    let asking = tokio::spawn({
        let closing = closing.clone();
        async move {
            closing
                .acquire()
                .await
                .map(drop)
                .map_err(|shed| shed.reason())
        }
    });
    closing.close();
    let outcome = asking.await.unwrap();
    assert!(
        outcome.is_ok() || outcome == Err(ShedReason::Closed),
        "{outcome:?}"
    );
    until_leases(&server, "closed", 0).await;
    assert!(other.acquire().await.is_ok());
}

/// A permit that outlives its bulkhead (a configuration reloaded), or the
/// last permit dropped just before its bulkhead: the release is still sent.
#[tokio::test]
async fn releases_queued_as_the_bulkhead_goes_are_still_sent() {
    let server = RedisServer::start();
    let outlived = bulkhead(&server, "gone-first", 4, 1);
    let permit = outlived.acquire().await.unwrap();
    drop(outlived);
    drop(permit);
    until_leases(&server, "gone-first", 0).await;

    let graceful = bulkhead(&server, "gone-last", 4, 1);
    let permit = graceful.acquire().await.unwrap();
    drop(permit);
    drop(graceful);
    until_leases(&server, "gone-last", 0).await;
}

/// The connection is made again in a later runtime when the one that made
/// it has shut down: the first call there gets a lease, not an error.
#[test]
fn the_connection_is_made_again_in_a_later_runtime() {
    let server = RedisServer::start();
    let bulkhead = Bulkhead::new(
        Config::new(4, LONG).cluster_ceiling(
            ClusterCeiling::new(server.client(), "runtimes-closed", 2)
                .when_unreachable(WhenUnreachable::FailClosed),
        ),
    );
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    runtime().block_on(async { drop(bulkhead.acquire().await.unwrap()) });
    runtime().block_on(async {
        drop(bulkhead.acquire().await.unwrap());
        let cluster = bulkhead.status().cluster.unwrap();
        assert_eq!((cluster.leases_granted, cluster.errors), (2, 0));
        until_leases(&server, "runtimes-closed", 0).await;
    });
}

/// A ready grant under `LocalLimit(1)` called after `reclaim_after`: its
/// place was taken back, so the call is shed, never run beside the next
/// holder of that place.
#[tokio::test]
async fn a_ready_grant_whose_fallback_place_was_taken_back_is_shed() {
    let mut server = RedisServer::start();
    let reclaim_after = Duration::from_millis(200);
    let layer = ConcurrencyLayer::new(
        Config::new(4, reclaim_after).cluster_ceiling(
            ClusterCeiling::new(server.client(), "late-place", 10)
                .timeout(Duration::from_millis(50))
                .backoff(Duration::from_secs(60))
                .when_unreachable(WhenUnreachable::LocalLimit(1)),
        ),
    );
    server.stop();
    let mut service = ServiceBuilder::new()
        .layer(layer.clone())
        .service(service_fn(|_: ()| async { Ok::<_, BoxError>(()) }));
    std::future::poll_fn(|cx| service.poll_ready(cx))
        .await
        .unwrap();
    assert_eq!(layer.bulkhead().status().cluster.unwrap().fallback_held, 1);
    tokio::time::sleep(reclaim_after * 2).await;
    let late = service.call(()).await.unwrap_err();
    assert_eq!(
        late.downcast_ref::<ServiceSaturated>().unwrap().reason(),
        ShedReason::ClusterLimit
    );
    let next = layer.bulkhead().acquire().await.unwrap();
    assert_eq!(layer.bulkhead().in_flight(), 1);
    assert_eq!(layer.bulkhead().status().cluster.unwrap().fallback_held, 1);
    drop(next);
}

/// A release whose `ZREM` fails (the server closed the connection) is sent
/// again after a backoff, with nothing else happening; the failure counts.
#[tokio::test]
async fn a_failed_release_is_sent_again_after_a_backoff() {
    let server = RedisServer::start();
    let bulkhead = Bulkhead::new(Config::new(4, LONG).cluster_ceiling(
        ClusterCeiling::new(server.client(), "put-back", 1).backoff(Duration::from_millis(200)),
    ));
    let permit = bulkhead.acquire().await.unwrap();
    let mut admin = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("SKIPME")
        .arg("yes")
        .query_async(&mut admin)
        .await
        .unwrap();
    drop(permit);
    until_leases(&server, "put-back", 0).await;
    support::eventually("the release answered", || {
        let cluster = bulkhead.status().cluster.unwrap();
        cluster.leases_released + cluster.releases_lost >= 1
    })
    .await;
    let cluster = bulkhead.status().cluster.unwrap();
    assert_eq!((cluster.leases_released, cluster.releases_lost), (1, 0));
    assert!(cluster.errors >= 1, "the first ZREM failed: {cluster:?}");
}

/// A keyed bulkhead on each of two replicas, their ceilings on one fleet
/// ceiling: a call takes its key's slot, the local ceiling's and a lease,
/// all or none.
fn keyed_replica(
    server: &RedisServer,
    per_key: usize,
    local: usize,
    fleet: usize,
) -> KeyedBulkhead<&'static str> {
    KeyedBulkhead::new(KeyedConfig::new(Config::new(per_key, LONG)).ceiling(
        Config::new(local, LONG).cluster_ceiling(ClusterCeiling::new(
            server.client(),
            "tenants",
            fleet,
        )),
    ))
}

fn key_in_flight(keyed: &KeyedBulkhead<&'static str>, key: &str) -> usize {
    keyed
        .status(16)
        .busiest
        .iter()
        .find(|status| status.key == key)
        .map_or(0, |status| status.in_flight)
}

#[tokio::test]
async fn keyed_bulkheads_on_two_replicas_share_one_fleet_ceiling() {
    let server = RedisServer::start();
    let (a, b) = (
        keyed_replica(&server, 3, 4, 5),
        keyed_replica(&server, 3, 4, 5),
    );
    let mut held = Vec::new();
    for key in ["x", "x", "x", "y"] {
        held.push(a.acquire(&key).await.unwrap());
    }
    assert_eq!(reason(a.acquire(&"z").await), ShedReason::LimitReached);
    held.push(b.acquire(&"x").await.unwrap());
    assert_eq!(leases(&server, "tenants").await, 5);

    // B's key `y` and its local ceiling have room; the fleet has none.
    assert_eq!(reason(b.acquire(&"y").await), ShedReason::ClusterLimit);
    assert_eq!(key_in_flight(&b, "y"), 0, "the key's slot was given back");
    assert_eq!(b.ceiling().unwrap().in_flight(), 1);

    // A lease given back on A is taken on B.
    drop(held.remove(0));
    until_leases(&server, "tenants", 4).await;
    held.push(b.acquire(&"y").await.unwrap());
    assert_eq!(key_in_flight(&b, "y"), 1);
    assert_eq!(leases(&server, "tenants").await, 5);

    drop(held);
    until_leases(&server, "tenants", 0).await;
    for keyed in [&a, &b] {
        assert_eq!(keyed.ceiling().unwrap().in_flight(), 0);
        assert!(keyed.status(16).busiest.is_empty());
    }
}

#[tokio::test]
async fn the_keyed_layer_takes_a_lease_per_call_without_a_wait_budget() {
    let server = RedisServer::start();
    let layer = KeyedConcurrencyLayer::new(
        KeyedConfig::new(Config::new(4, LONG)).ceiling(
            Config::new(4, LONG).cluster_ceiling(ClusterCeiling::new(
                server.client(),
                "keyed-layer",
                1,
            )),
        ),
        |tenant: &&'static str| *tenant,
    );
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let released = std::sync::Arc::new(std::sync::Mutex::new(Some(released)));
    let mut service = ServiceBuilder::new()
        .layer(layer.clone())
        .service(service_fn(move |_: &'static str| {
            let gate = released.lock().unwrap().take();
            async move {
                if let Some(gate) = gate {
                    let _ = gate.await;
                }
                Ok::<_, BoxError>("done")
            }
        }));
    let first = tokio::spawn(service.ready().await.unwrap().call("a"));
    until_leases(&server, "keyed-layer", 1).await;

    // Another tenant, with its own key's slot and the local ceiling's free:
    // the fleet's one lease is taken.
    let error = service.ready().await.unwrap().call("b").await.unwrap_err();
    let shed = error.downcast_ref::<ServiceSaturated>().unwrap();
    assert_eq!(shed.reason(), ShedReason::ClusterLimit);
    assert_eq!(leases(&server, "keyed-layer").await, 1);

    release.send(()).unwrap();
    assert_eq!(first.await.unwrap().unwrap(), "done");
    until_leases(&server, "keyed-layer", 0).await;
    assert_eq!(
        service.ready().await.unwrap().call("b").await.unwrap(),
        "done"
    );
    assert_eq!(layer.bulkhead().ceiling().unwrap().in_flight(), 0);
}

#[tokio::test]
async fn a_keyed_call_refused_by_an_unreachable_fleet_ceiling_gives_its_key_slot_back_uncounted() {
    let mut server = RedisServer::start();
    let keyed = KeyedBulkhead::new(
        KeyedConfig::new(Config::new(2, LONG).wait(Duration::from_millis(50))).ceiling(
            Config::new(4, LONG)
                .wait(Duration::from_millis(50))
                .cluster_ceiling(
                    ClusterCeiling::new(server.client(), "unreachable", 4)
                        .when_unreachable(WhenUnreachable::FailClosed),
                ),
        ),
    );
    let held = keyed.acquire(&"a").await.unwrap();
    server.stop();
    assert_eq!(
        reason(keyed.acquire(&"a").await),
        ShedReason::ClusterUnavailable
    );
    // The refused call's key slot went back, counted neither admitted nor
    // held; the first call's is still held.
    let status = keyed.status(4);
    let a = status.busiest.iter().find(|key| key.key == "a").unwrap();
    assert_eq!((a.in_flight, a.totals.admitted), (1, 1));
    let ceiling = keyed.ceiling().unwrap();
    assert_eq!(ceiling.in_flight(), 1);
    assert_eq!(ceiling.status().totals.rejected_cluster_unavailable, 1);
    drop(held);
    assert_eq!((key_in_flight(&keyed, "a"), ceiling.in_flight()), (0, 0));
}

/// An adaptive limit is each process's own; the ceiling still caps the
/// fleet, however far the adaptive limits grow.
#[tokio::test]
async fn adaptive_limits_move_per_process_under_the_fleet_s_ceiling() {
    use tower_inflight::adaptive::{Adaptive, Aimd, Outcome};
    let server = RedisServer::start();
    let adaptive = || {
        Bulkhead::new(
            Config::new(10, LONG)
                .adaptive(Adaptive::new(Aimd::default()).initial(3))
                .cluster_ceiling(ClusterCeiling::new(server.client(), "adaptive", 4)),
        )
    };
    let (a, b) = (adaptive(), adaptive());
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(a.acquire().await.unwrap());
    }
    // A's own limit, 3, is reached before the fleet's.
    assert_eq!(reason(a.acquire().await), ShedReason::LimitReached);
    held.push(b.acquire().await.unwrap());
    assert_eq!(reason(b.acquire().await), ShedReason::ClusterLimit);

    // A's calls go well: its limit grows past the ceiling's free room...
    for permit in &mut held[..3] {
        permit.record(Outcome::Success);
    }
    assert_eq!(a.limit(), 5);
    // ... and the fleet still holds no more than 4.
    assert_eq!(reason(a.acquire().await), ShedReason::ClusterLimit);
    assert_eq!(leases(&server, "adaptive").await, 4);
    drop(held);
    until_leases(&server, "adaptive", 0).await;
}
