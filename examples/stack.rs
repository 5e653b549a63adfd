//! The whole stack of README.md's "Where it goes in a stack", with tower's
//! retry, buffer, rate limit and timeout and tower-resilience's circuit
//! breaker, outermost first:
//!
//! ```text
//! retry → buffer → rate limit → concurrency → circuit breaker → timeout → dependency
//! ```
//!
//! Two scenes, a couple of seconds in all: (a) 20 callers on a limit of 2
//! against a slow but healthy dependency: most calls are shed and reach the
//! top as `ServiceSaturated`, none of them reaches the breaker, which stays
//! closed; (b) the dependency fails: the breaker opens. It exits non-zero if
//! either does not hold, so CI runs it.
//!
//! ```text
//! cargo run --example stack
//! ```
//!
//! The `Buffer` is there because tower's `Retry` needs a `Clone` service and
//! `RateLimit` is not one. Behind the buffer the bulkhead has no `wait`
//! budget: its `poll_ready` would wait in the buffer's one worker, so waiting
//! callers would go one at a time, each waiting up to several budgets. Built
//! with `.classify(...)` it waits in each caller's response future instead.
//! tests/stack.rs shows both, and the bulkhead outside the buffer.

use std::fmt;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower::retry::Policy;
use tower::util::BoxCloneService;
use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};
use tower_inflight::{Bulkhead, ConcurrencyLayer, Config, ServiceSaturated};
use tower_resilience_circuitbreaker::{
    CircuitBreakerError, CircuitBreakerHandle, CircuitBreakerLayer, CircuitState, DefaultClassifier,
};

/// Slots in the bulkhead.
const LIMIT: usize = 2;
/// Callers, each offering a call every `PACE`.
const CALLERS: u32 = 20;
const PACE: Duration = Duration::from_millis(50);
/// How long each scene offers its load.
const SCENE: Duration = Duration::from_millis(1000);
/// A healthy dependency's time per call; a failing one fails after `FAILS_AFTER`.
const SLOW: Duration = Duration::from_millis(100);
const FAILS_AFTER: Duration = Duration::from_millis(10);
const TIMEOUT: Duration = Duration::from_secs(1);
/// Retries of a failure of the dependency, `BACKOFF` apart.
const RETRIES: u32 = 2;
const BACKOFF: Duration = Duration::from_millis(100);
/// The breaker opens after this many failures in a row.
const BREAKER_FAILURES: usize = 5;
/// The rate limiter's quota: generous here, it is not what this shows.
const RATE: (u64, Duration) = (100, Duration::from_millis(100));

const HELP: &str = "\
The whole stack, retry → buffer → rate limit → concurrency → circuit breaker →
timeout → dependency, in two scenes: saturation never opens the breaker, a
failing dependency does. Exits non-zero if either does not hold.

usage: cargo run --example stack [-- --help]";

/// The dependency's failure: worth another attempt.
#[derive(Debug)]
struct DependencyFailed;

impl fmt::Display for DependencyFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the dependency failed")
    }
}

impl std::error::Error for DependencyFailed {}

/// Retries the dependency's failures; never `ServiceSaturated` (the call
/// never started, and too much is in flight already), nor an open breaker.
#[derive(Clone, Debug)]
struct RetryFailures {
    retries_left: u32,
}

impl<Res> Policy<u32, Res, BoxError> for RetryFailures {
    type Future = tokio::time::Sleep;

    fn retry(&mut self, _: &mut u32, result: &mut Result<Res, BoxError>) -> Option<Self::Future> {
        let error = result.as_ref().err()?;
        if error.is::<ServiceSaturated>() || !error.is::<DependencyFailed>() {
            return None;
        }
        if self.retries_left == 0 {
            return None;
        }
        self.retries_left -= 1;
        Some(tokio::time::sleep(BACKOFF))
    }

    fn clone_request(&mut self, request: &u32) -> Option<u32> {
        Some(*request)
    }
}

