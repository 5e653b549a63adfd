//! The tower layer end to end: shedding without calling the inner service,
//! releasing the slot however a call ends, and retries taking one slot per
//! attempt.

use std::convert::Infallible;
use std::future::{pending, poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;
use tokio::sync::oneshot;
use tower::{service_fn, Layer, Service, ServiceBuilder, ServiceExt};
use tower_inflight::{
    BoxError, Bulkhead, ConcurrencyLayer, Config, ManualClock, Permit, ServiceSaturated, ShedReason,
};

const RECLAIM: Duration = Duration::from_secs(60);

fn shed_of(error: &BoxError) -> &ServiceSaturated {
    error
        .downcast_ref::<ServiceSaturated>()
        .unwrap_or_else(|| panic!("expected ServiceSaturated, got {error}"))
}

/// An inner service that counts its calls and answers once `gate` says so.
#[derive(Clone)]
struct Gated {
    calls: Arc<AtomicUsize>,
    gates: Arc<Mutex<Vec<oneshot::Sender<()>>>>,
}

impl Gated {
    fn new() -> Self {
        Self {
            calls: Arc::new(AtomicUsize::new(0)),
            gates: Arc::new(Mutex::new(Vec::new())),
        }
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// Lets every call made so far answer.
    fn open(&self) {
        for gate in self.gates.lock().unwrap().drain(..) {
            let _ = gate.send(());
        }
    }
}

impl Service<u32> for Gated {
    type Response = u32;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<u32, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: u32) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let (open, opened) = oneshot::channel();
        self.gates.lock().unwrap().push(open);
        Box::pin(async move {
            let _ = opened.await;
            Ok(request)
        })
    }
}

#[tokio::test]
async fn over_the_limit_the_inner_service_is_not_called_and_the_call_fails_at_once() {
    let layer = ConcurrencyLayer::new(Config::new(2, RECLAIM).name("payments"));
    let bulkhead = layer.bulkhead();
    let inner = Gated::new();
    let mut service = layer.layer(inner.clone());

    let first = service.ready().await.unwrap().call(1);
    let second = service.ready().await.unwrap().call(2);
    assert_eq!(inner.calls(), 2);
    assert_eq!(bulkhead.in_flight(), 2);

    let mut third = tokio_test::task::spawn(service.ready().await.unwrap().call(3));
    let Poll::Ready(result) = third.poll() else {
        panic!("a shed call must fail on its first poll, without waiting");
    };
    let error = result.unwrap_err();
    assert_eq!(inner.calls(), 2, "the shed call reached the inner service");

    let shed = shed_of(&error);
    assert_eq!(shed.reason(), ShedReason::LimitReached);
    assert_eq!(shed.name(), Some("payments"));
    assert_eq!(shed.limit(), 2);
    #[cfg(feature = "http")]
    assert_eq!(shed.http_status().as_u16(), 503);
    assert!(error.is::<ServiceSaturated>());
    assert_eq!(bulkhead.in_flight(), 2, "a shed call holds no slot");

    inner.open();
    assert_eq!((first.await.unwrap(), second.await.unwrap()), (1, 2));
    assert_eq!(bulkhead.in_flight(), 0);
}

#[tokio::test]
async fn slot_is_free_the_instant_the_response_future_completes() {
    let clock = ManualClock::new(); // never advanced: no time passes at all
    let layer = ConcurrencyLayer::new(Config::new(1, RECLAIM).clock(clock.clone()));
    let bulkhead = layer.bulkhead();
    let inner = Gated::new();
    let mut service = layer.layer(inner.clone());

    let mut call = tokio_test::task::spawn(service.ready().await.unwrap().call(1));
    assert!(call.poll().is_pending());
    assert_eq!(bulkhead.in_flight(), 1);
    inner.open();
    assert!(matches!(call.poll(), Poll::Ready(Ok(1))));
    // The future completed but is still alive: the slot is already free.
    assert_eq!(bulkhead.in_flight(), 0);
    assert!(bulkhead.try_acquire().is_ok());
    let mut next = tokio_test::task::spawn(service.ready().await.unwrap().call(2));
    assert!(next.poll().is_pending(), "the next call was admitted");
    assert_eq!(inner.calls(), 2);
    drop(call);
    assert_eq!(bulkhead.in_flight(), 1);
    assert_eq!(clock.elapsed(), Duration::ZERO);
}

