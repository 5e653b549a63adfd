//! The server under test: one axum handler standing in for a dependency,
//! served behind each variant in turn.

pub(crate) use crate::demo::serve;
use crate::demo::Counted;
use axum::error_handling::HandleErrorLayer;
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use http::StatusCode;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tower::limit::{ConcurrencyLimitLayer, GlobalConcurrencyLimitLayer};
use tower::load_shed::LoadShedLayer;
use tower::{BoxError, Layer, ServiceBuilder};
use tower_inflight::http::HttpConcurrencyLayer;
use tower_inflight::{ConcurrencyLayer, Config};
use tower_resilience_bulkhead::{BulkheadLayer, BulkheadServiceError};

/// What the handler stands in for: a dependency that serves `capacity` calls
/// at once, `service_us` each; the calls beyond that wait in its line (FIFO),
/// as at a connection pool or a thread pool, so that a pile-up slows every
/// call behind it.
#[derive(Debug)]
pub(crate) struct Dependency {
    service_us: AtomicU64,
    workers: Semaphore,
    /// Calls inside the handler now (served or in the line), and the most
    /// seen at once.
    pub(crate) inside: AtomicUsize,
    pub(crate) peak_inside: AtomicUsize,
    /// Requests anywhere in the server now: inside, or parked in a limiter.
    pub(crate) in_process: AtomicUsize,
    /// Calls served to their end since the last `take_work`, and the time
    /// they held a worker, in microseconds.
    served: AtomicU64,
    busy_us: AtomicU64,
}

impl Dependency {
    pub(crate) fn new(service_time: Duration, capacity: usize) -> Arc<Self> {
        let dependency = Arc::new(Self {
            service_us: AtomicU64::new(0),
            workers: Semaphore::new(capacity),
            inside: AtomicUsize::new(0),
            peak_inside: AtomicUsize::new(0),
            in_process: AtomicUsize::new(0),
            served: AtomicU64::new(0),
            busy_us: AtomicU64::new(0),
        });
        dependency.set_service_time(service_time);
        dependency
    }

    pub(crate) fn set_service_time(&self, service_time: Duration) {
        self.service_us
            .store(service_time.as_micros() as u64, Ordering::SeqCst);
    }

    pub(crate) fn take_peak(&self) -> usize {
        self.peak_inside
            .swap(self.inside.load(Ordering::SeqCst), Ordering::SeqCst)
    }

    /// The calls served since the last call, and their mean time on a worker.
    pub(crate) fn take_work(&self) -> (u64, Duration) {
        let served = self.served.swap(0, Ordering::SeqCst);
        let busy_us = self.busy_us.swap(0, Ordering::SeqCst);
        (served, Duration::from_micros(busy_us / served.max(1)))
    }
}

async fn handler(State(dependency): State<Arc<Dependency>>) -> &'static str {
    let (_inside, now) = Counted::new(&dependency.inside);
    dependency.peak_inside.fetch_max(now, Ordering::SeqCst);
    let _worker = dependency.workers.acquire().await.expect("never closed");
    let started = Instant::now();
    let service_time = Duration::from_micros(dependency.service_us.load(Ordering::SeqCst));
    tokio::time::sleep(service_time).await;
    let busy = started.elapsed().as_micros() as u64;
    dependency.busy_us.fetch_add(busy, Ordering::SeqCst);
    dependency.served.fetch_add(1, Ordering::SeqCst);
    "ok"
}

async fn count_in_process(
    State(dependency): State<Arc<Dependency>>,
    request: Request,
    next: Next,
) -> Response {
    let (_in_process, _) = Counted::new(&dependency.in_process);
    next.run(request).await
}

async fn overloaded<E>(_: E) -> impl IntoResponse {
    (StatusCode::SERVICE_UNAVAILABLE, "overloaded")
}

/// The limiters compared, all with the same limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Variant {
    NoLimit,
    TowerQueue,
    TowerShed,
    Resilience,
    Ours,
    OursGeneric,
    OursWait,
}