/// What the dependency and the breaker saw.
#[derive(Default)]
struct Seen {
    healthy: AtomicBool,
    dependency_calls: AtomicU32,
    inside: AtomicU32,
    peak_inside: AtomicU32,
    breaker_permitted: AtomicU32,
    breaker_succeeded: AtomicU32,
    breaker_failed: AtomicU32,
    breaker_refused: AtomicU32,
}

/// Counters read at the start and end of a scene.
#[derive(Clone, Copy, Debug, Default)]
struct Snapshot {
    dependency_calls: u32,
    breaker_permitted: u32,
    breaker_succeeded: u32,
    breaker_failed: u32,
    breaker_refused: u32,
}

impl Seen {
    fn snapshot(&self) -> Snapshot {
        Snapshot {
            dependency_calls: self.dependency_calls.load(Ordering::SeqCst),
            breaker_permitted: self.breaker_permitted.load(Ordering::SeqCst),
            breaker_succeeded: self.breaker_succeeded.load(Ordering::SeqCst),
            breaker_failed: self.breaker_failed.load(Ordering::SeqCst),
            breaker_refused: self.breaker_refused.load(Ordering::SeqCst),
        }
    }
}

impl std::ops::Sub for Snapshot {
    type Output = Snapshot;

    fn sub(self, before: Snapshot) -> Snapshot {
        Snapshot {
            dependency_calls: self.dependency_calls - before.dependency_calls,
            breaker_permitted: self.breaker_permitted - before.breaker_permitted,
            breaker_succeeded: self.breaker_succeeded - before.breaker_succeeded,
            breaker_failed: self.breaker_failed - before.breaker_failed,
            breaker_refused: self.breaker_refused - before.breaker_refused,
        }
    }
}

/// The breaker's errors, flattened: the dependency's own error (or the
/// timeout's) comes out as it went in, so that the top can downcast it.
fn flatten(error: CircuitBreakerError<BoxError>) -> BoxError {
    match error {
        CircuitBreakerError::Inner(error) => error,
        open => open.into(),
    }
}

struct Stack {
    service: BoxCloneService<u32, u32, BoxError>,
    bulkhead: Bulkhead,
    breaker: CircuitBreakerHandle<DefaultClassifier>,
    seen: Arc<Seen>,
}

fn stack() -> Stack {
    let seen = Arc::new(Seen::default());
    seen.healthy.store(true, Ordering::SeqCst);
    let (breaker, handle) = {
        let (permitted, succeeded, failed, refused) =
            (seen.clone(), seen.clone(), seen.clone(), seen.clone());
        CircuitBreakerLayer::builder()
            .name("dependency")
            .consecutive_failures(BREAKER_FAILURES)
            .wait_duration_in_open(Duration::from_secs(30))
            .on_call_permitted(move |_| {
                permitted.breaker_permitted.fetch_add(1, Ordering::SeqCst);
            })
            .on_success(move |_| {
                succeeded.breaker_succeeded.fetch_add(1, Ordering::SeqCst);
            })
            .on_failure(move |_| {
                failed.breaker_failed.fetch_add(1, Ordering::SeqCst);
            })
            .on_call_rejected(move || {
                refused.breaker_refused.fetch_add(1, Ordering::SeqCst);
            })
            .build_with_handle()
            .expect("a valid breaker")
    };
    let concurrency =
        ConcurrencyLayer::new(Config::new(LIMIT, Duration::from_secs(30)).name("dependency"));
    let bulkhead = concurrency.bulkhead();
    let dependency = {
        let seen = seen.clone();
        service_fn(move |call: u32| {
            let seen = seen.clone();
            async move {
                seen.dependency_calls.fetch_add(1, Ordering::SeqCst);
                let inside = seen.inside.fetch_add(1, Ordering::SeqCst) + 1;
                seen.peak_inside.fetch_max(inside, Ordering::SeqCst);
                let healthy = seen.healthy.load(Ordering::SeqCst);
                tokio::time::sleep(if healthy { SLOW } else { FAILS_AFTER }).await;
                seen.inside.fetch_sub(1, Ordering::SeqCst);
                if healthy {
                    Ok(call)
                } else {
                    Err(BoxError::from(DependencyFailed))
                }
            }
        })
    };
    let service = ServiceBuilder::new()
        .retry(RetryFailures {
            retries_left: RETRIES,
        })
        .buffer(1024)
        .rate_limit(RATE.0, RATE.1)
        .layer(concurrency)
        .map_err(flatten)
        .layer(breaker)
        .timeout(TIMEOUT)
        .service(dependency);
    Stack {
        service: BoxCloneService::new(service),
        bulkhead,
        breaker: handle,
        seen,
    }
}