#[tokio::test]
async fn slot_is_released_when_the_inner_service_fails() {
    let layer = ConcurrencyLayer::new(Config::new(1, RECLAIM));
    let bulkhead = layer.bulkhead();
    let mut service = layer.layer(service_fn(|_: ()| async {
        Err::<(), _>(std::io::Error::other("dependency failed"))
    }));
    for _ in 0..3 {
        let error = service.ready().await.unwrap().call(()).await.unwrap_err();
        assert!(
            error.is::<std::io::Error>(),
            "inner error passed through: {error}"
        );
        assert!(!error.is::<ServiceSaturated>());
        assert_eq!(bulkhead.in_flight(), 0);
    }
}

#[tokio::test]
async fn slot_is_released_when_the_inner_future_panics() {
    let layer = ConcurrencyLayer::new(Config::new(1, RECLAIM));
    let bulkhead = layer.bulkhead();
    let mut service = layer.layer(service_fn(|panics: bool| async move {
        tokio::task::yield_now().await;
        if panics {
            panic!("inner service panicked");
        }
        Ok::<_, Infallible>(())
    }));
    let call = service.ready().await.unwrap().call(true);
    assert_eq!(bulkhead.in_flight(), 1);
    let joined = tokio::spawn(call).await;
    assert!(joined.unwrap_err().is_panic());
    assert_eq!(bulkhead.in_flight(), 0);
    service.ready().await.unwrap().call(false).await.unwrap();
}

#[tokio::test]
async fn slot_is_released_when_the_inner_call_panics_before_returning_a_future() {
    #[derive(Clone)]
    struct PanicsInCall;
    impl Service<()> for PanicsInCall {
        type Response = ();
        type Error = Infallible;
        type Future = std::future::Ready<Result<(), Infallible>>;
        fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: ()) -> Self::Future {
            panic!("inner call panicked")
        }
    }
    let layer = ConcurrencyLayer::new(Config::new(1, RECLAIM));
    let bulkhead = layer.bulkhead();
    let service = layer.layer(PanicsInCall);
    let joined = tokio::spawn(async move {
        let mut service = service;
        let _ = service.ready().await.unwrap().call(()).await;
    })
    .await;
    assert!(joined.unwrap_err().is_panic());
    assert_eq!(bulkhead.in_flight(), 0);
}

#[tokio::test]
async fn slot_is_released_when_the_response_future_is_dropped() {
    let layer = ConcurrencyLayer::new(Config::new(1, RECLAIM));
    let bulkhead = layer.bulkhead();
    let inner = Gated::new();
    let mut service = layer.layer(inner.clone());

    // Dropped before it was ever polled.
    let call = service.ready().await.unwrap().call(1);
    assert_eq!(bulkhead.in_flight(), 1);
    drop(call);
    assert_eq!(bulkhead.in_flight(), 0);

    // Dropped while the inner call is under way.
    let mut call = tokio_test::task::spawn(service.ready().await.unwrap().call(2));
    assert!(call.poll().is_pending());
    assert_eq!(bulkhead.in_flight(), 1);
    drop(call);
    assert_eq!(bulkhead.in_flight(), 0);
}

