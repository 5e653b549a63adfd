//! The whole stack of README.md's "Where it goes in a stack", with tower's
//! retry, rate limit, buffer and timeout and tower-resilience's circuit
//! breaker:
//!
//! ```text
//! retry → buffer → rate limit → concurrency → circuit breaker → timeout → service
//! ```
//!
//! Sheds reach the top as `ServiceSaturated` and never reach the breaker,
//! which stays closed under saturation and opens on a failing dependency; a
//! retry in its backoff and a caller the rate limiter holds back hold no
//! slot; a hung call cut by the timeout frees its slot at once. And where the
//! bulkhead goes relative to the `Buffer` (which `RateLimit` needs under a
//! `Retry`) for its `wait` budget to hold per caller: behind the buffer its
//! waits go one at a time in the buffer's worker.
//!
//! Every timing is on tokio's paused clock.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tower::retry::Policy;
use tower::timeout::error::Elapsed;
use tower::util::BoxCloneService;
use tower::{service_fn, BoxError, ServiceBuilder, ServiceExt};
use tower_inflight::{Bulkhead, ConcurrencyLayer, Config, ServiceSaturated, ShedReason, Ticket};
use tower_resilience_circuitbreaker::{
    CircuitBreakerError, CircuitBreakerHandle, CircuitBreakerLayer, CircuitState, DefaultClassifier,
};

const LIMIT: usize = 2;
const RECLAIM: Duration = Duration::from_secs(30);
const TIMEOUT: Duration = Duration::from_secs(1);
const BACKOFF: Duration = Duration::from_millis(200);
const RETRIES: u32 = 2;
const WAIT: Duration = Duration::from_millis(100);
/// The breaker opens after this many failures in a row.
const BREAKER_FAILURES: usize = 5;

/// A failure of the dependency that is worth another attempt.
#[derive(Debug)]
struct Transient;

impl std::fmt::Display for Transient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the dependency failed")
    }
}

impl std::error::Error for Transient {}

/// A call to the dependency, which says what the dependency does with it.
#[derive(Clone, Debug)]
struct Job {
    id: u32,
    /// How long the dependency works on it.
    work: Duration,
    /// Its first `fail_first` attempts fail with `Transient`.
    fail_first: u32,
    /// The dependency never answers it.
    hang: bool,
    /// Attempts that reached the dependency, across retries.
    attempts: Arc<AtomicU32>,
}

impl Job {
    fn new(id: u32, work: Duration) -> Self {
        Self {
            id,
            work,
            fail_first: 0,
            hang: false,
            attempts: Arc::default(),
        }
    }

    fn failing(mut self, fail_first: u32) -> Self {
        self.fail_first = fail_first;
        self
    }

    fn hanging(mut self) -> Self {
        self.hang = true;
        self
    }

    fn attempts(&self) -> u32 {
        self.attempts.load(Ordering::SeqCst)
    }
}

/// Retries `Transient` failures, `BACKOFF` apart; never `ServiceSaturated`
/// (the call never started, and too much is in flight already), nor an open
/// breaker, nor a timeout.
#[derive(Clone, Debug)]
struct RetryTransient {
    retries_left: u32,
}

impl<Res> Policy<Job, Res, BoxError> for RetryTransient {
    type Future = tokio::time::Sleep;

    fn retry(&mut self, _: &mut Job, result: &mut Result<Res, BoxError>) -> Option<Self::Future> {
        let error = result.as_ref().err()?;
        if error.is::<ServiceSaturated>() || !error.is::<Transient>() || self.retries_left == 0 {
            return None;
        }
        self.retries_left -= 1;
        Some(tokio::time::sleep(BACKOFF))
    }

    fn clone_request(&mut self, job: &Job) -> Option<Job> {
        Some(job.clone())
    }
}

