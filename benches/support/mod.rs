//! What the benches share: the always-ready inner service and criterion's
//! settings (short, for a 2-core machine).

// Each bench uses its own part of this module.
#![allow(dead_code)]

use criterion::Criterion;
use std::convert::Infallible;
use std::future::{ready, Ready};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tower::{Service, ServiceExt};

/// The inner service: always ready, answers with its request at once, so
/// that what is measured is the layer's own overhead.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Echo;

impl Service<u64> for Echo {
    type Response = u64;
    type Error = Infallible;
    type Future = Ready<Result<u64, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: u64) -> Self::Future {
        ready(Ok(request))
    }
}

/// A `ready` + `call` round trip through `service` (the inner service is
/// always ready and the limit never reached in these benches).
pub(crate) async fn round_trip<S>(service: &mut S, request: u64) -> u64
where
    S: Service<u64, Response = u64>,
    S::Error: std::fmt::Debug,
{
    service
        .ready()
        .await
        .expect("the inner service is always ready")
        .call(request)
        .await
        .expect("the limit is never reached")
}

/// Criterion with one second of warm-up, `measurement` of measuring and 30
/// samples, and the command line's options on top.
pub(crate) fn criterion(measurement: Duration) -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(measurement)
        .sample_size(30)
        .configure_from_args()
}

/// One variant of an interleaved measurement: `turn(n)` makes `n` calls.
pub(crate) type Turn<'a> = &'a dyn Fn(u64);

/// A turn that makes each of its calls with `call` (inlined into the loop).
pub(crate) fn each(call: impl Fn()) -> impl Fn(u64) {
    move |calls| {
        for _ in 0..calls {
            call();
        }
    }
}

/// Times `turns[mine]` only, running every turn in order, 1,000 calls each,
/// until `iters` of its own calls are done: a criterion `iter_custom` body.
///
/// On a shared machine the speed of every variant drifts within a run and
/// between runs; measured one after the other, a variant's luck becomes its
/// ratio. Taking turns, every variant meets the same drift, and the ratio
/// between them holds still while the nanoseconds move. Each turn loops
/// itself, so no indirect call per call is measured.
pub(crate) fn interleaved(iters: u64, turns: &[Turn<'_>], mine: usize) -> Duration {
    const TURN: u64 = 1_000;
    let mut timed = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let calls = left.min(TURN);
        for (index, turn) in turns.iter().enumerate() {
            let start = Instant::now();
            turn(calls);
            if index == mine {
                timed += start.elapsed();
            }
        }
        left -= calls;
    }
    timed
}