#[tokio::test]
async fn slot_is_released_when_the_calling_task_is_aborted() {
    let layer = ConcurrencyLayer::new(Config::new(1, RECLAIM));
    let bulkhead = layer.bulkhead();
    let mut service = layer.layer(Gated::new());
    let call = service.ready().await.unwrap().call(1);
    let task = tokio::spawn(call);
    tokio::task::yield_now().await;
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    assert_eq!(bulkhead.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn slot_is_released_by_a_timeout_inside_the_layer() {
    let layer = ConcurrencyLayer::new(Config::new(1, RECLAIM));
    let bulkhead = layer.bulkhead();
    let mut service = ServiceBuilder::new()
        .layer(layer)
        .timeout(Duration::from_secs(1))
        .service_fn(|_: ()| async {
            pending::<()>().await;
            Ok::<(), Infallible>(())
        });
    let mut call = tokio_test::task::spawn(service.ready().await.unwrap().call(()));
    assert!(call.poll().is_pending());
    assert_eq!(bulkhead.in_flight(), 1);
    tokio::time::advance(Duration::from_secs(1)).await;
    let Poll::Ready(Err(error)) = call.poll() else {
        panic!("the inner timeout did not fire");
    };
    assert!(error.is::<tower::timeout::error::Elapsed>(), "{error}");
    // Completed with the timeout's error; the future itself is still alive.
    assert_eq!(bulkhead.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn slot_is_released_by_a_timeout_outside_the_layer() {
    let layer = ConcurrencyLayer::new(Config::new(1, RECLAIM));
    let bulkhead = layer.bulkhead();
    let mut service = ServiceBuilder::new()
        .timeout(Duration::from_secs(1))
        .layer(layer)
        .service_fn(|_: ()| async {
            pending::<()>().await;
            Ok::<(), Infallible>(())
        });
    let mut call = tokio_test::task::spawn(service.ready().await.unwrap().call(()));
    assert!(call.poll().is_pending());
    assert_eq!(bulkhead.in_flight(), 1);
    tokio::time::advance(Duration::from_secs(1)).await;
    let Poll::Ready(Err(error)) = call.poll() else {
        panic!("the outer timeout did not fire");
    };
    assert!(error.is::<tower::timeout::error::Elapsed>(), "{error}");
    // tower's Timeout keeps the inner response future until it is itself
    // dropped, which any caller does once it has the error.
    drop(call);
    assert_eq!(bulkhead.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn slot_is_released_by_tokio_timeout_around_the_call() {
    let layer = ConcurrencyLayer::new(Config::new(1, RECLAIM));
    let bulkhead = layer.bulkhead();
    let mut service = layer.layer(Gated::new());
    let call = service.ready().await.unwrap().call(1);
    let outcome = tokio::time::timeout(Duration::from_millis(10), call).await;
    assert!(outcome.is_err());
    assert_eq!(bulkhead.in_flight(), 0);
}

#[tokio::test]
async fn tight_loop_of_calls_through_the_layer_never_sheds() {
    let layer = ConcurrencyLayer::new(Config::new(1, RECLAIM));
    let bulkhead = layer.bulkhead();
    let mut service = layer.layer(service_fn(|n: u32| async move { Ok::<_, Infallible>(n) }));
    for round in 0..1000 {
        let result = service.ready().await.unwrap().call(round).await;
        match result {
            Ok(n) => assert_eq!(n, round),
            Err(error) => panic!("round {round}: shed beside a free slot: {error}"),
        }
    }
    assert_eq!(bulkhead.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn tight_loop_of_calls_with_a_wait_budget_never_sheds() {
    let layer = ConcurrencyLayer::new(Config::new(1, RECLAIM).wait(Duration::from_millis(20)));
    let bulkhead = layer.bulkhead();
    let mut service = layer.layer(service_fn(|n: u32| async move { Ok::<_, Infallible>(n) }));
    for round in 0..1000 {
        if let Err(error) = service.ready().await.unwrap().call(round).await {
            panic!("round {round}: shed beside a free slot: {error}");
        }
    }
    assert_eq!(bulkhead.in_flight(), 0);
    assert_eq!(bulkhead.waiting(), 0);
}

#[tokio::test(start_paused = true)]
async fn calls_are_admitted_with_the_coop_budget_exhausted() {
    use tokio::task::coop;
    let layer = ConcurrencyLayer::new(Config::new(1, RECLAIM).wait(Duration::from_millis(20)));
    let bulkhead = layer.bulkhead();
    let mut service = layer.layer(service_fn(|n: u32| async move { Ok::<_, Infallible>(n) }));
    poll_fn(|cx| {
        while let Poll::Ready(restore) = coop::poll_proceed(cx) {
            restore.made_progress();
        }
        assert!(!coop::has_budget_remaining());
        for round in 0..1000 {
            assert!(
                matches!(service.poll_ready(cx), Poll::Ready(Ok(()))),
                "round {round}: not ready beside a free slot"
            );
            let mut call = std::pin::pin!(service.call(round));
            match call.as_mut().poll(cx) {
                Poll::Ready(Ok(n)) => assert_eq!(n, round),
                Poll::Ready(Err(error)) => panic!("round {round}: shed: {error}"),
                Poll::Pending => panic!("round {round}: a ready inner call was pending"),
            }
        }
        Poll::Ready(())
    })
    .await;
    assert_eq!(bulkhead.in_flight(), 0);
}

#[tokio::test]
async fn services_from_one_layer_share_its_limit() {
    let layer = ConcurrencyLayer::new(Config::new(1, RECLAIM));
    let inner = Gated::new();
    let mut a = layer.layer(inner.clone());
    let mut b = layer.layer(inner.clone());
    let _held = a.ready().await.unwrap().call(1);
    let error = b.ready().await.unwrap().call(2).await.unwrap_err();
    assert_eq!(shed_of(&error).reason(), ShedReason::LimitReached);
    assert_eq!(inner.calls(), 1);
}

#[tokio::test]
async fn layers_over_one_bulkhead_share_its_limit() {
    let bulkhead = Bulkhead::new(Config::new(1, RECLAIM));
    let mut a = ConcurrencyLayer::from_bulkhead(bulkhead.clone()).layer(Gated::new());
    let mut b = ConcurrencyLayer::from_bulkhead(bulkhead.clone()).layer(Gated::new());
    let _held = a.ready().await.unwrap().call(1);
    assert!(b.ready().await.unwrap().call(2).await.is_err());
    assert_eq!(b.bulkhead().in_flight(), 1);
}

// ---- retry ------------------------------------------------------------------

/// Retries failed attempts up to `attempts_left` more times, but never a call
/// the bulkhead shed (saturation is not the dependency's failure).
#[derive(Clone)]
struct RetryFailures {
    attempts_left: usize,
    bulkhead: Bulkhead,
    /// `in_flight()` seen at the start of each backoff.
    in_backoff: Arc<Mutex<Vec<usize>>>,
    /// Slots the test takes during a backoff, to saturate the bulkhead.
    steal_in_backoff: Arc<Mutex<Vec<Permit>>>,
    steal: bool,
}

impl tower::retry::Policy<u32, u32, BoxError> for RetryFailures {
    type Future = Pin<Box<dyn Future<Output = ()> + Send>>;

    fn retry(&mut self, _: &mut u32, result: &mut Result<u32, BoxError>) -> Option<Self::Future> {
        match result {
            Ok(_) => None,
            Err(error) if error.is::<ServiceSaturated>() => None,
            Err(_) if self.attempts_left == 0 => None,
            Err(_) => {
                self.attempts_left -= 1;
                self.in_backoff
                    .lock()
                    .unwrap()
                    .push(self.bulkhead.in_flight());
                if self.steal {
                    let permit = self.bulkhead.try_acquire().expect("the slot came back");
                    self.steal_in_backoff.lock().unwrap().push(permit);
                }
                Some(Box::pin(tokio::time::sleep(Duration::from_millis(10))))
            }
        }
    }

    fn clone_request(&mut self, request: &u32) -> Option<u32> {
        Some(*request)
    }
}

/// An inner service that fails its first `failures` attempts and records the
/// bulkhead's `in_flight()` during each attempt in `seen`.
#[derive(Clone)]
struct Flaky {
    failures: usize,
    attempts: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<usize>>>,
    bulkhead: Bulkhead,
}

impl Service<u32> for Flaky {
    type Response = u32;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<u32, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: u32) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            this.seen.lock().unwrap().push(this.bulkhead.in_flight());
            tokio::task::yield_now().await;
            if this.attempts.fetch_add(1, Ordering::SeqCst) < this.failures {
                Err("transient failure".into())
            } else {
                Ok(request)
            }
        })
    }
}

fn flaky(failures: usize, bulkhead: Bulkhead) -> (Flaky, Arc<Mutex<Vec<usize>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let service = Flaky {
        failures,
        attempts: Arc::default(),
        seen: seen.clone(),
        bulkhead,
    };
    (service, seen)
}

fn retry_policy(bulkhead: &Bulkhead, attempts: usize, steal: bool) -> RetryFailures {
    RetryFailures {
        attempts_left: attempts,
        bulkhead: bulkhead.clone(),
        in_backoff: Arc::default(),
        steal_in_backoff: Arc::default(),
        steal,
    }
}

#[tokio::test(start_paused = true)]
async fn under_retry_each_attempt_takes_and_returns_its_own_slot() {
    let layer = ConcurrencyLayer::new(Config::new(1, RECLAIM));
    let bulkhead = layer.bulkhead();
    let (inner, seen) = flaky(3, bulkhead.clone());
    let policy = retry_policy(&bulkhead, 3, false);
    let in_backoff = policy.in_backoff.clone();
    let mut service = ServiceBuilder::new()
        .retry(policy)
        .layer(layer)
        .service(inner);

    let answer = service.ready().await.unwrap().call(42).await.unwrap();
    assert_eq!(answer, 42);
    assert_eq!(
        *seen.lock().unwrap(),
        [1, 1, 1, 1],
        "each attempt holds exactly one slot"
    );
    assert_eq!(
        *in_backoff.lock().unwrap(),
        [0, 0, 0],
        "a call in backoff holds no slot"
    );
    assert_eq!(bulkhead.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn under_retry_a_shed_attempt_surfaces_service_saturated_and_is_not_retried() {
    let layer = ConcurrencyLayer::new(Config::new(1, RECLAIM).name("flaky"));
    let bulkhead = layer.bulkhead();
    let (inner, seen) = flaky(5, bulkhead.clone());
    // During the first backoff the test takes the only slot.
    let policy = retry_policy(&bulkhead, 5, true);
    let stolen = policy.steal_in_backoff.clone();
    let mut service = ServiceBuilder::new()
        .retry(policy)
        .layer(layer)
        .service(inner);

    let error = service.ready().await.unwrap().call(1).await.unwrap_err();
    let shed = shed_of(&error);
    assert_eq!(shed.reason(), ShedReason::LimitReached);
    assert_eq!(shed.name(), Some("flaky"));
    assert_eq!(
        seen.lock().unwrap().len(),
        1,
        "the shed retry must not reach the inner service"
    );
    assert_eq!(stolen.lock().unwrap().len(), 1);
    assert_eq!(bulkhead.in_flight(), 1, "only the stolen slot is held");
    stolen.lock().unwrap().clear();
    assert_eq!(bulkhead.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn concurrent_retried_calls_never_exceed_the_limit_together() {
    let layer = ConcurrencyLayer::new(Config::new(2, RECLAIM));
    let bulkhead = layer.bulkhead();
    let (inner, seen) = flaky(4, bulkhead.clone());
    let mut service = ServiceBuilder::new()
        .retry(retry_policy(&bulkhead, 4, false))
        .layer(layer)
        .service(inner);
    let a = service.ready().await.unwrap().call(1);
    let b = service.ready().await.unwrap().call(2);
    let (a, b) = tokio::join!(a, b);
    assert_eq!((a.unwrap(), b.unwrap()), (1, 2));
    assert!(seen.lock().unwrap().iter().all(|&n| (1..=2).contains(&n)));
    assert_eq!(bulkhead.in_flight(), 0);
}