/// How the calls of a scene ended, at the top of the stack.
#[derive(Debug, Default)]
struct Outcomes {
    served: u32,
    shed: u32,
    failed: u32,
    breaker_open: u32,
    other: u32,
    retry_after: Option<Duration>,
}

impl Outcomes {
    fn add(&mut self, outcome: Result<u32, BoxError>) {
        let error = match outcome {
            Ok(_) => return self.served += 1,
            Err(error) => error,
        };
        if let Some(shed) = error.downcast_ref::<ServiceSaturated>() {
            self.shed += 1;
            self.retry_after = Some(shed.retry_after());
        } else if error.is::<DependencyFailed>() {
            self.failed += 1;
        } else if error
            .downcast_ref::<CircuitBreakerError<BoxError>>()
            .is_some_and(CircuitBreakerError::is_circuit_open)
        {
            self.breaker_open += 1;
        } else {
            println!("    unexpected error: {error}");
            self.other += 1;
        }
    }
}

/// `CALLERS` callers, each offering a call every `PACE` for `SCENE`.
async fn offer_load(stack: &Stack) -> Outcomes {
    let callers: Vec<_> = (0..CALLERS)
        .map(|caller| {
            let service = stack.service.clone();
            tokio::spawn(async move {
                // Spread over the first `PACE`, as independent callers are.
                tokio::time::sleep(PACE * caller / CALLERS).await;
                let mut outcomes = Vec::new();
                let mut pace = tokio::time::interval(PACE);
                pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let end = tokio::time::Instant::now() + SCENE;
                let mut call = caller * 1000;
                while tokio::time::Instant::now() < end {
                    pace.tick().await;
                    outcomes.push(service.clone().oneshot(call).await);
                    call += 1;
                }
                outcomes
            })
        })
        .collect();
    let mut outcomes = Outcomes::default();
    for caller in callers {
        for outcome in caller.await.expect("a caller's task") {
            outcomes.add(outcome);
        }
    }
    outcomes
}

fn row(what: &str, n: impl fmt::Display) {
    println!("    {what:<44} {n:>5}");
}

