//! An axum service behind the HTTP bulkhead.
//!
//! ```text
//! cargo run --example axum --features axum
//! ```
//!
//! Then, in another terminal:
//!
//! ```text
//! # 8 slots: the 9th concurrent /slow request gets 503 with Retry-After
//! for i in $(seq 12); do curl -s -o /dev/null -w '%{http_code}\n' localhost:3000/slow & done; wait
//! # a streaming response holds its slot until the body ends (watch /status meanwhile)
//! curl -N localhost:3000/stream & sleep 0.5; curl -s localhost:3000/status; wait
//! # uploads reserve their Content-Length from a 4 MiB budget, at most 1 MiB each
//! head -c 2000000 /dev/zero | curl -s -w ' %{http_code}\n' --data-binary @- localhost:3000/upload
//! head -c 500000 /dev/zero | curl -s -w ' %{http_code}\n' --data-binary @- localhost:3000/upload
//! ```

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::routing::{get, post};
use axum::Router;
use std::convert::Infallible;
use std::time::Duration;
use tower_inflight::http::HttpConcurrencyLayer;
use tower_inflight::{Bulkhead, Config};

#[tokio::main]
async fn main() {
    let layer = HttpConcurrencyLayer::new(
        Config::new(8, Duration::from_secs(30))
            .wait(Duration::from_millis(20))
            .max_bytes(4 << 20)
            .name("demo"),
    )
    .max_body(1 << 20);
    let bulkhead = layer.bulkhead();

    let limited = Router::new()
        .route("/slow", get(slow))
        .route("/stream", get(stream))
        .route("/upload", post(upload))
        .layer(layer);
    // The status route sits outside the bulkhead: it must answer while full.
    let app = Router::new()
        .route("/status", get(status))
        .with_state(bulkhead)
        .merge(limited);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000")
        .await
        .unwrap();
    println!("listening on http://{}", listener.local_addr().unwrap());
    axum::serve(listener, app).await.unwrap();
}

/// A dependency that takes a second.
async fn slow() -> &'static str {
    tokio::time::sleep(Duration::from_secs(1)).await;
    "done\n"
}

/// Five lines, 200 ms apart: the slot is held until the last one is sent.
async fn stream() -> Body {
    let lines = futures_util::stream::unfold(0, |n| async move {
        if n == 5 {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        Some((
            Ok::<_, Infallible>(Bytes::from(format!("line {n}\n"))),
            n + 1,
        ))
    });
    Body::from_stream(lines)
}

async fn upload(body: Bytes) -> String {
    format!("received {} bytes\n", body.len())
}

async fn status(State(bulkhead): State<Bulkhead>) -> String {
    format!(
        "in flight {}/{}, waiting {}, bytes reserved {}/{}\n",
        bulkhead.in_flight(),
        bulkhead.limit(),
        bulkhead.waiting(),
        bulkhead.bytes_reserved(),
        bulkhead.max_bytes().unwrap_or(0),
    )
}
