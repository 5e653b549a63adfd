//! Bad input over real sockets to an axum server behind
//! `HttpConcurrencyLayer` with a byte budget: `Content-Length` headers that
//! are malformed, negative, past `u64`, or duplicated and disagreeing; uploads
//! that stop short of what they declared and hang up; downloads whose client
//! vanishes after the first chunk. Each gets its status (or the connection
//! just ends), and afterwards no slot and no byte of the budget is held.

#![cfg(feature = "axum")]

mod support;

use support::{assert_all_returned, eventually, Gate};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::routing::{get, post};
use axum::Router;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tower_inflight::http::HttpConcurrencyLayer;
use tower_inflight::{Bulkhead, Config};

/// The byte budget, and so the per-request cap.
const MAX_BYTES: u64 = 1 << 20;
const LIMIT: usize = 4;

struct Server {
    addr: SocketAddr,
    bulkhead: Bulkhead,
    gate: Gate,
}

async fn serve() -> Server {
    let layer =
        HttpConcurrencyLayer::new(Config::new(LIMIT, Duration::from_secs(30)).max_bytes(MAX_BYTES));
    let bulkhead = layer.bulkhead();
    let gate = Gate::new();
    let router = Router::new()
        .route(
            "/upload",
            post(|body: Bytes| async move { body.len().to_string() }),
        )
        .route(
            "/slow",
            get(|State(gate): State<Gate>| async move {
                gate.pass().await;
                "done"
            }),
        )
        .route(
            "/stream",
            // Chunks of 16 KiB, forever, until the client goes away.
            get(|| async {
                let chunks = futures_util::stream::unfold((), |()| async {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    Some((Ok::<_, Infallible>(Bytes::from(vec![b'x'; 16 << 10])), ()))
                });
                Body::from_stream(chunks)
            }),
        )
        .with_state(gate.clone())
        .layer(layer);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    Server {
        addr,
        bulkhead,
        gate,
    }
}

/// Sends `request` on a fresh connection and reads the status of the
/// answer; `None` if the server closed the connection without one.
async fn exchange(addr: SocketAddr, request: &[u8]) -> Option<u16> {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    read_status(&mut stream).await
}

