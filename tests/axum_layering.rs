//! Which axum 0.8 constructions keep a concurrency limit per service, and
//! which give one limit per connection, measured on a real server.
//!
//! Each test serves one construction with `axum::serve` on 127.0.0.1 and
//! opens `CLIENTS` connections at once, one request each. The handler counts
//! the calls inside it and holds every call at a gate until the test opens
//! it, so the count does not depend on how fast the machine is: a limit that
//! holds lets in `LIMIT` calls and no more (a hard bound), a limit per
//! connection lets in all of them (one request per HTTP/1.1 connection never
//! meets a limit of 8).
//!
//! Why, in axum 0.8.9: `get(handler)` keeps the handler boxed
//! (`MethodEndpoint::BoxedHandler`), and a layer added to it, through the
//! method router or the `Router`, is stored as a closure
//! (`BoxedIntoRoute::map`) that runs only when the handler becomes a `Route`
//! in `BoxedIntoRoute::into_route`. That happens in `Router::with_state`,
//! and `axum::serve(listener, router)` calls `with_state(())` for every
//! connection (`impl Service<IncomingStream> for Router<()>`). tower's
//! `ConcurrencyLimitLayer::layer` makes a new semaphore on each call; our
//! layers hand every service they build the one bulkhead they hold.

#![cfg(feature = "axum")]

mod support;

use support::{eventually, Gate, Meter};

use axum::error_handling::HandleErrorLayer;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::future::IntoFuture;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tower::layer::util::{Identity, Stack};
use tower::limit::ConcurrencyLimitLayer;
use tower::make::Shared;
use tower::util::BoxCloneSyncService;
use tower::{BoxError, Layer, Service, ServiceBuilder};
use tower_inflight::http::HttpConcurrencyLayer;
use tower_inflight::{ConcurrencyLayer, Config, ServiceSaturated};

const LIMIT: usize = 8;
/// Connections opened at once, one request each: four times the limit.
const CLIENTS: usize = 32;

/// How the handler is reached: it counts the calls inside it, and holds
/// each at the gate until the test opens it (or 10 s pass).
#[derive(Clone)]
struct Probe {
    meter: Meter,
    gate: Gate,
}

impl Probe {
    fn new() -> Self {
        Probe {
            meter: Meter::default(),
            gate: Gate::new(),
        }
    }

    fn current(&self) -> usize {
        self.meter.current.load(Ordering::SeqCst)
    }

    async fn visit(&self) {
        let _inside = self.meter.enter();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.gate.pass()).await;
        // Those that queued behind a limit come in while these are still here.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The handler, a closure without extractors: no state, so nothing calls
/// `with_state` but `axum::serve`.
fn handler(probe: &Probe) -> impl Fn() -> BoxFuture<'static, &'static str> + Clone + Send + Sync {
    let probe = probe.clone();
    move || {
        let probe = probe.clone();
        Box::pin(async move {
            probe.visit().await;
            "ok"
        })
    }
}

/// The same work as a service, for `route_service` and for wrapping outside;
/// any request body, since `HttpConcurrency` hands on a `Limited` one.
#[derive(Clone)]
struct Endpoint(Probe);

impl<B: Send + 'static> Service<http::Request<B>> for Endpoint {
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<B>) -> Self::Future {
        let probe = self.0.clone();
        Box::pin(async move {
            probe.visit().await;
            Ok("ok".into_response())
        })
    }
}

/// axum requires an infallible service: the generic layer's error becomes
/// its response here (503 for a shed call).
async fn answer(error: BoxError) -> Response {
    match error.downcast::<ServiceSaturated>() {
        Ok(shed) => shed.into_response(),
        Err(other) => (http::StatusCode::INTERNAL_SERVER_ERROR, other.to_string()).into_response(),
    }
}

fn tower_limit() -> ConcurrencyLimitLayer {
    ConcurrencyLimitLayer::new(LIMIT)
}

fn config() -> Config {
    Config::new(LIMIT, Duration::from_secs(30))
}

/// `ConcurrencyLayer` behind `HandleErrorLayer`, as axum requires.
type Answer = fn(BoxError) -> BoxFuture<'static, Response>;
type Ours = ServiceBuilder<Stack<ConcurrencyLayer, Stack<HandleErrorLayer<Answer, ()>, Identity>>>;

fn ours() -> Ours {
    let answer: Answer = |error| Box::pin(answer(error));
    ServiceBuilder::new()
        .layer(HandleErrorLayer::new(answer))
        .layer(ConcurrencyLayer::new(config()))
}

