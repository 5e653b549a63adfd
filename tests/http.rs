//! The HTTP layer against a real axum server on 127.0.0.1 and a real client.

mod support;

use support::{assert_all_returned, eventually, Gate};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::routing::{get, post};
use axum::{Extension, Router};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tower::ServiceExt;
use tower_inflight::http::{HttpConcurrencyLayer, ReservedBytes};
use tower_inflight::{Bulkhead, Config};

fn app(layer: HttpConcurrencyLayer, gate: Gate) -> Router {
    Router::new()
        .route(
            "/slow",
            get(|State(gate): State<Gate>| async move {
                gate.pass().await;
                "done"
            }),
        )
        .route(
            "/upload",
            post(|State(gate): State<Gate>, body: Bytes| async move {
                gate.pass().await;
                body.len().to_string()
            }),
        )
        .route(
            "/stream",
            get(|State(gate): State<Gate>| async move {
                // The headers go out at once; the rest waits for the gate.
                let chunks = futures_util::stream::unfold(0, move |sent| {
                    let gate = gate.clone();
                    async move {
                        if sent == 2 {
                            return None;
                        }
                        if sent == 1 {
                            gate.pass().await;
                        }
                        Some((Ok::<_, Infallible>(Bytes::from_static(b"chunk ")), sent + 1))
                    }
                });
                Body::from_stream(chunks)
            }),
        )
        .route(
            "/keep-bytes",
            post(
                |Extension(reserved): Extension<ReservedBytes>,
                 State(gate): State<Gate>,
                 body: Bytes| async move {
                    let bytes = reserved.take();
                    tokio::spawn(async move {
                        gate.pass().await;
                        drop((bytes, body));
                    });
                    "accepted"
                },
            ),
        )
        .with_state(gate)
        .layer(layer)
}

async fn serve(router: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
}

fn client<B>() -> Client<HttpConnector, B>
where
    B: hyper::body::Body + Send + 'static + Unpin,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    Client::builder(TokioExecutor::new()).build_http()
}

fn get_req(addr: SocketAddr, path: &str) -> Request<Full<Bytes>> {
    Request::get(format!("http://{addr}{path}"))
        .body(Full::default())
        .unwrap()
}

fn upload_req(addr: SocketAddr, path: &str, len: usize) -> Request<Full<Bytes>> {
    Request::post(format!("http://{addr}{path}"))
        .body(Full::new(Bytes::from(vec![b'x'; len])))
        .unwrap()
}

fn config(limit: usize) -> Config {
    Config::new(limit, Duration::from_secs(30)).name("http-test")
}

/// Sends raw bytes on a fresh connection and returns the status line's code.
async fn raw_status(addr: SocketAddr, request: &str) -> u16 {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = vec![0; 1024];
    let n = stream.read(&mut response).await.unwrap();
    let head = String::from_utf8_lossy(&response[..n]).to_string();
    head.split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"))
}

#[tokio::test]
async fn full_bulkhead_answers_503_with_retry_after() {
    let layer = HttpConcurrencyLayer::new(config(1)).retry_after(Duration::from_millis(2500));
    let bulkhead = layer.bulkhead();
    let gate = Gate::new();
    let addr = serve(app(layer, gate.clone())).await;
    let client = client();

    let first = tokio::spawn(client.request(get_req(addr, "/slow")));
    eventually("the first request holds the slot", || {
        bulkhead.in_flight() == 1
    })
    .await;

    let shed = client.request(get_req(addr, "/slow")).await.unwrap();
    assert_eq!(shed.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(shed.headers()["retry-after"], "3");
    let text = shed.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&text).contains("http-test"));

    gate.open(1);
    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::OK);
    assert_all_returned(&bulkhead).await;
}

#[tokio::test]
async fn streaming_response_holds_its_slot_until_the_client_has_read_it() {
    let layer = HttpConcurrencyLayer::new(config(4));
    let bulkhead = layer.bulkhead();
    let gate = Gate::new();
    let addr = serve(app(layer, gate.clone())).await;

    let response = client().request(get_req(addr, "/stream")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    // Headers are in, the body is not finished: the slot is still held.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(bulkhead.in_flight(), 1);

    gate.open(1);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"chunk chunk ");
    assert_all_returned(&bulkhead).await;
}

#[tokio::test]
async fn client_that_disconnects_mid_body_frees_the_slot() {
    let layer = HttpConcurrencyLayer::new(config(4));
    let bulkhead = layer.bulkhead();
    let gate = Gate::new();
    let addr = serve(app(layer, gate.clone())).await;

    let response = client().request(get_req(addr, "/stream")).await.unwrap();
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), "chunk ");
    assert_eq!(bulkhead.in_flight(), 1);
    drop(body); // the client goes away without reading the rest

    assert_all_returned(&bulkhead).await;
}

