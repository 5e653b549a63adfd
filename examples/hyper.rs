//! A plain hyper 1 server (no axum) behind the HTTP bulkhead.
//!
//! Run without arguments, it starts the server on an ephemeral port of
//! 127.0.0.1, sends it a few requests from an in-process hyper client (one
//! burst concurrent enough to be shed with `503` and `Retry-After`), prints
//! what came back, and exits:
//!
//! ```text
//! cargo run --example hyper --features http
//! ```
//!
//! With `--serve` it keeps serving on 127.0.0.1:3000 instead; then, in another
//! terminal:
//!
//! ```text
//! cargo run --example hyper --features http -- --serve
//! # 4 slots, 300 ms a request: of 8 at once, about half get 503 with Retry-After
//! # (`%header{..}` needs curl 7.84 or later)
//! for i in $(seq 8); do curl -s -o /dev/null -w '%{http_code} %header{retry-after}\n' localhost:3000/ & done; wait
//! # the body is read through `Limited`: 4 KiB declared over the 1 KiB cap is 413, no slot taken
//! head -c 4096 /dev/zero | curl -s -w ' %{http_code}\n' --data-binary @- localhost:3000/upload
//! echo hello | curl -s --data-binary @- localhost:3000/upload
//! ```

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpListener;
use tower::{service_fn, Layer};
use tower_inflight::http::HttpConcurrencyLayer;
use tower_inflight::{Bulkhead, Config};

/// Requests in the handler at once, at most.
const LIMIT: usize = 4;
/// What the handler takes a request, standing in for real work.
const WORK: Duration = Duration::from_millis(300);
/// The largest request body admitted.
const MAX_BODY: u64 = 1024;

#[tokio::main]
async fn main() {
    let serve = match std::env::args().nth(1).as_deref() {
        None => false,
        Some("--serve") => true,
        Some(other) => {
            eprintln!("hyper: unknown option {other:?}\nusage: hyper [--serve]");
            std::process::exit(2);
        }
    };

    // ONE layer value, built once, outside the accept loop. Every service it
    // builds shares its bulkhead, so `LIMIT` holds across all connections.
    let layer =
        HttpConcurrencyLayer::new(Config::new(LIMIT, Duration::from_secs(30)).name("hyper-demo"))
            .max_body(MAX_BODY)
            .retry_after(Duration::from_secs(1));
    let bulkhead = layer.bulkhead();

    let address = if serve {
        "127.0.0.1:3000"
    } else {
        "127.0.0.1:0"
    };
    let listener = TcpListener::bind(address).await.expect("bind 127.0.0.1");
    let addr = listener.local_addr().expect("local address");
    println!("listening on http://{addr} ({LIMIT} slots, {WORK:?} a request)");
    let server = tokio::spawn(accept_loop(listener, layer));
    if serve {
        server.await.expect("the accept loop");
        return;
    }
    demo(addr, &bulkhead).await;
    server.abort();
}

/// The inner service: what sits behind the bulkhead. It receives the request
/// with its body wrapped in `Limited` (cut off past what was declared or
/// allowed), and answers with any body whose `Data` is `Bytes`.
async fn handle(request: Request<Limited<Incoming>>) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = request.into_parts();
    let body: Bytes = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        // A body longer than its Content-Length, or than `max_body` when it
        // declared none.
        Err(error) if error.is::<LengthLimitError>() => {
            return Ok(text(StatusCode::PAYLOAD_TOO_LARGE, "body too large\n"));
        }
        Err(_) => return Ok(text(StatusCode::BAD_REQUEST, "could not read the body\n")),
    };
    tokio::time::sleep(WORK).await;
    Ok(text(
        StatusCode::OK,
        format!(
            "{} {}: {} bytes\n",
            parts.method,
            parts.uri.path(),
            body.len()
        ),
    ))
}

fn text(status: StatusCode, text: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(text.into()));
    *response.status_mut() = status;
    response
}

