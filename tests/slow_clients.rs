//! Slow uploads against a real axum server: tower-http's timeouts inside the
//! bulkhead cut them, and their slot and bytes come back (docs/http.md,
//! "Slow clients").

mod support;

use axum::body::Bytes;
use axum::routing::post;
use axum::Router;
use http::StatusCode;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::{assert_all_returned, eventually};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tower_http::timeout::{RequestBodyTimeoutLayer, TimeoutLayer};
use tower_inflight::http::HttpConcurrencyLayer;
use tower_inflight::{Bulkhead, Config};

/// What the slow client declares, and the bulkhead reserves for it.
const DECLARED: u64 = 1000;
/// The gap between the trickler's bytes: far below the idle timeout.
const TRICKLE_EVERY: Duration = Duration::from_millis(20);
/// The request body's idle timeout: generous, so that a loaded machine's
/// pauses between two trickled bytes stay well under it.
const BODY_IDLE: Duration = Duration::from_secs(1);
/// How long a test waits for the server to cut a slow upload before failing:
/// many times either timeout.
const NEVER_CUT: Duration = Duration::from_secs(60);

/// One slot and room for one declared upload: a slow client holding them
/// shuts everyone else out.
fn bulkhead_layer() -> HttpConcurrencyLayer {
    HttpConcurrencyLayer::new(
        Config::new(1, Duration::from_secs(30))
            .name("slow-clients")
            .max_bytes(DECLARED),
    )
}

/// The composition of docs/http.md: the timeouts inside the bulkhead, and a
/// handler that reads the whole body.
fn app(bulkhead: HttpConcurrencyLayer, whole_call: Duration) -> Router {
    Router::new()
        .route(
            "/upload",
            post(|body: Bytes| async move { body.len().to_string() }),
        )
        .layer(RequestBodyTimeoutLayer::new(BODY_IDLE))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            whole_call,
        ))
        .layer(bulkhead)
}

async fn serve(router: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
}

/// An upload that declares `DECLARED` bytes, sends a few, and then one byte
/// every `TRICKLE_EVERY` until told to stall; it never sends the rest.
struct Trickler {
    response: OwnedReadHalf,
    stall: Arc<AtomicBool>,
    /// Gives back the write half, still open, once stalled: dropping it
    /// would end the body early, which is not what a slow client does.
    writer: JoinHandle<Option<OwnedWriteHalf>>,
}

impl Trickler {
    async fn start(addr: SocketAddr) -> Self {
        let stream = TcpStream::connect(addr).await.unwrap();
        let (response, mut request) = stream.into_split();
        let head =
            format!("POST /upload HTTP/1.1\r\nhost: x\r\ncontent-length: {DECLARED}\r\n\r\n");
        request.write_all(head.as_bytes()).await.unwrap();
        request.write_all(b"first bytes").await.unwrap();
        let stall = Arc::new(AtomicBool::new(false));
        let stop = stall.clone();
        let writer = tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                tokio::time::sleep(TRICKLE_EVERY).await;
                // The server may close the connection once it has cut the
                // upload; the trickler then has nothing more to do.
                if request.write_all(b"x").await.is_err() {
                    return None;
                }
            }
            Some(request)
        });
        Trickler {
            response,
            stall,
            writer,
        }
    }

    /// Stops sending, leaving the connection open.
    fn stall(&self) {
        self.stall.store(true, Ordering::SeqCst);
    }

    /// The status the server answered with, once it cut the upload (the
    /// client never sends all it declared, so nothing else can end it).
    async fn status(mut self) -> u16 {
        let head = tokio::time::timeout(NEVER_CUT, read_head(&mut self.response))
            .await
            .expect("the slow upload was never cut");
        self.writer.abort();
        status_of(&head)
    }
}

/// Reads a response's head (up to its blank line, or the end of the stream).
async fn read_head(stream: &mut (impl AsyncReadExt + Unpin)) -> String {
    let mut head = Vec::new();
    let mut buf = [0; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
            Err(error) => panic!("reading the response: {error} (after {head:?})"),
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

fn status_of(head: &str) -> u16 {
    head.split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"))
}

/// A whole, quick upload on its own connection: its status and body.
async fn upload(addr: SocketAddr, body: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "POST /upload HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    let response = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    (status_of(head), body.to_owned())
}

async fn holds_everything(bulkhead: &Bulkhead) {
    eventually("the slow upload holds the slot and its bytes", || {
        bulkhead.in_flight() == 1 && bulkhead.bytes_reserved() == DECLARED
    })
    .await;
}

#[tokio::test]
async fn a_stalled_upload_is_cut_by_the_body_timeout_and_gives_back_its_slot_and_bytes() {
    let layer = bulkhead_layer();
    let bulkhead = layer.bulkhead();
    // The whole-call deadline is out of reach here: only the idle timeout acts.
    let addr = serve(app(layer, Duration::from_secs(600))).await;

    let trickler = Trickler::start(addr).await;
    holds_everything(&bulkhead).await;
    // While it trickles, it holds the only slot: a quick upload is shed.
    let (status, _) = upload(addr, "hello").await;
    assert_eq!(status, 503, "the trickler holds the only slot");
    // Bytes faster than the idle timeout are progress: it is not cut, however
    // long it takes, which is why docs/http.md adds a whole-call deadline.
    tokio::time::sleep(BODY_IDLE * 2).await;
    assert_eq!(bulkhead.in_flight(), 1, "a trickle is not idle");
    assert_eq!(bulkhead.bytes_reserved(), DECLARED);

    // Silence past the idle timeout cuts it: the body ends with tower-http's
    // `TimeoutError`, which axum's `Bytes` extractor answers 400.
    trickler.stall();
    assert_eq!(trickler.status().await, 400);
    assert_all_returned(&bulkhead).await;

    // And the slot and bytes serve the next client.
    assert_eq!(upload(addr, "hello").await, (200, "5".to_owned()));
    assert_all_returned(&bulkhead).await;
}

#[tokio::test]
async fn a_steady_trickle_is_cut_by_the_whole_call_deadline() {
    let layer = bulkhead_layer();
    let bulkhead = layer.bulkhead();
    // Long enough for the checks below on a loaded machine; the trickle is
    // never idle, so only this deadline can end it.
    let addr = serve(app(layer, Duration::from_secs(3))).await;

    let trickler = Trickler::start(addr).await;
    holds_everything(&bulkhead).await;
    let (status, _) = upload(addr, "hello").await;
    assert_eq!(status, 503, "the trickler holds the only slot");

    // tower-http's `TimeoutLayer` answers with its status code and drops the
    // handler, and with it the request body: the bulkhead's response body is
    // the 408's, empty, and the slot and bytes come back with it.
    assert_eq!(trickler.status().await, 408);
    assert_all_returned(&bulkhead).await;

    assert_eq!(upload(addr, "hello").await, (200, "5".to_owned()));
    assert_all_returned(&bulkhead).await;
}