/// Prints a check, and whether it held.
fn check(failures: &mut Vec<String>, holds: bool, what: &str) {
    println!("    [{}] {what}", if holds { "ok" } else { "FAILED" });
    if !holds {
        failures.push(what.to_owned());
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match std::env::args().nth(1).as_deref() {
        None => {}
        Some("-h" | "--help") => {
            println!("{HELP}");
            return ExitCode::SUCCESS;
        }
        Some(other) => {
            eprintln!("unknown option {other} (see --help)");
            return ExitCode::from(2);
        }
    }
    let stack = stack();
    let mut failures = Vec::new();
    println!("the stack, outermost first:");
    println!(
        "  retry ({RETRIES} retries, {BACKOFF:?} apart) → buffer → rate limit ({} per {:?})",
        RATE.0, RATE.1
    );
    println!(
        "  → concurrency (limit {LIMIT}) → circuit breaker (opens after {BREAKER_FAILURES} failures in a row)"
    );
    println!("  → timeout ({TIMEOUT:?}) → dependency");

    println!(
        "\n(a) {CALLERS} callers, a call every {PACE:?} each, on a limit of {LIMIT}; \
         the dependency is slow ({SLOW:?} a call) but healthy"
    );
    let before = stack.seen.snapshot();
    let outcomes = offer_load(&stack).await;
    let seen = stack.seen.snapshot() - before;
    let peak = stack.seen.peak_inside.load(Ordering::SeqCst);
    let shed_by_bulkhead = stack.bulkhead.status().totals.rejected();
    row("served", outcomes.served);
    row("shed, ServiceSaturated at the top", outcomes.shed);
    let other_errors = outcomes.failed + outcomes.breaker_open + outcomes.other;
    row("other errors", other_errors);
    row("most calls inside the dependency at once", peak);
    row("calls the breaker let through", seen.breaker_permitted);
    row("  of which it recorded as failures", seen.breaker_failed);
    println!("    breaker: {:?}", stack.breaker.state());
    if let Some(retry_after) = outcomes.retry_after {
        println!("    (each shed is not retried: it says retry after {retry_after:?})");
    }
    check(
        &mut failures,
        outcomes.shed > outcomes.served,
        "most calls were shed, with ServiceSaturated",
    );
    check(
        &mut failures,
        u64::from(outcomes.shed) == shed_by_bulkhead && other_errors == 0,
        "every other call was served: nothing but the bulkhead's sheds failed",
    );
    check(
        &mut failures,
        peak as usize <= LIMIT,
        "never more than the limit inside the dependency",
    );
    check(
        &mut failures,
        seen.breaker_permitted == outcomes.served
            && seen.breaker_succeeded == outcomes.served
            && seen.breaker_failed == 0
            && seen.dependency_calls == outcomes.served,
        "the breaker saw only the calls that reached the dependency: not one shed",
    );
    check(
        &mut failures,
        stack.breaker.state() == CircuitState::Closed,
        "saturation left the breaker closed",
    );

    println!("\n(b) the same callers; the dependency now fails every call after {FAILS_AFTER:?}");
    stack.seen.healthy.store(false, Ordering::SeqCst);
    let before = stack.seen.snapshot();
    let outcomes = offer_load(&stack).await;
    let seen = stack.seen.snapshot() - before;
    row("attempts at the dependency", seen.dependency_calls);
    row("  recorded by the breaker as failures", seen.breaker_failed);
    row("refused by the open breaker", outcomes.breaker_open);
    row("failed with the dependency's error", outcomes.failed);
    row("shed, ServiceSaturated at the top", outcomes.shed);
    row("served", outcomes.served);
    if seen.breaker_failed > 0 && outcomes.failed == 0 {
        println!("    (the failing calls' retries found the breaker open)");
    }
    println!("    breaker: {:?}", stack.breaker.state());
    check(
        &mut failures,
        stack.breaker.state() == CircuitState::Open,
        "the failing dependency opened the breaker",
    );
    check(
        &mut failures,
        seen.breaker_failed == seen.dependency_calls
            && seen.dependency_calls as usize >= BREAKER_FAILURES
            && seen.breaker_refused == outcomes.breaker_open,
        "every failure it recorded was the dependency's",
    );
    check(
        &mut failures,
        seen.dependency_calls as usize <= BREAKER_FAILURES + LIMIT && outcomes.breaker_open > 0,
        "once open, it kept the calls off the dependency",
    );
    check(
        &mut failures,
        outcomes.served == 0 && outcomes.other == 0,
        "no call was served, and no error was unexpected",
    );

    if failures.is_empty() {
        println!("\nok: saturation never opened the breaker; the failing dependency did");
        ExitCode::SUCCESS
    } else {
        println!("\nFAILED: {}", failures.join("; "));
        ExitCode::FAILURE
    }
}