impl Variant {
    pub(crate) const ALL: [Variant; 7] = [
        Variant::NoLimit,
        Variant::TowerQueue,
        Variant::TowerShed,
        Variant::Resilience,
        Variant::Ours,
        Variant::OursGeneric,
        Variant::OursWait,
    ];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Variant::NoLimit => "no limit",
            Variant::TowerQueue => "tower GlobalConcurrencyLimit",
            Variant::TowerShed => "tower GlobalConcurrencyLimit+LoadShed",
            Variant::Resilience => "tower-resilience-bulkhead",
            Variant::Ours => "tower-inflight",
            Variant::OursGeneric => "tower-inflight generic layer",
            Variant::OursWait => "tower-inflight wait=1 service",
        }
    }

    pub(crate) fn is_ours(self) -> bool {
        matches!(
            self,
            Variant::Ours | Variant::OursGeneric | Variant::OursWait
        )
    }

    /// The app: the handler behind this variant's limiter, behind a counter
    /// of requests in the process.
    pub(crate) fn app(
        self,
        limit: usize,
        service_time: Duration,
        dependency: Arc<Dependency>,
    ) -> Router {
        let route = Router::new().route("/", get(handler));
        let limited = match self {
            Variant::NoLimit => route,
            Variant::TowerQueue => route.layer(GlobalConcurrencyLimitLayer::new(limit)),
            Variant::TowerShed => route.layer(
                ServiceBuilder::new()
                    .layer(HandleErrorLayer::new(overloaded::<BoxError>))
                    .layer(LoadShedLayer::new())
                    .layer(GlobalConcurrencyLimitLayer::new(limit)),
            ),
            Variant::Resilience => route.layer(
                ServiceBuilder::new()
                    .layer(HandleErrorLayer::new(
                        overloaded::<BulkheadServiceError<Infallible>>,
                    ))
                    .layer(
                        BulkheadLayer::builder()
                            .max_concurrent_calls(limit)
                            .reject_when_full()
                            .build()
                            .expect("a valid bulkhead"),
                    ),
            ),
            Variant::Ours => route.layer(HttpConcurrencyLayer::new(ours(limit))),
            // The generic layer behind `HandleErrorLayer`, as the tower peers
            // are: it frees the slot when the handler's future completes,
            // where the HTTP layer holds it until the response body ends.
            Variant::OursGeneric => route.layer(
                ServiceBuilder::new()
                    .layer(HandleErrorLayer::new(overloaded::<BoxError>))
                    .layer(ConcurrencyLayer::new(ours(limit))),
            ),
            Variant::OursWait => {
                route.layer(HttpConcurrencyLayer::new(ours(limit).wait(service_time)))
            }
        };
        limited
            .layer(middleware::from_fn_with_state(
                dependency.clone(),
                count_in_process,
            ))
            .with_state(dependency)
    }
}

fn ours(limit: usize) -> Config {
    Config::new(limit, Duration::from_secs(30)).name("dependency")
}

/// The trap: a limiting layer applied once *per connection*, as a hand-rolled
/// hyper accept loop (or a per-connection make-service) does. tower's
/// `ConcurrencyLimitLayer` makes a new semaphore in every `layer()` call, so
/// each connection gets its own limit; our layer holds its bulkhead in the
/// layer value, so every connection shares it.
pub(crate) async fn serve_layered_per_connection<L, B>(
    layer: L,
    app: Router,
) -> (SocketAddr, tokio::task::JoinHandle<()>)
where
    L: Layer<Router> + Send + 'static,
    L::Service: tower::Service<
            Request<hyper::body::Incoming>,
            Response = http::Response<B>,
            Error = Infallible,
        > + Clone
        + Send
        + 'static,
    <L::Service as tower::Service<Request<hyper::body::Incoming>>>::Future: Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1");
    let addr = listener.local_addr().expect("local addr");
    let server = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let service = hyper_util::service::TowerToHyperService::new(layer.layer(app.clone()));
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, server)
}

pub(crate) fn tower_per_connection(limit: usize) -> ConcurrencyLimitLayer {
    ConcurrencyLimitLayer::new(limit)
}

pub(crate) fn ours_per_connection(limit: usize) -> HttpConcurrencyLayer {
    HttpConcurrencyLayer::new(ours(limit))
}