#[tokio::test]
async fn content_length_over_the_cap_is_413_without_a_slot() {
    let layer = HttpConcurrencyLayer::new(config(1)).max_body(1000);
    let bulkhead = layer.bulkhead();
    let gate = Gate::new();
    let addr = serve(app(layer, gate.clone())).await;

    let response = client()
        .request(upload_req(addr, "/upload", 1001))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_all_returned(&bulkhead).await;

    let ok = tokio::spawn(client().request(upload_req(addr, "/upload", 1000)));
    eventually("an upload at the cap is admitted", || {
        bulkhead.in_flight() == 1
    })
    .await;
    gate.open(1);
    assert_eq!(ok.await.unwrap().unwrap().status(), StatusCode::OK);
    assert_all_returned(&bulkhead).await;
}

#[tokio::test]
async fn malformed_content_length_is_400() {
    let layer = HttpConcurrencyLayer::new(config(1)).max_body(1000);
    let bulkhead = layer.bulkhead();
    let addr = serve(app(layer, Gate::new())).await;

    // Over the wire, hyper refuses these before any service sees them...
    for bad in ["abc", "-5", "5, 6"] {
        let request =
            format!("POST /upload HTTP/1.1\r\nhost: x\r\ncontent-length: {bad}\r\n\r\nhello");
        assert_eq!(raw_status(addr, &request).await, 400, "{bad}");
    }
    // ...and the layer refuses them itself when it is reached directly.
    let service = app(
        HttpConcurrencyLayer::from_bulkhead(bulkhead.clone()),
        Gate::new(),
    );
    for bad in ["abc", "-5", "+5", "99999999999999999999999"] {
        let request = Request::post("/upload")
            .header("content-length", bad)
            .body(Body::from("hello"))
            .unwrap();
        let response = service.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{bad}");
    }
    let conflicting = Request::post("/upload")
        .header("content-length", "5")
        .header("content-length", "6")
        .body(Body::from("hello"))
        .unwrap();
    let response = service.oneshot(conflicting).await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_all_returned(&bulkhead).await;
}

#[tokio::test]
async fn a_body_that_could_never_fit_the_byte_budget_is_413_without_retry_after() {
    // The per-request cap is over the whole budget: a length between the two
    // could never be reserved, so a retry could never succeed.
    let layer = HttpConcurrencyLayer::new(config(4).max_bytes(1000)).max_body(10_000);
    let bulkhead = layer.bulkhead();
    let gate = Gate::new();
    gate.open(1);
    let service = app(layer, gate);
    let request = Request::post("/upload")
        .header("content-length", "5000")
        .body(Body::from(vec![b'x'; 5000]))
        .unwrap();
    let response = service.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert!(response.headers().get("retry-after").is_none());
    assert_all_returned(&bulkhead).await;

    // A body of unknown length reserves what can be reserved: the budget.
    let chunks = futures_util::stream::iter([Ok::<_, Infallible>(Frame::data(Bytes::from(vec![
            b'x';
            800
        ])))]);
    let request = Request::post("/upload")
        .body(Body::new(StreamBody::new(chunks)))
        .unwrap();
    let response = service.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.into_body().collect().await.unwrap().to_bytes(),
        "800"
    );
    assert_all_returned(&bulkhead).await;
}

#[tokio::test]
async fn body_longer_than_declared_is_cut_off_with_413() {
    let layer = HttpConcurrencyLayer::new(config(1).max_bytes(1 << 20));
    let bulkhead = layer.bulkhead();
    let gate = Gate::new();
    gate.open(1);
    let service = app(layer, gate);

    // HTTP/1 framing stops hyper from ever handing over more than declared,
    // so a lying body is built by hand.
    let request = Request::post("/upload")
        .header("content-length", "5")
        .body(Body::from("far more than five bytes"))
        .unwrap();
    let response = service.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(bulkhead.in_flight(), 1, "held until the response body ends");
    response.into_body().collect().await.unwrap();
    assert_all_returned(&bulkhead).await;
}

