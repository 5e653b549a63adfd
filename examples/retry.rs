//! `tower::retry` around the bulkhead: transient failures of the dependency
//! are retried, a bounded number of times; the bulkhead's own refusals
//! (`ServiceSaturated`) never are.
//!
//! ```text
//! cargo run --example retry
//! ```
//!
//! The stack, outermost first: retry → concurrency → dependency. With retry
//! outside, each *attempt* takes a slot of its own and gives it back when it
//! fails, so a call sleeping in its backoff holds none. (Retry inside the
//! bulkhead would keep the slot through every backoff, and one call's retries
//! would never be counted against the limit.)

use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tower::retry::{Policy, RetryLayer};
use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};
use tower_inflight::{ConcurrencyLayer, Config, ServiceSaturated};

/// How long a retried call waits before its next attempt.
const BACKOFF: Duration = Duration::from_millis(200);
/// Attempts after the first, at most.
const RETRIES: u32 = 3;

/// A transient failure of the dependency: worth another attempt.
#[derive(Debug)]
struct Flaky;

impl fmt::Display for Flaky {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the dependency hiccuped")
    }
}

impl std::error::Error for Flaky {}

/// A job for the dependency, which fails its first `fail_first` attempts.
/// It counts the attempts that reached the dependency, across its retries.
#[derive(Clone, Debug)]
struct Job {
    name: &'static str,
    fail_first: u32,
    attempts: Arc<AtomicU32>,
}

impl Job {
    fn new(name: &'static str, fail_first: u32) -> Self {
        Self {
            name,
            fail_first,
            attempts: Arc::default(),
        }
    }

    fn attempts(&self) -> u32 {
        self.attempts.load(Ordering::SeqCst)
    }
}

/// Retries `Flaky` up to `retries_left` times, `BACKOFF` apart; nothing else.
///
/// `Retry` clones the policy for each call, so the count is per call.
#[derive(Clone, Debug)]
struct RetryTransient {
    retries_left: u32,
}

impl<Req: Clone, Res> Policy<Req, Res, BoxError> for RetryTransient {
    type Future = tokio::time::Sleep;

    fn retry(
        &mut self,
        _request: &mut Req,
        result: &mut Result<Res, BoxError>,
    ) -> Option<Self::Future> {
        let error = result.as_ref().err()?;
        // Never retry the bulkhead's refusal. It is our own backpressure, not
        // a failure of the dependency: the call was never started (the inner
        // service was not called), so there is nothing transient to ride out,
        // and it was refused *because* too much is in flight: trying again at
        // once only adds load where there is already too much. Hand it to the
        // caller instead (a 503 with `Retry-After`, something stale, a queue).
        if error.is::<ServiceSaturated>() {
            return None;
        }
        if !error.is::<Flaky>() || self.retries_left == 0 {
            return None;
        }
        self.retries_left -= 1;
        Some(tokio::time::sleep(BACKOFF))
    }

    fn clone_request(&mut self, request: &Req) -> Option<Req> {
        Some(request.clone())
    }
}

// A single-threaded runtime keeps the interleaving in the last part exact.
#[tokio::main(flavor = "current_thread")]
async fn main() {
    // A limit of 1, so that one held slot saturates it.
    let layer = ConcurrencyLayer::new(Config::new(1, Duration::from_secs(30)).name("flaky"));
    let bulkhead = layer.bulkhead();
    let dependency = service_fn(|job: Job| async move {
        let attempt = job.attempts.fetch_add(1, Ordering::SeqCst) + 1;
        if attempt <= job.fail_first {
            println!("    {}: attempt {attempt} failed", job.name);
            return Err(Flaky);
        }
        println!("    {}: attempt {attempt} succeeded", job.name);
        Ok(job.name)
    });
    let service = ServiceBuilder::new()
        .layer(RetryLayer::new(RetryTransient {
            retries_left: RETRIES,
        }))
        .layer(layer)
        .service(dependency);

    println!("a transient failure is retried (up to {RETRIES} times, {BACKOFF:?} apart):");
    let job = Job::new("job A", 2);
    let started = Instant::now();
    let outcome = service.clone().oneshot(job.clone()).await;
    println!(
        "  -> {outcome:?} after {} attempts, {:?}",
        job.attempts(),
        started.elapsed()
    );
    assert_eq!(outcome.ok(), Some("job A"));
    assert_eq!(job.attempts(), 3);

    println!("\nretries are bounded:");
    let job = Job::new("job B", u32::MAX);
    let outcome = service.clone().oneshot(job.clone()).await;
    let error = outcome.expect_err("it never succeeds");
    println!("  -> gave up after {} attempts: {error}", job.attempts());
    assert!(error.is::<Flaky>());
    assert_eq!(job.attempts(), 1 + RETRIES);

    println!("\na saturated call is returned at once, and not retried:");
    let held = bulkhead.try_acquire().expect("the only slot");
    let job = Job::new("job C", 0);
    let shed_before = bulkhead.status().totals.rejected_limit;
    let started = Instant::now();
    let outcome = service.clone().oneshot(job.clone()).await;
    let took = started.elapsed();
    let refusals = bulkhead.status().totals.rejected_limit - shed_before;
    let error = outcome.expect_err("the bulkhead is full");
    let shed = error
        .downcast_ref::<ServiceSaturated>()
        .expect("the bulkhead's refusal");
    println!(
        "  -> {shed} (reason {:?}, retry after {:?}) in {took:?}",
        shed.reason(),
        shed.retry_after(),
    );
    println!(
        "     attempts refused by the bulkhead: {refusals}; calls that reached the dependency: {}",
        job.attempts()
    );
    assert_eq!(job.attempts(), 0, "the call never started");
    assert_eq!(refusals, 1, "one attempt, not retried");
    assert!(took < BACKOFF, "no backoff");
    drop(held);

    println!("\na call in its backoff holds no slot:");
    let job = Job::new("job D", 1);
    let retrying = tokio::spawn(service.clone().oneshot(job.clone()));
    // Let job D make its first attempt; it fails and sleeps in its backoff.
    while job.attempts() == 0 {
        tokio::task::yield_now().await;
    }
    println!(
        "  job D is in its backoff; slots in flight: {}/{}",
        bulkhead.in_flight(),
        bulkhead.limit()
    );
    assert_eq!(bulkhead.in_flight(), 0);
    let other = Job::new("job E", 0);
    let outcome = service.clone().oneshot(other).await;
    println!("  -> meanwhile {outcome:?}, through the only slot");
    assert_eq!(outcome.ok(), Some("job E"));
    assert!(!retrying.is_finished());
    let outcome = retrying.await.expect("job D's task");
    println!("  -> then {outcome:?} after {} attempts", job.attempts());
    assert_eq!(outcome.ok(), Some("job D"));
}