/// What reached the dependency, and what the breaker saw.
#[derive(Default)]
struct Counts {
    /// Calls the dependency started.
    dependency: AtomicU32,
    /// Calls inside the dependency now, and the most at once.
    inside: AtomicU32,
    peak: AtomicU32,
    /// Calls the breaker let through, and their outcomes as it recorded them.
    breaker_permitted: AtomicU32,
    breaker_succeeded: AtomicU32,
    breaker_failed: AtomicU32,
    /// Calls the open breaker refused.
    breaker_rejected: AtomicU32,
}

impl Counts {
    fn get(counter: &AtomicU32) -> u32 {
        counter.load(Ordering::SeqCst)
    }
}

/// Counts one call inside the dependency until dropped.
struct Inside(Arc<Counts>);

impl Inside {
    fn enter(counts: &Arc<Counts>) -> Self {
        counts.dependency.fetch_add(1, Ordering::SeqCst);
        let now = counts.inside.fetch_add(1, Ordering::SeqCst) + 1;
        counts.peak.fetch_max(now, Ordering::SeqCst);
        Self(counts.clone())
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        self.0.inside.fetch_sub(1, Ordering::SeqCst);
    }
}

type Svc = BoxCloneService<Job, u32, BoxError>;

/// Where the bulkhead goes.
#[derive(Clone, Copy, Debug)]
enum Placement {
    /// retry → buffer → rate limit → concurrency → breaker → timeout → service
    BehindBuffer,
    /// The same, with `ConcurrencyLayer::classify`: a caller that must wait
    /// waits in its own response future, not in `poll_ready`.
    BehindBufferClassified,
    /// retry → concurrency → buffer → rate limit → breaker → timeout → service
    OutsideBuffer,
    /// The wrong order: retry → buffer → rate limit → breaker → concurrency
    /// → timeout → service.
    InsideBreaker,
}

struct Settings {
    placement: Placement,
    wait: Option<Duration>,
    /// The rate limiter's quota: calls per period.
    rate: (u64, Duration),
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            placement: Placement::BehindBuffer,
            wait: None,
            rate: (1_000, Duration::from_secs(1)),
        }
    }
}

struct Stack {
    service: Svc,
    bulkhead: Bulkhead,
    breaker: CircuitBreakerHandle<DefaultClassifier>,
    counts: Arc<Counts>,
}

/// The breaker's errors, flattened: the dependency's own error (or the
/// timeout's) comes out as it went in, so that the top can downcast it.
fn flatten(error: CircuitBreakerError<BoxError>) -> BoxError {
    match error {
        CircuitBreakerError::Inner(error) => error,
        open => open.into(),
    }
}

fn is_open_circuit(error: &BoxError) -> bool {
    error
        .downcast_ref::<CircuitBreakerError<BoxError>>()
        .is_some_and(CircuitBreakerError::is_circuit_open)
}

