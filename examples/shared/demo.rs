//! What the overload and tenants demos share: the server's start, the HTTP
//! client and what a request came to, a seeded generator, a counter of
//! calls in progress, and a quantile. Each demo takes
//! it in with `#[path = "../shared/demo.rs"] mod demo;`.

use axum::Router;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::net::TcpListener;

/// Serves `app` on an ephemeral port of 127.0.0.1.
pub(crate) async fn serve(app: Router) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1");
    let addr = listener.local_addr().expect("local addr");
    let server = tokio::spawn(async move {
        axum::serve(listener, app).await.expect("server");
    });
    (addr, server)
}

pub(crate) type HttpClient = Client<HttpConnector, Empty<Bytes>>;

pub(crate) fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// What became of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Status {
    /// 200, its body read to the end, within the client's timeout.
    Ok,
    /// 503: shed by the layer.
    Shed,
    /// No answer within the client's timeout: the client gave up.
    TimedOut,
    /// Anything else: a connection error, another status.
    Failed,
}

/// Sends `request` and reads its response to the end: what it came to
/// (the client's timeout is the caller's).
pub(crate) async fn sent(client: &HttpClient, request: Request<Empty<Bytes>>) -> Status {
    let Ok(response) = client.request(request).await else {
        return Status::Failed;
    };
    let status = response.status();
    if response.into_body().collect().await.is_err() {
        return Status::Failed;
    }
    match status {
        StatusCode::OK => Status::Ok,
        StatusCode::SERVICE_UNAVAILABLE => Status::Shed,
        _ => Status::Failed,
    }
}

/// SplitMix64: a small seeded generator, so runs are repeatable.
#[derive(Debug)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// Uniform in (0, 1].
    pub(crate) fn next_unit(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }

    /// An exponential gap at `rate` a second: how independent clients
    /// arrive.
    pub(crate) fn exponential_gap(&mut self, rate: f64) -> f64 {
        -self.next_unit().ln() / rate
    }
}

/// Counts while alive; a dropped future (the client went away) counts down too.
pub(crate) struct Counted<'a>(&'a AtomicUsize);

impl<'a> Counted<'a> {
    /// Counted in, with the count now (this one included).
    pub(crate) fn new(counter: &'a AtomicUsize) -> (Self, usize) {
        let now = counter.fetch_add(1, Ordering::SeqCst) + 1;
        (Counted(counter), now)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The `q` quantile (0..=1) of `values`, nearest rank; zero when empty.
pub(crate) fn quantile(values: &mut [Duration], q: f64) -> Duration {
    if values.is_empty() {
        return Duration::ZERO;
    }
    values.sort_unstable();
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}
