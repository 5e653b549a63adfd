//! Adaptive limits behind the HTTP layer: a 503, a 429 and the other 5xx
//! are drops, any other response a sample of latency measured when its
//! head arrives, though the slot is held until the body ends; a refusal by
//! a bulkhead further in is no sample.

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower::{service_fn, Service, ServiceBuilder, ServiceExt};
use tower_inflight::adaptive::{Adaptive, Algorithm, Outcome, Sample};
use tower_inflight::http::HttpConcurrencyLayer;
use tower_inflight::{BoxError, Config, ManualClock};

#[derive(Clone, Default)]
struct Recording(Arc<Mutex<Vec<Sample>>>);

impl Algorithm for Recording {
    fn update(&mut self, sample: &Sample, limit: usize) -> usize {
        self.0.lock().unwrap().push(*sample);
        limit
    }
}

/// A layer of four slots whose adaptive limit records every sample.
fn recording_layer() -> (Recording, HttpConcurrencyLayer) {
    let recording = Recording::default();
    let layer = HttpConcurrencyLayer::new(
        Config::new(4, Duration::from_secs(30)).adaptive(Adaptive::new(recording.clone())),
    );
    (recording, layer)
}

#[tokio::test]
async fn server_errors_and_429_are_drops_400_408_413_are_nothing_and_other_answers_are_samples() {
    let recording = Recording::default();
    let clock = ManualClock::new();
    let layer = HttpConcurrencyLayer::new(
        Config::new(4, Duration::from_secs(30))
            .clock(clock.clone())
            .adaptive(Adaptive::new(recording.clone())),
    );
    let mut service = ServiceBuilder::new().layer(layer).service(service_fn({
        let clock = clock.clone();
        move |request: Request<_>| {
            let clock = clock.clone();
            async move {
                let status: u16 = request.uri().path()[1..].parse().unwrap();
                clock.advance(Duration::from_millis(u64::from(status)));
                Ok::<_, BoxError>(
                    Response::builder()
                        .status(status)
                        .body(Full::new(Bytes::from_static(b"body")))
                        .unwrap(),
                )
            }
        }
    }));
    for status in [200u16, 404, 503, 429, 500, 408, 400, 413] {
        let request = Request::get(format!("/{status}"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let response = service.ready().await.unwrap().call(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::from_u16(status).unwrap());
        // Reading the body later adds nothing to the latency sampled.
        clock.advance(Duration::from_secs(1));
        response.into_body().collect().await.unwrap();
    }
    let samples = recording.0.lock().unwrap().clone();
    let seen: Vec<(Duration, bool)> = samples
        .iter()
        .map(|sample| (sample.latency, sample.dropped))
        .collect();
    let expected: Vec<(Duration, bool)> = [
        (200, false),
        (404, false),
        (503, true),
        (429, true),
        (500, true),
        // 408, 400, 413: the request's body did not come as it should (an
        // upload cut by a timeout, malformed, over a limit): the client's
        // time, not the dependency's.
    ]
    .into_iter()
    .map(|(ms, dropped)| (Duration::from_millis(ms), dropped))
    .collect();
    assert_eq!(seen, expected);
}

/// A handler that did no work (a cache hit) says so with an `Outcome` in
/// its response's extensions, and one that knows its dependency was
/// overloaded says that: the layer takes either over the status's reading.
#[tokio::test]
async fn an_outcome_in_the_response_s_extensions_is_taken_over_its_status() {
    let (recording, layer) = recording_layer();
    let mut service =
        ServiceBuilder::new()
            .layer(layer)
            .service(service_fn(|request: Request<_>| async move {
                let mut response = Response::new(Full::new(Bytes::new()));
                match request.uri().path() {
                    "/cached" => response.extensions_mut().insert(Outcome::Ignore),
                    "/overloaded" => response.extensions_mut().insert(Outcome::Dropped),
                    "/unavailable-from-cache" => {
                        *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                        response.extensions_mut().insert(Outcome::Ignore)
                    }
                    _ => None,
                };
                Ok::<_, BoxError>(response)
            }));
    for path in [
        "/cached",
        "/overloaded",
        "/unavailable-from-cache",
        "/served",
    ] {
        let request = Request::get(path).body(Full::new(Bytes::new())).unwrap();
        let response = service.ready().await.unwrap().call(request).await.unwrap();
        response.into_body().collect().await.unwrap();
    }
    let dropped: Vec<bool> = recording
        .0
        .lock()
        .unwrap()
        .iter()
        .map(|s| s.dropped)
        .collect();
    assert_eq!(
        dropped,
        [true, false],
        "the cache hit was sampled, or the drop was not"
    );
}

/// Behind the keyed HTTP layer, a handler's `Outcome` is taken as behind
/// the plain one.
#[tokio::test]
async fn behind_the_keyed_layer_a_response_s_outcome_is_taken_too() {
    use tower_inflight::keyed::{KeyedConfig, KeyedHttpConcurrencyLayer};
    let recording = Recording::default();
    let keyed = KeyedHttpConcurrencyLayer::new(
        KeyedConfig::new(
            Config::new(4, Duration::from_secs(30)).adaptive(Adaptive::new(recording.clone())),
        ),
        |head: &http::request::Parts| head.uri.path().to_owned(),
    );
    let mut service =
        ServiceBuilder::new()
            .layer(keyed)
            .service(service_fn(|_: Request<_>| async {
                let mut response = Response::new(Full::new(Bytes::new()));
                response.extensions_mut().insert(Outcome::Ignore);
                Ok::<_, BoxError>(response)
            }));
    let request = Request::get("/cached")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = service.ready().await.unwrap().call(request).await.unwrap();
    response.into_body().collect().await.unwrap();
    assert!(
        recording.0.lock().unwrap().is_empty(),
        "a key's cache hit was sampled"
    );
}

#[tokio::test]
async fn a_body_refused_by_a_bulkhead_further_in_is_no_sample() {
    let (recording, outer) = recording_layer();
    let inner = HttpConcurrencyLayer::new(Config::new(4, Duration::from_secs(30))).max_body(10);
    let mut service = ServiceBuilder::new()
        .layer(outer)
        .layer(inner)
        .service(service_fn(|_: Request<_>| async {
            Ok::<_, BoxError>(Response::new(Full::new(Bytes::new())))
        }));
    let request = Request::post("/")
        .header(http::header::CONTENT_LENGTH, "100")
        .body(Full::new(Bytes::from(vec![0; 100])))
        .unwrap();
    let response = service.ready().await.unwrap().call(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    drop(response);
    assert!(recording.0.lock().unwrap().is_empty());
}

/// A refusal by a bulkhead further in never reached the dependency: it is
/// no sample, plain or with an `on_shed` response that says
/// `Outcome::Dropped`.
#[tokio::test]
async fn a_refusal_by_a_bulkhead_further_in_is_no_sample() {
    for tagged in [false, true] {
        a_refusal_further_in_is_no_sample(tagged).await;
    }
}

async fn a_refusal_further_in_is_no_sample(tagged: bool) {
    let (recording, outer) = recording_layer();
    let mut inner = HttpConcurrencyLayer::new(Config::new(1, Duration::from_secs(30)));
    if tagged {
        inner = inner.on_shed(|_| {
            let mut response = Response::new(Bytes::from_static(b"overloaded"));
            *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            response.extensions_mut().insert(Outcome::Dropped);
            response
        });
    }
    let held = inner.bulkhead().try_acquire().unwrap();
    let mut service = ServiceBuilder::new()
        .layer(outer)
        .layer(inner)
        .service(service_fn(|_: Request<_>| async {
            Ok::<_, BoxError>(Response::new(Full::new(Bytes::new())))
        }));
    let request = Request::get("/").body(Full::new(Bytes::new())).unwrap();
    let response = service.ready().await.unwrap().call(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    drop(response);
    assert!(recording.0.lock().unwrap().is_empty());
    drop(held);
    let request = Request::get("/").body(Full::new(Bytes::new())).unwrap();
    let response = service.ready().await.unwrap().call(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(recording.0.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn an_inner_timeout_error_is_a_drop_and_another_error_nothing() {
    let (recording, layer) = recording_layer();
    let mut service =
        ServiceBuilder::new()
            .layer(layer)
            .service(service_fn(|request: Request<_>| async move {
                if request.uri().path() == "/timeout" {
                    Err::<Response<Full<Bytes>>, BoxError>(
                        tower::timeout::error::Elapsed::new().into(),
                    )
                } else {
                    Err("refused before any I/O".into())
                }
            }));
    for path in ["/timeout", "/other"] {
        let request = Request::get(path).body(Full::new(Bytes::new())).unwrap();
        assert!(service.ready().await.unwrap().call(request).await.is_err());
    }
    let samples = recording.0.lock().unwrap().clone();
    assert_eq!(samples.len(), 1);
    assert!(samples[0].dropped);
}