fn stack(settings: Settings) -> Stack {
    let counts = Arc::new(Counts::default());
    let (breaker, handle) = {
        let (permitted, succeeded, failed, rejected) = (
            counts.clone(),
            counts.clone(),
            counts.clone(),
            counts.clone(),
        );
        CircuitBreakerLayer::builder()
            .consecutive_failures(BREAKER_FAILURES)
            .wait_duration_in_open(Duration::from_secs(60))
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
                rejected.breaker_rejected.fetch_add(1, Ordering::SeqCst);
            })
            .build_with_handle()
            .expect("a valid breaker")
    };
    let mut config = Config::new(LIMIT, RECLAIM).name("dependency");
    if let Some(wait) = settings.wait {
        config = config.wait(wait);
    }
    let bulkhead = Bulkhead::new(config);
    let concurrency = ConcurrencyLayer::from_bulkhead(bulkhead.clone());
    let dependency = {
        let counts = counts.clone();
        service_fn(move |job: Job| {
            let inside = Inside::enter(&counts);
            async move {
                let _inside = inside;
                let attempt = job.attempts.fetch_add(1, Ordering::SeqCst) + 1;
                if job.hang {
                    std::future::pending::<()>().await;
                }
                tokio::time::sleep(job.work).await;
                if attempt <= job.fail_first {
                    return Err::<u32, BoxError>(Transient.into());
                }
                Ok(job.id)
            }
        })
    };
    let retry = RetryTransient {
        retries_left: RETRIES,
    };
    let (num, per) = settings.rate;
    let service = match settings.placement {
        Placement::BehindBuffer => BoxCloneService::new(
            ServiceBuilder::new()
                .retry(retry)
                .buffer(64)
                .rate_limit(num, per)
                .layer(concurrency)
                .map_err(flatten)
                .layer(breaker)
                .timeout(TIMEOUT)
                .service(dependency),
        ),
        Placement::BehindBufferClassified => BoxCloneService::new(
            ServiceBuilder::new()
                .retry(retry)
                .buffer(64)
                .rate_limit(num, per)
                .layer(concurrency.classify(|_: &Job| Ticket::new()))
                .map_err(flatten)
                .layer(breaker)
                .timeout(TIMEOUT)
                .service(dependency),
        ),
        Placement::OutsideBuffer => BoxCloneService::new(
            ServiceBuilder::new()
                .retry(retry)
                .layer(concurrency)
                .buffer(64)
                .rate_limit(num, per)
                .map_err(flatten)
                .layer(breaker)
                .timeout(TIMEOUT)
                .service(dependency),
        ),
        Placement::InsideBreaker => BoxCloneService::new(
            ServiceBuilder::new()
                .retry(retry)
                .buffer(64)
                .rate_limit(num, per)
                .map_err(flatten)
                .layer(breaker)
                .layer(concurrency)
                .timeout(TIMEOUT)
                .service(dependency),
        ),
    };
    Stack {
        service,
        bulkhead,
        breaker: handle,
        counts,
    }
}

/// Each job from its own task, all at once; each outcome with the time it
/// took.
async fn call_all(service: Svc, jobs: &[Job]) -> Vec<(Result<u32, BoxError>, Duration)> {
    let started = Instant::now();
    let tasks: Vec<_> = jobs
        .iter()
        .map(|job| {
            let call = service.clone().oneshot(job.clone());
            tokio::spawn(async move { (call.await, started.elapsed()) })
        })
        .collect();
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.expect("a caller's task"));
    }
    outcomes
}

fn is_shed(outcome: &Result<u32, BoxError>) -> bool {
    outcome
        .as_ref()
        .is_err_and(|error| error.is::<ServiceSaturated>())
}

fn jobs(n: u32, work: Duration) -> Vec<Job> {
    (0..n).map(|id| Job::new(id, work)).collect()
}

#[tokio::test(start_paused = true)]
async fn sheds_reach_the_top_as_service_saturated_and_never_the_breaker() {
    let stack = stack(Settings::default());
    let jobs = jobs(20, Duration::from_millis(500));
    let outcomes = call_all(stack.service.clone(), &jobs).await;

    let served = outcomes.iter().filter(|(o, _)| o.is_ok()).count();
    let shed: Vec<_> = outcomes.iter().filter(|(o, _)| is_shed(o)).collect();
    assert_eq!(served, LIMIT, "the limit's worth of callers is served");
    assert_eq!(shed.len(), 20 - LIMIT, "every other caller is shed");
    for (outcome, took) in &shed {
        let error = outcome.as_ref().unwrap_err();
        let saturated = error.downcast_ref::<ServiceSaturated>().unwrap();
        assert_eq!(saturated.reason(), ShedReason::LimitReached);
        assert_eq!(*took, Duration::ZERO, "shed at once, not retried");
    }
    for job in &jobs {
        assert!(job.attempts() <= 1, "nothing was retried");
    }

    let counts = &stack.counts;
    let totals = stack.bulkhead.status().totals;
    assert_eq!(totals.rejected_limit, (20 - LIMIT) as u64);
    assert_eq!(totals.admitted, LIMIT as u64);
    assert_eq!(Counts::get(&counts.dependency), LIMIT as u32);
    assert_eq!(Counts::get(&counts.peak), LIMIT as u32);
    // The breaker saw exactly the calls that reached the dependency: no shed.
    assert_eq!(Counts::get(&counts.breaker_permitted), LIMIT as u32);
    assert_eq!(Counts::get(&counts.breaker_succeeded), LIMIT as u32);
    assert_eq!(Counts::get(&counts.breaker_failed), 0);
    assert_eq!(Counts::get(&counts.breaker_rejected), 0);
    assert_eq!(stack.breaker.state(), CircuitState::Closed);
}

