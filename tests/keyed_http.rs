//! The keyed HTTP layer on an axum router: a key from the request's head
//! (a header, an extension), 503 with Retry-After for a request shed, the
//! slots held until the response body ends.

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::request::Parts;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use std::time::Duration;
use tokio::sync::mpsc;
use tower::ServiceExt;
use tower_inflight::keyed::{KeyedConfig, KeyedHttpConcurrencyLayer};
use tower_inflight::Config;

const LONG: Duration = Duration::from_secs(30);

fn tenant(head: &Parts) -> String {
    head.headers
        .get("x-tenant")
        .and_then(|tenant| tenant.to_str().ok())
        .unwrap_or("anonymous")
        .to_owned()
}

fn request(tenant: &str) -> Request<Body> {
    Request::builder()
        .uri("/")
        .header("x-tenant", tenant)
        .body(Body::empty())
        .unwrap()
}

/// A route whose response body streams until the test sends on `more`.
fn streaming_app(
    layer: KeyedHttpConcurrencyLayer<String, fn(&Parts) -> String>,
) -> (Router, mpsc::UnboundedSender<()>) {
    let (more, rx) = mpsc::unbounded_channel::<()>();
    let rx = std::sync::Arc::new(tokio::sync::Mutex::new(rx));
    let app = Router::new()
        .route(
            "/",
            get(move || {
                let rx = rx.clone();
                async move {
                    let stream = futures_util::stream::once(async move {
                        rx.lock().await.recv().await;
                        Ok::<_, std::convert::Infallible>(axum::body::Bytes::from_static(b"done"))
                    });
                    Body::from_stream(stream)
                }
            }),
        )
        .layer(layer);
    (app, more)
}

#[tokio::test]
async fn a_tenant_over_its_limit_gets_503_with_retry_after_and_others_are_served() {
    let layer = KeyedHttpConcurrencyLayer::new(
        KeyedConfig::new(Config::new(1, LONG).retry_after(Duration::from_millis(1500))),
        tenant as fn(&Parts) -> String,
    );
    let keyed = layer.bulkhead();
    let (app, more) = streaming_app(layer);
    // Tenant a's response is out, its body still streaming: a's slot is held.
    let held = app.clone().oneshot(request("a")).await.unwrap();
    assert_eq!(held.status(), StatusCode::OK);
    let shed = app.clone().oneshot(request("a")).await.unwrap();
    assert_eq!(shed.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(shed.headers()["retry-after"], "2");
    // Tenant b is not a's.
    let other = app.clone().oneshot(request("b")).await.unwrap();
    assert_eq!(other.status(), StatusCode::OK);
    // a's body ends: its slot is free.
    more.send(()).unwrap();
    more.send(()).unwrap();
    assert_eq!(
        &held.into_body().collect().await.unwrap().to_bytes()[..],
        b"done"
    );
    drop(other.into_body().collect().await.unwrap());
    assert_eq!(keyed.status(10).busiest.len(), 0);
    let again = app.clone().oneshot(request("a")).await.unwrap();
    assert_eq!(again.status(), StatusCode::OK);
    drop(again);
    assert_eq!(
        keyed.status(10).busiest.len(),
        0,
        "a dropped body frees its slots"
    );
}

/// The key may come from the extensions (axum's `ConnectInfo`, or what an
/// earlier layer put there); a request that may wait is served once a slot
/// of its key's is freed.
#[tokio::test]
async fn a_request_keyed_by_an_extension_waits_for_its_key_s_slot() {
    #[derive(Clone)]
    struct Tenant(&'static str);
    let layer = KeyedHttpConcurrencyLayer::new(
        KeyedConfig::new(Config::new(1, LONG).wait(Duration::from_secs(10))),
        |head| {
            head.extensions
                .get::<Tenant>()
                .map_or("none", |tenant| tenant.0)
        },
    );
    let keyed = layer.bulkhead();
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let released = std::sync::Arc::new(std::sync::Mutex::new(Some(released)));
    let app = Router::new()
        .route(
            "/",
            get(move || {
                let gate = released.lock().unwrap().take();
                async move {
                    if let Some(gate) = gate {
                        let _ = gate.await;
                    }
                    "ok"
                }
            }),
        )
        .layer(layer);
    let with = |tenant| {
        let mut request = Request::builder().uri("/").body(Body::empty()).unwrap();
        request.extensions_mut().insert(Tenant(tenant));
        request
    };
    let first = tokio::spawn(app.clone().oneshot(with("a")));
    while keyed.status(1).busiest.is_empty() {
        tokio::task::yield_now().await;
    }
    let second = tokio::spawn(app.clone().oneshot(with("a")));
    while keyed
        .status(1)
        .busiest
        .first()
        .is_none_or(|key| key.waiting == 0)
    {
        tokio::task::yield_now().await;
    }
    assert_eq!(keyed.status(1).busiest[0].key, "a");
    release.send(()).unwrap();
    // The first request's slot is held until its body ends.
    for response in [first, second] {
        let response = response.await.unwrap().unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        drop(response.into_body().collect().await.unwrap());
    }
    let totals = keyed.status(0);
    assert_eq!((totals.keys, totals.refused_new_keys), (1, 0));
}

/// With every key held busy and no room for another, a new key is shed
/// with 503 and `Retry-After`, and nothing is kept for it.
#[tokio::test]
async fn a_new_key_past_max_keys_gets_503() {
    let layer = KeyedHttpConcurrencyLayer::new(
        KeyedConfig::new(Config::new(1, LONG)).max_keys(1),
        tenant as fn(&Parts) -> String,
    );
    let keyed = layer.bulkhead();
    let (app, more) = streaming_app(layer);
    let held = app.clone().oneshot(request("a")).await.unwrap();
    let shed = app.clone().oneshot(request("b")).await.unwrap();
    assert_eq!(shed.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(shed.headers().contains_key("retry-after"));
    let text = shed.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&text).contains("key"), "{text:?}");
    assert_eq!(keyed.keys(), 1);
    more.send(()).unwrap();
    drop(held.into_body().collect().await.unwrap());
    assert_eq!(
        app.oneshot(request("b")).await.unwrap().status(),
        StatusCode::OK
    );
}
