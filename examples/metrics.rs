//! An axum service behind the bulkhead, with a Prometheus `/metrics`
//! endpoint and a JSON `/status` endpoint.
//!
//! ```text
//! cargo run --example metrics --features axum,metrics,serde,tracing
//! ```
//!
//! Then, in another terminal:
//!
//! ```text
//! for i in $(seq 20); do curl -s -o /dev/null localhost:3001/slow & done; wait
//! curl -s localhost:3001/metrics | grep tower_inflight
//! curl -s localhost:3001/status
//! ```

use axum::routing::get;
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusBuilder;
use std::time::Duration;
use tower_inflight::http::HttpConcurrencyLayer;
use tower_inflight::{Bulkhead, Config, Status};

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .init();
    // Install the recorder before building the bulkhead: it registers its
    // metrics once, when it is built.
    let prometheus = PrometheusBuilder::new()
        .install_recorder()
        .expect("install the Prometheus recorder");

    let layer = HttpConcurrencyLayer::new(
        Config::new(8, Duration::from_secs(30))
            .wait(Duration::from_millis(50))
            .name("slow-dependency"),
    );
    let bulkhead = layer.bulkhead();

    let limited = Router::new()
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(500)).await;
                "done\n"
            }),
        )
        .layer(layer);
    // The observability routes stay outside the bulkhead: they must answer
    // while it is full.
    let app = Router::new()
        .route(
            "/metrics",
            get(move || std::future::ready(prometheus.render())),
        )
        .route("/status", get(move || status(bulkhead.clone())))
        .merge(limited);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:3001")
        .await
        .unwrap();
    println!("listening on http://{}", listener.local_addr().unwrap());
    axum::serve(listener, app).await.unwrap();
}

async fn status(bulkhead: Bulkhead) -> Json<Status> {
    Json(bulkhead.status())
}