fn http_layer() -> HttpConcurrencyLayer {
    HttpConcurrencyLayer::new(config())
}

/// What `axum::serve` is given.
enum App {
    /// `axum::serve(listener, router)`: `with_state(())` per connection.
    Router(Router),
    /// `axum::serve(listener, router.into_make_service())`: `with_state(())` once.
    MakeService(Router),
    /// `axum::serve(listener, Shared::new(service))`: the service cloned per connection.
    Shared(BoxCloneSyncService<Request, Response, Infallible>),
}

/// The constructions under test, each with the layer expression `$layer`.
macro_rules! app {
    // 1. The method router's `route_layer`.
    (method_route_layer, $layer:expr, $probe:expr) => {
        App::Router(Router::new().route("/", get(handler($probe)).route_layer($layer)))
    };
    // 2. The method router's `layer`.
    (method_layer, $layer:expr, $probe:expr) => {
        App::Router(Router::new().route("/", get(handler($probe)).layer($layer)))
    };
    // 3. The router's `route_layer`.
    (router_route_layer, $layer:expr, $probe:expr) => {
        App::Router(
            Router::new()
                .route("/", get(handler($probe)))
                .route_layer($layer),
        )
    };
    // 4. The router's `layer`.
    (router_layer, $layer:expr, $probe:expr) => {
        App::Router(Router::new().route("/", get(handler($probe))).layer($layer))
    };
    // 5. A layered service rather than a handler.
    (route_service, $layer:expr, $probe:expr) => {
        App::Router(
            Router::new().route_service(
                "/",
                ServiceBuilder::new()
                    .layer($layer)
                    .service(Endpoint($probe.clone())),
            ),
        )
    };
    // 6. The whole router wrapped outside, served with `Shared`.
    (around_router, $layer:expr, $probe:expr) => {
        App::Shared(BoxCloneSyncService::new(
            ServiceBuilder::new()
                .map_response(IntoResponse::into_response)
                .layer($layer)
                .service(Router::new().route("/", get(handler($probe)))),
        ))
    };
}

async fn serve(app: App) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // Each make-service is built here, before the server task starts.
    match app {
        App::Router(router) => tokio::spawn(axum::serve(listener, router).into_future()),
        App::MakeService(router) => {
            tokio::spawn(axum::serve(listener, router.into_make_service()).into_future())
        }
        App::Shared(service) => {
            tokio::spawn(axum::serve(listener, Shared::new(service)).into_future())
        }
    };
    addr
}

/// A keep-alive connection of its own.
async fn connect(addr: SocketAddr) -> hyper::client::conn::http1::SendRequest<Empty<Bytes>> {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    sender
}

/// One GET on `sender`; the status, once the whole body is read.
async fn get_status(sender: &mut hyper::client::conn::http1::SendRequest<Empty<Bytes>>) -> u16 {
    let request = http::Request::get("/")
        .header(http::header::HOST, "test")
        .body(Empty::new())
        .unwrap();
    let exchange = async {
        sender.ready().await.unwrap();
        let response = sender.send_request(request).await.unwrap();
        let status = response.status().as_u16();
        response.into_body().collect().await.unwrap();
        status
    };
    tokio::time::timeout(Duration::from_secs(20), exchange)
        .await
        .expect("no answer in 20 s")
}

/// What a construction should do with `CLIENTS` connections at a limit of
/// `LIMIT`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Expect {
    /// One limit for the route: at most `LIMIT` calls inside at once.
    Holds,
    /// One limit per connection: every connection's call gets in.
    PerConnection,
}

struct Outcome {
    peak: usize,
    statuses: Vec<u16>,
}

impl Outcome {
    fn count(&self, status: u16) -> usize {
        self.statuses.iter().filter(|&&s| s == status).count()
    }
}