#[tokio::test]
async fn second_upload_over_the_byte_budget_is_503_and_a_later_one_succeeds() {
    let layer = HttpConcurrencyLayer::new(config(8).max_bytes(1 << 20));
    let bulkhead = layer.bulkhead();
    let gate = Gate::new();
    let addr = serve(app(layer, gate.clone())).await;
    let upload = 600 << 10;

    let first = tokio::spawn(client().request(upload_req(addr, "/upload", upload)));
    eventually("the first upload holds its bytes", || {
        bulkhead.bytes_reserved() == upload as u64
    })
    .await;

    let second = client()
        .request(upload_req(addr, "/upload", upload))
        .await
        .unwrap();
    assert_eq!(second.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(second.headers().contains_key("retry-after"));
    assert_eq!(
        bulkhead.in_flight(),
        1,
        "the second upload's slot was given back"
    );

    gate.open(1);
    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::OK);
    assert_all_returned(&bulkhead).await;

    let third = tokio::spawn(client().request(upload_req(addr, "/upload", upload)));
    gate.open(1);
    let third = third.await.unwrap().unwrap();
    assert_eq!(third.status(), StatusCode::OK);
    assert_eq!(
        third.into_body().collect().await.unwrap().to_bytes(),
        upload.to_string()
    );
    assert_all_returned(&bulkhead).await;
}

#[tokio::test]
async fn chunked_upload_reserves_the_per_request_cap() {
    let layer = HttpConcurrencyLayer::new(config(8).max_bytes(1 << 20)).max_body(256 << 10);
    let bulkhead = layer.bulkhead();
    let gate = Gate::new();
    let addr = serve(app(layer, gate.clone())).await;

    let (chunks, rx) = mpsc::channel::<Result<Frame<Bytes>, Infallible>>(4);
    let body = StreamBody::new(tokio_stream(rx));
    let request = Request::post(format!("http://{addr}/upload"))
        .body(body)
        .unwrap();
    let upload = tokio::spawn(client().request(request));

    eventually("the chunked upload reserves max_body", || {
        bulkhead.bytes_reserved() == 256 << 10
    })
    .await;
    chunks
        .send(Ok(Frame::data(Bytes::from_static(b"hello"))))
        .await
        .unwrap();
    drop(chunks);
    gate.open(1);
    let response = upload.await.unwrap().unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.into_body().collect().await.unwrap().to_bytes(),
        "5"
    );
    assert_all_returned(&bulkhead).await;
}

#[tokio::test]
async fn handler_can_keep_the_bytes_after_the_request_completes() {
    let layer = HttpConcurrencyLayer::new(config(8).max_bytes(1 << 20));
    let bulkhead = layer.bulkhead();
    let gate = Gate::new();
    let addr = serve(app(layer, gate.clone())).await;

    let response = client()
        .request(upload_req(addr, "/keep-bytes", 1000))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    response.into_body().collect().await.unwrap();
    eventually("the slot is back", || bulkhead.in_flight() == 0).await;
    assert_eq!(
        bulkhead.bytes_reserved(),
        1000,
        "the task still holds the buffer"
    );

    gate.open(1);
    assert_all_returned(&bulkhead).await;
}

#[tokio::test]
async fn saturated_error_is_a_503_axum_response() {
    use axum::response::IntoResponse;
    let bulkhead = Bulkhead::new(config(1).retry_after(Duration::from_secs(7)));
    let _held = bulkhead.try_acquire().unwrap();
    let response = bulkhead.try_acquire().unwrap_err().into_response();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["retry-after"], "7");
}

#[tokio::test]
async fn the_layer_wraps_a_client_too() {
    let server_gate = Gate::new();
    let addr = serve(app(
        HttpConcurrencyLayer::new(config(8)),
        server_gate.clone(),
    ))
    .await;
    let layer = HttpConcurrencyLayer::new(config(1).name("outbound"));
    let bulkhead = layer.bulkhead();
    let outbound = tower::ServiceBuilder::new()
        .layer(layer)
        .service(client::<http_body_util::Limited<Full<Bytes>>>());

    let first = tokio::spawn(outbound.clone().oneshot(get_req(addr, "/slow")));
    eventually("the first outbound call holds the slot", || {
        bulkhead.in_flight() == 1
    })
    .await;
    let refused = outbound
        .clone()
        .oneshot(get_req(addr, "/slow"))
        .await
        .unwrap();
    assert_eq!(
        refused.status(),
        StatusCode::SERVICE_UNAVAILABLE,
        "our own bulkhead refused to start the call"
    );

    server_gate.open(1);
    let first = first.await.unwrap().unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    first.into_body().collect().await.unwrap();
    assert_all_returned(&bulkhead).await;
}

/// A `Stream` over an mpsc receiver, without another dependency.
fn tokio_stream<T>(mut rx: mpsc::Receiver<T>) -> impl futures_util::Stream<Item = T> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
