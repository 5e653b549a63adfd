//! What the cluster ceiling costs, against a real `redis-server` on
//! loopback started for the run (see `tests/support/redis_server.rs`):
//!
//! * `round_trip/redis_ping`: a `PING` on the same kind of connection (a
//!   `ConnectionManager`): the floor any lease pays.
//! * `round_trip/acquire_release`: `acquire()` through a bulkhead with a
//!   cluster ceiling (one script: remove the releases carried, count, look
//!   for replicas waiting, add, count one more for the replica), then the
//!   permit dropped (its release carried by the next request).
//! * `round_trip/acquire_release_32_waiting`: the same while 32 replicas
//!   wait, each holding a lease: the script finds none of them ahead of
//!   the one asking (which holds none once its release is carried).
//! * `round_trip/acquire_refused`: `acquire()` on a full ceiling, without a
//!   wait budget: one script that refuses (the mark of a waiting replica
//!   written once, then left), and the call shed.
//! * `local_shed/cluster_ceiling`: `acquire()` on a bulkhead whose own slot
//!   is held: shed by the local limit, with no round trip. Beside it,
//!   `local_shed/no_ceiling`, the same bulkhead without a ceiling.
//!
//! Run with `cargo bench --features redis --bench cluster` (needs
//! `redis-server` on `PATH`).

use criterion::{black_box, criterion_main, Criterion};
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;
use tower_inflight::redis::ClusterCeiling;
use tower_inflight::{Bulkhead, Config, ShedReason};

#[path = "../tests/support/redis_server.rs"]
#[allow(dead_code)] // the tests' helper: the bench uses part of it
mod redis_server;
mod support;

const RECLAIM_AFTER: Duration = Duration::from_secs(60);

/// Runs `iters` of `step` inside one `block_on`, so that entering the
/// runtime is not measured.
fn timed<F: std::future::Future<Output = ()>>(
    runtime: &Runtime,
    iters: u64,
    mut step: impl FnMut() -> F,
) -> Duration {
    runtime.block_on(async {
        let started = Instant::now();
        for _ in 0..iters {
            step().await;
        }
        started.elapsed()
    })
}

fn round_trip(c: &mut Criterion, runtime: &Runtime, server: &redis_server::RedisServer) {
    let mut group = c.benchmark_group("round_trip");
    let connection = runtime.block_on(async {
        redis::aio::ConnectionManager::new(server.client())
            .await
            .unwrap()
    });
    group.bench_function("redis_ping", |b| {
        b.iter_custom(|iters| {
            timed(runtime, iters, || {
                let mut connection = connection.clone();
                async move {
                    let pong: String = redis::cmd("PING")
                        .query_async(&mut connection)
                        .await
                        .unwrap();
                    black_box(pong);
                }
            })
        })
    });

    let bulkhead = Bulkhead::new(
        Config::new(1_024, RECLAIM_AFTER).cluster_ceiling(ClusterCeiling::new(
            server.client(),
            "bench",
            1_000_000,
        )),
    );
    group.bench_function("acquire_release", |b| {
        b.iter_custom(|iters| {
            timed(runtime, iters, || {
                let bulkhead = &bulkhead;
                async move {
                    let permit = bulkhead.acquire().await.expect("a lease");
                    drop(black_box(permit));
                }
            })
        })
    });

    // 32 replicas waiting, each holding a lease, written as the script
    // keeps them (see src/redis/script.rs): a count of one, a place in line
    // of one lease for a weight of one, a window that ends in a far future.
    let crowded = Bulkhead::new(Config::new(1_024, RECLAIM_AFTER).cluster_ceiling(
        ClusterCeiling::new(server.client(), "bench-crowded", 1_000_000),
    ));
    let key = ClusterCeiling::new(server.client(), "bench-crowded", 1).key();
    runtime.block_on(async {
        let mut connection = connection.clone();
        for n in 0..32u64 {
            let replica = format!("{n:016x}");
            let _: () = redis::pipe()
                .cmd("ZADD")
                .arg(&key)
                .arg(-1)
                .arg(format!("h:{replica}"))
                .arg(1 - (1i64 << 41))
                .arg(format!("w:{replica}"))
                .arg((1i64 << 50) - (1i64 << 52))
                .arg(format!("u:{replica}"))
                .query_async(&mut connection)
                .await
                .unwrap();
        }
    });
    group.bench_function("acquire_release_32_waiting", |b| {
        b.iter_custom(|iters| {
            timed(runtime, iters, || {
                let crowded = &crowded;
                async move {
                    let permit = crowded.acquire().await.expect("a lease");
                    drop(black_box(permit));
                }
            })
        })
    });
    let waiting: usize = runtime.block_on(async {
        let mut connection = connection.clone();
        redis::cmd("ZCOUNT")
            .arg(&key)
            .arg("-inf")
            .arg("(-2251799813685248")
            .query_async(&mut connection)
            .await
            .unwrap()
    });
    assert_eq!(waiting, 32, "the waiting replicas stayed");

    let full = || {
        Bulkhead::new(
            Config::new(1, RECLAIM_AFTER).cluster_ceiling(ClusterCeiling::new(
                server.client(),
                "bench-full",
                1,
            )),
        )
    };
    let (holder, refused) = (full(), full());
    let _held = runtime.block_on(holder.acquire()).expect("a lease");
    group.bench_function("acquire_refused", |b| {
        b.iter_custom(|iters| {
            timed(runtime, iters, || {
                let refused = &refused;
                async move {
                    let shed = refused.acquire().await.map(drop).unwrap_err();
                    assert_eq!(black_box(shed).reason(), ShedReason::ClusterLimit);
                }
            })
        })
    });
    group.finish();
    for bulkhead in [&bulkhead, &crowded, &refused] {
        let cluster = bulkhead.status().cluster.unwrap();
        assert_eq!(cluster.errors, 0, "every answer came from Redis");
        assert_eq!(cluster.admitted_without_lease, 0);
    }
}

fn local_shed(c: &mut Criterion, runtime: &Runtime, server: &redis_server::RedisServer) {
    let mut group = c.benchmark_group("local_shed");
    let with = Bulkhead::new(
        Config::new(1, RECLAIM_AFTER).cluster_ceiling(ClusterCeiling::new(
            server.client(),
            "bench-shed",
            10,
        )),
    );
    let without = Bulkhead::new(Config::new(1, RECLAIM_AFTER));
    let _held = runtime.block_on(async { (with.acquire().await, without.acquire().await) });
    for (name, bulkhead) in [("cluster_ceiling", &with), ("no_ceiling", &without)] {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                timed(runtime, iters, || async {
                    let shed = bulkhead.acquire().await;
                    black_box(shed.is_err());
                })
            })
        });
    }
    group.finish();
    let cluster = with.status().cluster.unwrap();
    assert_eq!(
        (
            cluster.leases_granted,
            cluster.leases_refused,
            cluster.errors
        ),
        (1, 0, 0),
        "the sheds never asked Redis"
    );
}

// What `criterion_group!` expands to, written out because the macro's
// `pub fn` trips the crate's `missing_docs` lint.
fn benches() {
    let server = redis_server::RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut criterion = support::criterion(Duration::from_secs(2));
    round_trip(&mut criterion, &runtime, &server);
    local_shed(&mut criterion, &runtime, &server);
}

criterion_main!(benches);
