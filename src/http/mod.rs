//! The bulkhead for HTTP services: `503` with `Retry-After` when full, slots
//! held until the response body ends, and a byte budget reserved before the
//! request body is read.
//!
//! [`HttpConcurrencyLayer`] is [`ConcurrencyLayer`](crate::ConcurrencyLayer)
//! for `http::Request` services. It keeps the inner service's error type, so
//! an axum `Router` (whose errors are `Infallible`) takes it directly, and it
//! answers what it refuses with a response instead of an error:
//!
//! | the request | the response |
//! | --- | --- |
//! | every slot held (after the `wait` budget, if any) | `503 Service Unavailable`, `Retry-After` |
//! | a slot free, but not its bytes | `503 Service Unavailable`, `Retry-After`; the slot is given back |
//! | a [classifier](HttpConcurrencyLayer::classify) gave it a weight of 0 or over the limit | `500 Internal Server Error`: no retry can help |
//! | `Content-Length` over the per-request cap, or over the whole byte budget (it could never be reserved) | `413 Payload Too Large`, no slot taken |
//! | `Content-Length` malformed, or several that disagree | `400 Bad Request`, no slot taken |
//! | a body longer than it declared | the body ends with an error that axum's extractors answer with `413` |
//!
//! # The slot lasts as long as the response body
//!
//! Streaming a body is still work on whatever the bulkhead protects, so the
//! slot is released when the response body has been produced to its end, or
//! dropped (the client went away), not when the headers are ready.
//!
//! # The byte budget
//!
//! A count of requests bounds no bytes: a dozen admitted requests can hold
//! hundreds of megabytes if one keeps a large buffer alive. With
//! [`Config::max_bytes`](crate::Config::max_bytes), a request is admitted only
//! if both a slot and its share of bytes are reserved, before its body is
//! read. The share is its `Content-Length`, or the per-request cap
//! ([`HttpConcurrencyLayer::max_body`], by default the whole budget) when the
//! length is unknown, and the body is cut off with an error if it grows past
//! that share. The bytes come back when the request completes, unless the
//! handler takes them over through the [`ReservedBytes`] in the request's
//! extensions: it can return them early once it no longer holds the buffer,
//! or move them into a task that keeps the buffer alive.
//!
//! ```
//! use std::time::Duration;
//! use axum::{routing::post, Router};
//! use tower_inflight::{http::HttpConcurrencyLayer, Config};
//!
//! let bulkhead = HttpConcurrencyLayer::new(
//!     Config::new(64, Duration::from_secs(30))
//!         .max_bytes(64 << 20)             // 64 MiB of request bodies in flight at most
//!         .retry_after(Duration::from_secs(2)),
//! )
//! .max_body(8 << 20);                      // and 8 MiB per request
//!
//! let app: Router = Router::new()
//!     .route("/upload", post(|body: axum::body::Bytes| async move { body.len().to_string() }))
//!     .layer(bulkhead);
//! # let _ = app;
//! ```
//!
//! The same layer wraps an HTTP *client* service (a `hyper-util` client, say):
//! there a `503` means that your own bulkhead refused to start the call.

#[cfg(feature = "axum")]
mod axum;
pub(crate) mod body;
mod layer;
mod request;
mod reserved;
pub(crate) mod response;
mod service;

pub(crate) use body::outcome_of;
pub use body::ResponseBody;
pub use layer::HttpConcurrencyLayer;
pub use reserved::ReservedBytes;
pub use service::{HttpConcurrency, ResponseFuture};