/// Opens `CLIENTS` connections at once, one request each, and holds the
/// calls that got in at the gate until the construction showed what it
/// does: all `CLIENTS` inside (a limit per connection), or `LIMIT` inside
/// and the rest shed or queued for a while (a limit that holds).
async fn drive(name: &str, app: App, probe: &Probe, expect: Expect) -> Outcome {
    let addr = serve(app).await;
    let finished = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let finished = finished.clone();
            tokio::spawn(async move {
                let mut sender = connect(addr).await;
                let status = get_status(&mut sender).await;
                finished.fetch_add(1, Ordering::SeqCst);
                status
            })
        })
        .collect();

    match expect {
        Expect::PerConnection => {
            eventually("every connection's call inside the handler at once", || {
                probe.current() == CLIENTS
            })
            .await;
        }
        Expect::Holds => {
            eventually("the limit's worth of calls inside the handler", || {
                probe.current() >= LIMIT
            })
            .await;
            // A shedding limiter answers the rest at once; a queueing one
            // keeps them waiting, so give them a while to (wrongly) get in.
            for _ in 0..50 {
                if finished.load(Ordering::SeqCst) >= CLIENTS - LIMIT {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    probe.gate.open(CLIENTS);
    let mut statuses = Vec::new();
    for client in clients {
        statuses.push(client.await.unwrap());
    }
    let outcome = Outcome {
        peak: probe.meter.peak(),
        statuses,
    };
    println!(
        "{name}: peak {} inside at a limit of {LIMIT}, {CLIENTS} connections: {} x 200, {} x 503",
        outcome.peak,
        outcome.count(200),
        outcome.count(503),
    );
    outcome
}

/// tower's `ConcurrencyLimit` queues: every call is served in the end.
async fn assert_tower(name: &str, app: App, probe: Probe, expect: Expect) {
    let outcome = drive(name, app, &probe, expect).await;
    assert_eq!(
        outcome.count(200),
        CLIENTS,
        "{name}: {:?}",
        outcome.statuses
    );
    match expect {
        Expect::Holds => assert!(
            outcome.peak <= LIMIT,
            "{name}: {} calls inside at once at a limit of {LIMIT}",
            outcome.peak
        ),
        Expect::PerConnection => assert_eq!(
            outcome.peak, CLIENTS,
            "{name}: expected one limit per connection"
        ),
    }
}

/// Ours sheds at once (no wait budget): at most `LIMIT` inside, at least
/// `LIMIT` served, the rest answered 503.
async fn assert_ours(name: &str, app: App, probe: Probe) {
    let outcome = drive(name, app, &probe, Expect::Holds).await;
    assert!(
        outcome.peak <= LIMIT,
        "{name}: {} calls inside at once at a limit of {LIMIT}",
        outcome.peak
    );
    assert!(
        outcome.count(200) >= LIMIT,
        "{name}: {:?}",
        outcome.statuses
    );
    assert_eq!(
        outcome.count(200) + outcome.count(503),
        CLIENTS,
        "{name}: {:?}",
        outcome.statuses
    );
}

// tower's `ConcurrencyLimitLayer`: a new semaphore per `layer()` call.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tower_method_route_layer_is_per_connection() {
    let probe = Probe::new();
    let app = app!(method_route_layer, tower_limit(), &probe);
    assert_tower(
        "tower get(h).route_layer",
        app,
        probe,
        Expect::PerConnection,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tower_method_layer_is_per_connection() {
    let probe = Probe::new();
    let app = app!(method_layer, tower_limit(), &probe);
    assert_tower("tower get(h).layer", app, probe, Expect::PerConnection).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tower_router_route_layer_is_per_connection() {
    let probe = Probe::new();
    let app = app!(router_route_layer, tower_limit(), &probe);
    assert_tower(
        "tower Router::route_layer",
        app,
        probe,
        Expect::PerConnection,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tower_router_layer_is_per_connection() {
    let probe = Probe::new();
    let app = app!(router_layer, tower_limit(), &probe);
    assert_tower("tower Router::layer", app, probe, Expect::PerConnection).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tower_route_service_holds() {
    let probe = Probe::new();
    let app = app!(route_service, tower_limit(), &probe);
    assert_tower("tower route_service", app, probe, Expect::Holds).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tower_around_router_holds() {
    let probe = Probe::new();
    let app = app!(around_router, tower_limit(), &probe);
    assert_tower("tower around the router", app, probe, Expect::Holds).await;
}

/// `with_state(())` at build time turns the handler into a `Route` once, so
/// the per-connection `with_state(())` of `axum::serve` finds nothing left
/// to layer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tower_method_route_layer_holds_after_with_state() {
    let probe = Probe::new();
    let App::Router(router) = app!(method_route_layer, tower_limit(), &probe) else {
        unreachable!()
    };
    let app = App::Router(router.with_state(()));
    assert_tower(
        "tower get(h).route_layer + with_state(())",
        app,
        probe,
        Expect::Holds,
    )
    .await;
}

/// `into_make_service` calls `with_state(())` once, likewise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tower_router_layer_holds_with_into_make_service() {
    let probe = Probe::new();
    let App::Router(router) = app!(router_layer, tower_limit(), &probe) else {
        unreachable!()
    };
    let app = App::MakeService(router);
    assert_tower(
        "tower Router::layer + into_make_service",
        app,
        probe,
        Expect::Holds,
    )
    .await;
}

// `ConcurrencyLayer` behind `HandleErrorLayer`: one bulkhead in the layer.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ours_method_route_layer_holds() {
    let probe = Probe::new();
    let app = app!(method_route_layer, ours(), &probe);
    assert_ours("ours get(h).route_layer", app, probe).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ours_method_layer_holds() {
    let probe = Probe::new();
    let app = app!(method_layer, ours(), &probe);
    assert_ours("ours get(h).layer", app, probe).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ours_router_route_layer_holds() {
    let probe = Probe::new();
    let app = app!(router_route_layer, ours(), &probe);
    assert_ours("ours Router::route_layer", app, probe).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ours_router_layer_holds() {
    let probe = Probe::new();
    let app = app!(router_layer, ours(), &probe);
    assert_ours("ours Router::layer", app, probe).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ours_route_service_holds() {
    let probe = Probe::new();
    let app = app!(route_service, ours(), &probe);
    assert_ours("ours route_service", app, probe).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ours_around_router_holds() {
    let probe = Probe::new();
    let app = app!(around_router, ours(), &probe);
    assert_ours("ours around the router", app, probe).await;
}

// `HttpConcurrencyLayer`: infallible already, the same bulkhead in the layer.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_method_route_layer_holds() {
    let probe = Probe::new();
    let app = app!(method_route_layer, http_layer(), &probe);
    assert_ours("http get(h).route_layer", app, probe).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_method_layer_holds() {
    let probe = Probe::new();
    let app = app!(method_layer, http_layer(), &probe);
    assert_ours("http get(h).layer", app, probe).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_router_route_layer_holds() {
    let probe = Probe::new();
    let app = app!(router_route_layer, http_layer(), &probe);
    assert_ours("http Router::route_layer", app, probe).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_router_layer_holds() {
    let probe = Probe::new();
    let app = app!(router_layer, http_layer(), &probe);
    assert_ours("http Router::layer", app, probe).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_route_service_holds() {
    let probe = Probe::new();
    let app = app!(route_service, http_layer(), &probe);
    assert_ours("http route_service", app, probe).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_around_router_holds() {
    let probe = Probe::new();
    let app = app!(around_router, http_layer(), &probe);
    assert_ours("http around the router", app, probe).await;
}

/// A layer that counts its `layer()` calls.
#[derive(Clone)]
struct Counted<L> {
    inner: L,
    calls: Arc<AtomicUsize>,
}

impl<S, L: Layer<S>> Layer<S> for Counted<L> {
    type Service = L::Service;

    fn layer(&self, inner: S) -> Self::Service {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.layer(inner)
    }
}

/// `CONNECTIONS` keep-alive connections, `REQUESTS` requests one after
/// another on each; how many more times `layer()` ran than at build time.
async fn layer_calls_while_serving(app: App, calls: &AtomicUsize) -> usize {
    const CONNECTIONS: usize = 3;
    const REQUESTS: usize = 4;
    let addr = serve(app).await;
    let built = calls.load(Ordering::SeqCst);
    for _ in 0..CONNECTIONS {
        let mut sender = connect(addr).await;
        for _ in 0..REQUESTS {
            assert_eq!(get_status(&mut sender).await, 200);
        }
    }
    calls.load(Ordering::SeqCst) - built
}

/// The same router, `get(handler).route_layer(L)`, served three ways: axum
/// layers the handler once per connection when given the router, once in
/// all when given `into_make_service()`, and once per request when the
/// router is used as a plain service (then nothing calls `with_state`, and
/// `MethodRouter::call_with_state` turns the boxed handler into a `Route`
/// for each call).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layer_calls_per_connection_once_or_per_request() {
    let probe = Probe::new();
    probe.gate.open(1_000);
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = || Counted {
        inner: tower_limit(),
        calls: calls.clone(),
    };
    let router = || Router::new().route("/", get(handler(&probe)).route_layer(counted()));

    let per_connection = layer_calls_while_serving(App::Router(router()), &calls).await;
    let once = layer_calls_while_serving(App::MakeService(router()), &calls).await;
    let per_request =
        layer_calls_while_serving(App::Shared(BoxCloneSyncService::new(router())), &calls).await;
    println!(
        "layer() calls while serving 3 connections x 4 requests: axum::serve(router) {per_connection}, \
         into_make_service() {once}, Shared::new(router) {per_request}"
    );
    assert_eq!(per_connection, 3, "axum::serve(listener, router)");
    assert_eq!(once, 0, "axum::serve(listener, router.into_make_service())");
    assert_eq!(
        per_request, 12,
        "axum::serve(listener, Shared::new(router))"
    );
}