async fn read_status(stream: &mut TcpStream) -> Option<u16> {
    let mut head = Vec::new();
    let mut buffer = [0; 1024];
    let read = async {
        while !head.windows(2).any(|w| w == b"\r\n") {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => head.extend_from_slice(&buffer[..n]),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .expect("the server neither answered nor closed the connection");
    let head = String::from_utf8_lossy(&head);
    let status = head.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok();
    assert!(status.is_some(), "no status in {head:?}");
    status
}

fn upload_with_headers(headers: &str, body: &str) -> Vec<u8> {
    format!("POST /upload HTTP/1.1\r\nhost: test\r\n{headers}\r\n{body}").into_bytes()
}

/// A well-formed upload, to show the server is still serving.
async fn assert_still_serving(server: &Server) {
    let status = exchange(
        server.addr,
        &upload_with_headers("content-length: 5\r\nconnection: close\r\n", "hello"),
    )
    .await;
    assert_eq!(status, Some(200));
    assert_all_returned(&server.bulkhead).await;
}

/// Opens a connection and starts an upload that declares `declared` bytes
/// but sends only `sent`; returns once the server has admitted it (reserved
/// its bytes) and is waiting for the rest.
async fn start_short_upload(server: &Server, declared: u64, sent: usize) -> TcpStream {
    let reserved_before = server.bulkhead.bytes_reserved();
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    let head = format!("POST /upload HTTP/1.1\r\nhost: test\r\ncontent-length: {declared}\r\n\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&vec![b'x'; sent]).await.unwrap();
    eventually("the upload is admitted with its declared bytes", || {
        server.bulkhead.bytes_reserved() == reserved_before + declared
    })
    .await;
    stream
}

#[tokio::test]
async fn malformed_negative_and_past_u64_content_lengths_are_400_and_take_nothing() {
    let server = serve().await;
    for length in [
        "abc",
        "-5",
        "-0",
        "+5",
        "",
        "1e3",
        "0x10",
        "5 5",
        "5;5",
        "18446744073709551616",    // u64::MAX + 1
        "99999999999999999999999", // far past u64
    ] {
        let request = upload_with_headers(&format!("content-length: {length}\r\n"), "hello");
        assert_eq!(
            exchange(server.addr, &request).await,
            Some(400),
            "content-length: {length:?}"
        );
        assert_all_returned(&server.bulkhead).await;
    }
    assert_still_serving(&server).await;
}

#[tokio::test]
async fn duplicated_content_lengths_that_disagree_are_400_and_take_nothing() {
    let server = serve().await;
    for headers in [
        "content-length: 5\r\ncontent-length: 6\r\n",
        "content-length: 6\r\ncontent-length: 5\r\n",
        "content-length: 5\r\ncontent-length: abc\r\n",
        "content-length: 5, 6\r\n",
        "content-length: 5\r\ncontent-length: 18446744073709551616\r\n",
    ] {
        assert_eq!(
            exchange(server.addr, &upload_with_headers(headers, "hello")).await,
            Some(400),
            "{headers:?}"
        );
        assert_all_returned(&server.bulkhead).await;
    }
    // Copies that agree are one length (RFC 9110 §8.6): served, and the five
    // bytes it reserved come back.
    let agreeing = upload_with_headers(
        "content-length: 5\r\ncontent-length: 5\r\nconnection: close\r\n",
        "hello",
    );
    assert_eq!(exchange(server.addr, &agreeing).await, Some(200));
    assert_all_returned(&server.bulkhead).await;
}

/// Sends `request` on a fresh connection and reads everything until the
/// server closes it.
async fn exchange_all(addr: SocketAddr, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut answers = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answers))
        .await
        .expect("the server closes the connection")
        .ok();
    String::from_utf8_lossy(&answers).into_owned()
}

fn chunked(body: &[u8]) -> String {
    format!(
        "{:x}\r\n{}\r\n0\r\n\r\n",
        body.len(),
        String::from_utf8_lossy(body)
    )
}

#[tokio::test]
async fn content_length_beside_chunked_encoding_yields_to_the_chunks_and_takes_nothing_after() {
    let server = serve().await;
    // RFC 9112 §6.3: the transfer coding wins; the lying length is ignored.
    let request = upload_with_headers(
        "content-length: 5\r\ntransfer-encoding: chunked\r\nconnection: close\r\n",
        &chunked(&[b'x'; 50]),
    );
    let answer = exchange_all(server.addr, &request).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    assert!(answer.ends_with("\r\n\r\n50"), "{answer:?}");
    assert_all_returned(&server.bulkhead).await;
}

#[tokio::test]
async fn chunked_upload_past_the_byte_budget_is_cut_off_and_gives_everything_back() {
    let server = serve().await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    let head = "POST /upload HTTP/1.1\r\nhost: test\r\ntransfer-encoding: chunked\r\n\r\n";
    stream.write_all(head.as_bytes()).await.unwrap();
    eventually("an upload of unknown length reserves the whole cap", || {
        server.bulkhead.bytes_reserved() == MAX_BYTES
    })
    .await;
    // 64 KiB chunks, past the cap; the server may refuse and hang up first.
    let chunk = format!("{:x}\r\n{}\r\n", 64 << 10, "x".repeat(64 << 10));
    for _ in 0..(MAX_BYTES / (64 << 10) + 2) {
        if stream.write_all(chunk.as_bytes()).await.is_err() {
            break;
        }
    }
    let status = read_status(&mut stream).await;
    assert!(
        matches!(status, Some(413) | None),
        "an upload past the cap answered {status:?}"
    );
    drop(stream);
    assert_all_returned(&server.bulkhead).await;
    assert_still_serving(&server).await;
}

#[tokio::test]
async fn content_length_over_the_byte_budget_is_413_and_takes_nothing() {
    let server = serve().await;
    for length in [
        (MAX_BYTES + 1).to_string(),
        "1000000000000000000".to_owned(),
        (u64::MAX - 2).to_string(), // the largest length hyper decodes
    ] {
        let request = upload_with_headers(&format!("content-length: {length}\r\n"), "hello");
        assert_eq!(
            exchange(server.addr, &request).await,
            Some(413),
            "content-length: {length}"
        );
        assert_all_returned(&server.bulkhead).await;
    }
    // u64::MAX itself hyper refuses before the layer sees it.
    let request = upload_with_headers(&format!("content-length: {}\r\n", u64::MAX), "hello");
    let status = exchange(server.addr, &request).await;
    assert!(
        matches!(status, Some(400 | 413 | 431)),
        "content-length: u64::MAX answered {status:?}"
    );
    assert_all_returned(&server.bulkhead).await;
    assert_still_serving(&server).await;
}

#[tokio::test]
async fn oversized_upload_that_expects_100_continue_is_413_before_sending_its_body() {
    let server = serve().await;
    let request = upload_with_headers(
        &format!(
            "content-length: {}\r\nexpect: 100-continue\r\n",
            MAX_BYTES * 4
        ),
        "",
    );
    // The first line back is the refusal: no `100 Continue` invites the body.
    assert_eq!(exchange(server.addr, &request).await, Some(413));
    assert_all_returned(&server.bulkhead).await;
}

#[tokio::test]
async fn uploads_that_stop_short_and_hang_up_give_back_their_slots_and_bytes() {
    let server = serve().await;
    let mut uploads = Vec::new();
    for _ in 0..LIMIT {
        uploads.push(start_short_upload(&server, 100_000, 10).await);
    }
    assert_eq!(server.bulkhead.in_flight(), LIMIT);
    assert_eq!(server.bulkhead.bytes_reserved(), LIMIT as u64 * 100_000);

    // Every slot is held by a half-sent upload: the next request is shed.
    let shed = upload_with_headers("content-length: 5\r\n", "hello");
    assert_eq!(exchange(server.addr, &shed).await, Some(503));

    drop(uploads); // every client hangs up mid-body
    assert_all_returned(&server.bulkhead).await;
    assert_still_serving(&server).await;
}

#[tokio::test]
async fn upload_that_stops_short_and_half_closes_is_400_and_gives_everything_back() {
    let server = serve().await;
    let mut stream = start_short_upload(&server, 100_000, 10).await;
    stream.shutdown().await.unwrap(); // "that was all": the body ends early
    let status = read_status(&mut stream).await;
    assert!(
        matches!(status, Some(400) | None),
        "a body shorter than declared answered {status:?}"
    );
    assert_all_returned(&server.bulkhead).await;
    assert_still_serving(&server).await;
}

#[tokio::test]
async fn clients_that_vanish_mid_download_give_back_their_slots() {
    let server = serve().await;
    let mut downloads = Vec::new();
    for _ in 0..LIMIT {
        let mut stream = TcpStream::connect(server.addr).await.unwrap();
        stream
            .write_all(b"GET /stream HTTP/1.1\r\nhost: test\r\n\r\n")
            .await
            .unwrap();
        // The head and the first chunk of the body.
        let mut received = Vec::new();
        let mut buffer = vec![0; 4096];
        while received.len() < 4096 {
            let n = stream.read(&mut buffer).await.unwrap();
            assert!(n > 0, "the download ended early");
            received.extend_from_slice(&buffer[..n]);
        }
        assert!(received.starts_with(b"HTTP/1.1 200"));
        downloads.push(stream);
    }
    assert_eq!(
        server.bulkhead.in_flight(),
        LIMIT,
        "a download holds its slot while its body streams"
    );
    assert_eq!(
        server.bulkhead.bytes_reserved(),
        0,
        "a GET reserves no bytes"
    );

    drop(downloads); // every client vanishes mid-body
    assert_all_returned(&server.bulkhead).await;
    assert_still_serving(&server).await;
}

#[tokio::test]
async fn client_that_vanishes_while_its_handler_works_gives_back_its_slot() {
    let server = serve().await;
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    stream
        .write_all(b"GET /slow HTTP/1.1\r\nhost: test\r\n\r\n")
        .await
        .unwrap();
    eventually("the handler holds a slot", || {
        server.bulkhead.in_flight() == 1
    })
    .await;
    drop(stream);
    assert_all_returned(&server.bulkhead).await;
    server.gate.open(1); // the handler was dropped, not finished: unused
    assert_still_serving(&server).await;
}

#[tokio::test]
async fn body_longer_than_declared_is_read_as_a_bad_next_request() {
    let server = serve().await;
    // Framing takes the declared five bytes; the excess is the next request,
    // which is no request at all.
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    stream
        .write_all(&upload_with_headers(
            "content-length: 5\r\n",
            "helloGARBAGE\r\n\r\n",
        ))
        .await
        .unwrap();
    let mut answers = String::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut answers))
        .await
        .expect("the server closes the connection")
        .ok();
    assert!(answers.starts_with("HTTP/1.1 200"), "{answers:?}");
    assert!(
        answers.contains("\r\n\r\n5"),
        "only the declared bytes were read: {answers:?}"
    );
    assert!(answers.contains("HTTP/1.1 400"), "{answers:?}");
    assert_all_returned(&server.bulkhead).await;
}
