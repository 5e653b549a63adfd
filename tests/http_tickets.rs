//! Tickets over HTTP: a classifier over the request head, or a `Ticket` put
//! in the request's extensions by a middleware in front, gives each request
//! its priority and weight.

use axum::body::Body;
use axum::extract::Request as AxumRequest;
use axum::middleware::{self, Next};
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower::ServiceExt;
use tower_inflight::http::HttpConcurrencyLayer;
use tower_inflight::{Bulkhead, Config, QueueOrder, Ticket};

const RECLAIM: Duration = Duration::from_secs(30);

/// Reports how many slots are held while the handler runs.
fn in_flight_app(layer: HttpConcurrencyLayer) -> (Bulkhead, Router) {
    let bulkhead = layer.bulkhead();
    let app = Router::new()
        .route(
            "/",
            get({
                let bulkhead = bulkhead.clone();
                move || async move { bulkhead.in_flight().to_string() }
            }),
        )
        .layer(layer);
    (bulkhead, app)
}

async fn get_text(app: &Router, request: Request<Body>) -> (StatusCode, String) {
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

/// A request that asks, in its `x-weight` header, for `weight` slots.
fn weighing(weight: &str) -> Request<Body> {
    Request::get("/")
        .header("x-weight", weight)
        .body(Body::empty())
        .unwrap()
}

fn weight_header(parts: &http::request::Parts) -> Ticket {
    let weight = parts
        .headers
        .get("x-weight")
        .and_then(|value| value.to_str().ok()?.parse().ok())
        .unwrap_or(1);
    Ticket::new().weight(weight)
}

#[tokio::test]
async fn a_classified_request_holds_its_weight_in_slots_until_its_body_ends() {
    let layer = HttpConcurrencyLayer::new(Config::new(4, RECLAIM)).classify(weight_header);
    let (bulkhead, app) = in_flight_app(layer);
    let heavy = weighing("3");
    assert_eq!(get_text(&app, heavy).await, (StatusCode::OK, "3".into()));
    let plain = Request::get("/").body(Body::empty()).unwrap();
    assert_eq!(get_text(&app, plain).await, (StatusCode::OK, "1".into()));
    assert_eq!(bulkhead.in_flight(), 0);
}

#[tokio::test]
async fn a_request_heavier_than_the_free_slots_gets_503_and_one_heavier_than_the_limit_500() {
    let layer = HttpConcurrencyLayer::new(Config::new(4, RECLAIM)).classify(weight_header);
    let (bulkhead, app) = in_flight_app(layer);
    let held = bulkhead.try_acquire_weighted(2).unwrap();
    let request = weighing("3");
    let response = app.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(response.headers().contains_key(http::header::RETRY_AFTER));
    // A weight no retry can ever satisfy is the classifier's bug: 500.
    for weight in ["5", "0"] {
        let request = weighing(weight);
        let response = app.clone().oneshot(request).await.unwrap();
        assert_eq!(
            response.status(),
            StatusCode::INTERNAL_SERVER_ERROR,
            "weight {weight}"
        );
        assert!(!response.headers().contains_key(http::header::RETRY_AFTER));
    }
    assert_eq!(bulkhead.status().totals.rejected_limit, 1);
    assert_eq!(bulkhead.status().totals.rejected_invalid_weight, 2);
    drop(held);
    assert_eq!(bulkhead.in_flight(), 0);
}

#[tokio::test]
async fn a_ticket_in_the_extensions_sets_the_weight() {
    async fn heavy_if_asked(mut request: AxumRequest, next: Next) -> axum::response::Response {
        if request.headers().contains_key("x-heavy") {
            request.extensions_mut().insert(Ticket::new().weight(2));
        }
        next.run(request).await
    }
    let layer = HttpConcurrencyLayer::new(Config::new(4, RECLAIM)).ticket_from_extensions();
    let (bulkhead, app) = in_flight_app(layer);
    let app = app.layer(middleware::from_fn(heavy_if_asked));
    let heavy = Request::get("/")
        .header("x-heavy", "1")
        .body(Body::empty())
        .unwrap();
    assert_eq!(get_text(&app, heavy).await.1, "2");
    let plain = Request::get("/").body(Body::empty()).unwrap();
    assert_eq!(get_text(&app, plain).await.1, "1");
    assert_eq!(bulkhead.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn classified_priorities_order_the_waiting_requests() {
    let layer = HttpConcurrencyLayer::new(
        Config::new(1, RECLAIM)
            .wait(Duration::from_secs(10))
            .queue_order(QueueOrder::PriorityFifo),
    )
    .classify(|parts| {
        let priority = parts
            .headers
            .get("x-priority")
            .and_then(|value| value.to_str().ok()?.parse().ok())
            .unwrap_or(0);
        Ticket::new().priority(priority)
    });
    let bulkhead = layer.bulkhead();
    let log = Arc::new(Mutex::new(String::new()));
    let app = Router::new()
        .route(
            "/{name}",
            get({
                let log = log.clone();
                move |axum::extract::Path(name): axum::extract::Path<String>| async move {
                    log.lock().unwrap().push_str(&name);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }),
        )
        .layer(layer);
    let held = bulkhead.try_acquire().unwrap();
    let mut requests = Vec::new();
    for (name, priority) in [("a", "5"), ("b", "0"), ("c", "5"), ("d", "0")] {
        let request = Request::get(format!("/{name}"))
            .header("x-priority", priority)
            .body(Body::empty())
            .unwrap();
        // The slot lasts until the response body ends: read it in the task.
        let app = app.clone();
        requests.push(tokio::spawn(async move { get_text(&app, request).await.0 }));
        tokio::task::yield_now().await;
    }
    assert_eq!(bulkhead.waiting(), 4);
    drop(held);
    for request in requests {
        assert_eq!(request.await.unwrap(), StatusCode::OK);
    }
    assert_eq!(log.lock().unwrap().as_str(), "bdac");
    assert_eq!(bulkhead.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_classified_request_that_waits_in_vain_gets_503_without_reaching_the_handler() {
    let layer = HttpConcurrencyLayer::new(Config::new(1, RECLAIM).wait(Duration::from_millis(50)))
        .classify(weight_header);
    let (bulkhead, app) = in_flight_app(layer);
    let held = bulkhead.try_acquire().unwrap();
    let request = Request::get("/").body(Body::empty()).unwrap();
    let (status, _) = get_text(&app, request).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(bulkhead.status().totals.rejected_wait_expired, 1);
    drop(held);
    assert_eq!(bulkhead.in_flight(), 0);
    assert_eq!(bulkhead.waiting(), 0);
}

#[tokio::test]
async fn a_classified_response_holds_its_slots_until_its_body_has_been_read() {
    let layer = HttpConcurrencyLayer::new(Config::new(4, RECLAIM)).classify(weight_header);
    let (bulkhead, app) = in_flight_app(layer);
    let heavy = weighing("3");
    let response = app.oneshot(heavy).await.unwrap();
    assert_eq!(bulkhead.in_flight(), 3, "the body is not read yet");
    response.into_body().collect().await.unwrap();
    assert_eq!(bulkhead.in_flight(), 0);
}

/// An inner HTTP service whose `call` panics before it returns a future.
#[derive(Clone)]
struct PanicsInCall;

impl<B> tower::Service<Request<B>> for PanicsInCall {
    type Response = http::Response<Body>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<B>) -> Self::Future {
        panic!("inner call panicked")
    }
}

#[tokio::test]
async fn an_inner_call_that_panics_releases_its_slots_with_or_without_a_classifier() {
    let plain = HttpConcurrencyLayer::new(Config::new(4, RECLAIM));
    let classified = HttpConcurrencyLayer::new(Config::new(4, RECLAIM)).classify(weight_header);
    for layer in [plain, classified] {
        let bulkhead = layer.bulkhead();
        let service = tower::Layer::layer(&layer, PanicsInCall);
        let request = weighing("2");
        let joined = tokio::spawn(service.oneshot(request)).await;
        assert!(joined.unwrap_err().is_panic());
        assert_eq!(bulkhead.in_flight(), 0, "{layer:?}");
    }
}