/// Accepts connections and serves each on a task of its own, with the
/// handler behind `layer`.
async fn accept_loop(listener: TcpListener, layer: HttpConcurrencyLayer) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                eprintln!("accept: {error}");
                continue;
            }
        };
        // `.layer()` per connection. Safe with our layer: the bulkhead lives
        // in the layer value, and each service built here holds a handle to
        // that one bulkhead. tower's `ConcurrencyLimitLayer` in its place
        // would make a new semaphore in every `layer()` call: a limit per
        // connection, which over HTTP/1.1 (one request at a time on a
        // connection) is no limit at all.
        //
        // The types, spelled out: the inner service takes
        // `Request<Limited<Incoming>>` and returns `Response<Full<Bytes>>`;
        // the layered one takes hyper's `Request<Incoming>` and returns
        // `Response<ResponseBody<Full<Bytes>>>`, a body that holds the slot
        // until it has been sent. Both keep the handler's error type.
        let service: tower_inflight::http::HttpConcurrency<_> = layer.layer(service_fn(handle));
        let service = TowerToHyperService::new(service);
        tokio::spawn(async move {
            if let Err(error) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                eprintln!("connection: {error}");
            }
        });
    }
}

/// What a request got back: status, Retry-After, body.
struct Answer {
    status: StatusCode,
    retry_after: Option<String>,
    body: String,
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

async fn send(client: &HttpClient, addr: SocketAddr, path: &str, body: Bytes) -> Answer {
    let method = if body.is_empty() { "GET" } else { "POST" };
    let request = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .body(Full::new(body))
        .expect("a request");
    let response = client.request(request).await.expect("a response");
    let status = response.status();
    let retry_after = response
        .headers()
        .get(http::header::RETRY_AFTER)
        .map(|value| value.to_str().unwrap_or("?").to_owned());
    let body = response
        .into_body()
        .collect()
        .await
        .expect("the response body")
        .to_bytes();
    Answer {
        status,
        retry_after,
        body: String::from_utf8_lossy(&body).trim_end().to_owned(),
    }
}

fn print(label: &str, answer: &Answer) {
    let retry_after = match &answer.retry_after {
        Some(seconds) => format!(" (Retry-After: {seconds})"),
        None => String::new(),
    };
    println!(
        "  {label:<10} {}{retry_after}  {:?}",
        answer.status, answer.body
    );
}

/// Sends the server a few requests and checks what comes back.
async fn demo(addr: SocketAddr, bulkhead: &Bulkhead) {
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();

    println!("\none request, with a small body:");
    let answer = send(&client, addr, "/upload", Bytes::from_static(b"hello")).await;
    print("upload", &answer);
    assert_eq!(answer.status, StatusCode::OK);

    println!("\n{} at once, {LIMIT} slots:", 2 * LIMIT);
    let burst: Vec<_> = (0..2 * LIMIT)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move { (i, send(&client, addr, "/", Bytes::new()).await) })
        })
        .collect();
    let (mut ok, mut shed) = (0, 0);
    for call in burst {
        let (i, answer) = call.await.expect("a request task");
        print(&format!("request {i}"), &answer);
        match answer.status {
            StatusCode::OK => ok += 1,
            StatusCode::SERVICE_UNAVAILABLE => {
                assert!(answer.retry_after.is_some(), "a 503 says when to retry");
                shed += 1;
            }
            other => panic!("unexpected status {other}"),
        }
    }
    println!("  {ok} served, {shed} shed with 503");
    // The first `LIMIT` to arrive hold every slot for 300 ms; the others
    // arrive within milliseconds and find none.
    assert!(ok <= LIMIT, "never more than {LIMIT} inside at once");
    assert!(shed > 0, "a burst of twice the limit is shed in part");

    println!("\na body declared over the {MAX_BODY}-byte cap (no slot taken):");
    let answer = send(&client, addr, "/upload", Bytes::from(vec![0; 4096])).await;
    print("upload", &answer);
    assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE);

    println!("\nonce the burst is over, the slots are free again:");
    let answer = send(&client, addr, "/", Bytes::new()).await;
    print("request", &answer);
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(bulkhead.in_flight(), 0);
    let totals = bulkhead.status().totals;
    println!(
        "\nbulkhead {:?}: {} in flight now; {} admitted, {} shed at the limit in all",
        bulkhead.name().unwrap_or("?"),
        bulkhead.in_flight(),
        totals.admitted,
        totals.rejected_limit,
    );
}