#[tokio::test(start_paused = true)]
async fn saturation_never_opens_the_breaker() {
    let stack = stack(Settings::default());
    let mut shed = 0;
    for _ in 0..10 {
        let outcomes = call_all(stack.service.clone(), &jobs(20, Duration::from_millis(100))).await;
        shed += outcomes.iter().filter(|(o, _)| is_shed(o)).count();
        assert!(outcomes.iter().all(|(o, _)| o.is_ok() || is_shed(o)));
    }
    assert_eq!(shed, 10 * (20 - LIMIT), "90 % of the calls were shed");
    assert_eq!(Counts::get(&stack.counts.breaker_failed), 0);
    assert_eq!(
        Counts::get(&stack.counts.breaker_permitted),
        Counts::get(&stack.counts.dependency)
    );
    assert_eq!(stack.breaker.state(), CircuitState::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_failing_dependency_opens_the_breaker() {
    let stack = stack(Settings::default());
    let work = Duration::from_millis(10);

    // The first call fails on each of its 1 + RETRIES attempts.
    let first = Job::new(1, work).failing(u32::MAX);
    let error = stack
        .service
        .clone()
        .oneshot(first.clone())
        .await
        .unwrap_err();
    assert!(error.is::<Transient>(), "{error}");
    assert_eq!(first.attempts(), 1 + RETRIES);
    assert_eq!(stack.breaker.state(), CircuitState::Closed);

    // The second opens it after two more failures; its next attempt finds
    // the breaker open, which is not retried.
    let second = Job::new(2, work).failing(u32::MAX);
    let error = stack
        .service
        .clone()
        .oneshot(second.clone())
        .await
        .unwrap_err();
    assert!(is_open_circuit(&error), "{error}");
    assert!(!error.is::<ServiceSaturated>());
    assert_eq!(second.attempts(), 2);
    assert_eq!(stack.breaker.state(), CircuitState::Open);
    assert_eq!(
        Counts::get(&stack.counts.breaker_failed),
        BREAKER_FAILURES as u32
    );

    // Now calls fail at once without reaching the dependency; the bulkhead
    // shed none of them.
    let started = Instant::now();
    let third = Job::new(3, work);
    let error = stack
        .service
        .clone()
        .oneshot(third.clone())
        .await
        .unwrap_err();
    assert!(is_open_circuit(&error), "{error}");
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(third.attempts(), 0);
    assert_eq!(
        Counts::get(&stack.counts.dependency),
        BREAKER_FAILURES as u32
    );
    assert_eq!(Counts::get(&stack.counts.breaker_rejected), 2);
    assert_eq!(stack.bulkhead.status().totals.rejected(), 0);
    assert_eq!(stack.bulkhead.in_flight(), 0);
}

/// Why the breaker goes inside: outside the bulkhead, it counts each shed
/// as a failure of the dependency and opens on saturation alone.
#[tokio::test(start_paused = true)]
async fn a_breaker_outside_the_bulkhead_opens_on_saturation_alone() {
    let stack = stack(Settings {
        placement: Placement::InsideBreaker,
        ..Settings::default()
    });
    let outcomes = call_all(stack.service.clone(), &jobs(20, Duration::from_millis(100))).await;
    assert!(outcomes.iter().filter(|(o, _)| is_shed(o)).count() >= BREAKER_FAILURES);
    assert_eq!(
        Counts::get(&stack.counts.dependency),
        LIMIT as u32,
        "the dependency answered every call it got"
    );
    assert!(Counts::get(&stack.counts.breaker_failed) >= BREAKER_FAILURES as u32);
    assert_eq!(stack.breaker.state(), CircuitState::Open);

    let error = stack
        .service
        .clone()
        .oneshot(Job::new(99, Duration::from_millis(100)))
        .await
        .unwrap_err();
    assert!(is_open_circuit(&error), "a healthy dependency cut off");
}

#[tokio::test(start_paused = true)]
async fn a_retry_attempt_holds_no_slot_in_its_backoff() {
    let stack = stack(Settings::default());
    let work = Duration::from_millis(10);
    let flaky = Job::new(1, work).failing(1);
    let retrying = tokio::spawn(stack.service.clone().oneshot(flaky.clone()));

    // Its first attempt has failed; it is halfway through its backoff.
    tokio::time::sleep(work + BACKOFF / 2).await;
    assert_eq!(flaky.attempts(), 1);
    assert!(!retrying.is_finished());
    assert_eq!(stack.bulkhead.in_flight(), 0, "no slot held in the backoff");

    // Both slots are free for others meanwhile.
    let others = jobs(LIMIT as u32, Duration::from_millis(50));
    let outcomes = call_all(stack.service.clone(), &others).await;
    assert!(outcomes.iter().all(|(o, _)| o.is_ok()));
    assert!(!retrying.is_finished());

    assert_eq!(retrying.await.unwrap().unwrap(), 1);
    assert_eq!(flaky.attempts(), 2);
    let totals = stack.bulkhead.status().totals;
    assert_eq!(totals.admitted, 2 + LIMIT as u64, "a slot per attempt");
    assert_eq!(totals.rejected(), 0);
    assert_eq!(Counts::get(&stack.counts.breaker_failed), 1);
    assert_eq!(stack.bulkhead.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_caller_the_rate_limiter_holds_back_holds_no_slot() {
    let per = Duration::from_secs(1);
    let stack = stack(Settings {
        rate: (1, per),
        ..Settings::default()
    });
    let work = Duration::from_millis(100);
    let first = Job::new(1, work);
    let second = Job::new(2, work);
    let started = Instant::now();
    assert_eq!(stack.service.clone().oneshot(first).await.unwrap(), 1);
    let held_back = tokio::spawn(stack.service.clone().oneshot(second.clone()));

    tokio::time::sleep(per / 2 - work).await;
    assert!(!held_back.is_finished());
    assert_eq!(second.attempts(), 0, "the rate limiter holds it back");
    assert_eq!(stack.bulkhead.in_flight(), 0, "holding no slot");
    assert_eq!(stack.bulkhead.status().totals.admitted, 1);

    assert_eq!(held_back.await.unwrap().unwrap(), 2);
    assert_eq!(started.elapsed(), per + work);
}

#[tokio::test(start_paused = true)]
async fn a_hung_call_cut_by_the_timeout_frees_its_slot_at_once() {
    let stack = stack(Settings::default());
    let hung = Job::new(1, Duration::ZERO).hanging();
    let started = Instant::now();
    let call = tokio::spawn(stack.service.clone().oneshot(hung.clone()));

    tokio::time::sleep(TIMEOUT - Duration::from_millis(1)).await;
    assert_eq!(stack.bulkhead.in_flight(), 1);
    let error = call.await.unwrap().unwrap_err();
    assert!(error.is::<Elapsed>(), "{error}");
    assert_eq!(started.elapsed(), TIMEOUT);
    assert_eq!(
        stack.bulkhead.in_flight(),
        0,
        "freed when cut, not reclaimed"
    );
    assert_eq!(stack.bulkhead.status().totals.reclaimed, 0);
    assert_eq!(hung.attempts(), 1, "a timeout is not retried");
    assert_eq!(Counts::get(&stack.counts.breaker_failed), 1);
}

/// With both slots held, five callers that each may wait `WAIT`: when each
/// is shed, and how many the bulkhead saw waiting at once.
async fn five_waiting_callers(placement: Placement) -> (Vec<Duration>, usize) {
    let stack = stack(Settings {
        placement,
        wait: Some(WAIT),
        ..Settings::default()
    });
    let held: Vec<_> = (0..LIMIT)
        .map(|_| stack.bulkhead.try_acquire().unwrap())
        .collect();
    let service = stack.service.clone();
    let callers = tokio::spawn(async move { call_all(service, &jobs(5, Duration::ZERO)).await });
    tokio::time::sleep(WAIT / 2).await;
    let waiting = stack.bulkhead.waiting();
    let outcomes = callers.await.unwrap();
    drop(held);
    assert!(outcomes.iter().all(|(o, _)| is_shed(o)));
    let totals = stack.bulkhead.status().totals;
    assert_eq!(totals.rejected_wait_expired, 5);
    assert_eq!(Counts::get(&stack.counts.breaker_permitted), 0);
    (
        outcomes.into_iter().map(|(_, took)| took).collect(),
        waiting,
    )
}

/// The pitfall: behind a `Buffer`, the bulkhead's `poll_ready` waits in the
/// buffer's one worker, so callers wait one after another and the fifth is
/// shed after five budgets.
#[tokio::test(start_paused = true)]
async fn behind_the_buffer_a_wait_budget_is_spent_one_caller_at_a_time() {
    let (shed_after, waiting) = five_waiting_callers(Placement::BehindBuffer).await;
    assert_eq!(waiting, 1, "the others queue in the buffer, unseen");
    assert_eq!(
        shed_after,
        [1, 2, 3, 4, 5].map(|n| WAIT * n),
        "the last caller waited five times its budget"
    );
}

/// Behind a `Buffer` without a `wait` budget, every caller is shed at once.
#[tokio::test(start_paused = true)]
async fn behind_the_buffer_without_a_wait_budget_every_caller_is_shed_at_once() {
    let stack = stack(Settings::default());
    let held: Vec<_> = (0..LIMIT)
        .map(|_| stack.bulkhead.try_acquire().unwrap())
        .collect();
    let outcomes = call_all(stack.service.clone(), &jobs(5, Duration::ZERO)).await;
    drop(held);
    assert!(outcomes
        .iter()
        .all(|(o, took)| is_shed(o) && *took == Duration::ZERO));
}

/// Outside the `Buffer`, each caller's clone of the bulkhead waits for
/// itself: all five are shed after one budget.
#[tokio::test(start_paused = true)]
async fn outside_the_buffer_each_caller_waits_its_own_budget() {
    let (shed_after, waiting) = five_waiting_callers(Placement::OutsideBuffer).await;
    assert_eq!(waiting, 5);
    assert_eq!(shed_after, [WAIT; 5]);
}

/// Behind the `Buffer`, `classify` waits in each caller's response future
/// rather than in the worker: all five are shed after one budget.
#[tokio::test(start_paused = true)]
async fn behind_the_buffer_a_classified_bulkhead_waits_in_each_callers_future() {
    let (shed_after, waiting) = five_waiting_callers(Placement::BehindBufferClassified).await;
    assert_eq!(waiting, 5);
    assert_eq!(shed_after, [WAIT; 5]);
}

/// The price of going outside the `Buffer`: the rate limiter is then inside
/// the bulkhead, and a caller it holds back holds a slot.
#[tokio::test(start_paused = true)]
async fn outside_the_buffer_a_caller_the_rate_limiter_holds_back_holds_a_slot() {
    let per = Duration::from_secs(1);
    let stack = stack(Settings {
        placement: Placement::OutsideBuffer,
        wait: Some(WAIT),
        rate: (1, per),
    });
    let work = Duration::from_millis(100);
    assert_eq!(
        stack
            .service
            .clone()
            .oneshot(Job::new(1, work))
            .await
            .unwrap(),
        1
    );
    let second = Job::new(2, work);
    let held_back = tokio::spawn(stack.service.clone().oneshot(second.clone()));
    tokio::time::sleep(per / 2 - work).await;
    assert_eq!(second.attempts(), 0, "the rate limiter holds it back");
    assert_eq!(stack.bulkhead.in_flight(), 1, "holding a slot");
    assert_eq!(held_back.await.unwrap().unwrap(), 2);
}
