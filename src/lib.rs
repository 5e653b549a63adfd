//! A bulkhead for [tower] services: a hard cap on how many calls are in
//! flight at once.
//!
//! Retries bound how hard you try, a circuit breaker bounds how many failures
//! you tolerate, a rate limiter bounds how often calls *start*. None bounds how
//! many calls are **in flight at once**, and that is what goes wrong when a
//! dependency slows down instead of failing: calls still succeed, slowly, so
//! the breaker sees nothing, while callers pile up inside your application,
//! each holding a pooled connection and whatever memory it carried.
//!
//! [`ConcurrencyLayer`] caps that. Each call (each retry *attempt*) takes one
//! slot of a shared [`Bulkhead`]; over the limit the call is not started and
//! fails at once with [`ServiceSaturated`] (your own backpressure: HTTP 503,
//! not a failure of the dependency). A slot is free again the instant its call
//! finishes: there is no cooldown.
//!
//! ```
//! use std::time::Duration;
//! use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
//! use tower_inflight::{Config, ConcurrencyLayer, ServiceSaturated};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), BoxError> {
//! let layer = ConcurrencyLayer::new(
//!     Config::new(25, Duration::from_secs(30)) // at most 25 in flight; reclaim after 30 s
//!         .wait(Duration::from_millis(50))     // a burst may wait up to 50 ms for a slot
//!         .name("payments"),
//! );
//! let bulkhead = layer.bulkhead();
//! let mut payments = ServiceBuilder::new()
//!     .layer(layer)
//!     .service_fn(|amount: u64| async move { Ok::<_, BoxError>(amount * 2) });
//!
//! match payments.ready().await?.call(21).await {
//!     Ok(doubled) => assert_eq!(doubled, 42),
//!     Err(error) if error.is::<ServiceSaturated>() => { /* 503, serve stale, enqueue... */ }
//!     Err(error) => return Err(error),
//! }
//! assert_eq!(bulkhead.in_flight(), 0);
//! # Ok(())
//! # }
//! ```
//!
//! # What happens over the limit
//!
//! Nothing is dropped and, by default, nothing waits: the inner service is not
//! called and the response future fails with [`ServiceSaturated`]. The caller
//! decides what to do: answer 503 with `Retry-After`, serve something stale,
//! enqueue the work. Saturation never surfaces as a `poll_ready` error, so it
//! does not poison `Buffer` or `Balance` in front of the layer.
//!
//! With [`Config::wait`] a caller may wait a bounded time for a slot, holding
//! none meanwhile. Freed slots go to waiting callers oldest first, and new
//! arrivals never overtake them; [`Config::max_waiting`] caps how many wait.
//!
//! # Slots that are never released
//!
//! A slot is released when its call completes, fails, panics, is cancelled or
//! times out: when its [`Permit`] is dropped. What no `Drop` can cover (a
//! leaked future, `mem::forget`, a holder wedged forever) is reclaimed once the
//! slot has been held for `reclaim_after`, which is why that setting is
//! required: set it above your client's timeout. Release is a
//! compare-and-exchange of the exact word the acquire wrote, so a late release
//! never frees a slot that was reclaimed and handed to someone else.
//!
//! # Where to put it in a stack
//!
//! Outermost first: retry → rate limit → **concurrency** → circuit breaker →
//! timeout → service. Retry outside gives each attempt its own slot (a call in
//! backoff holds none); a rate limiter outside means a caller sleeping on its
//! quota holds no slot; the breaker inside never sees saturation, which is not
//! the dependency's fault; the timeout inside frees the slot when a call hangs.
//!
//! # Bytes, not only calls
//!
//! A count of calls bounds no bytes: a dozen admitted requests can hold
//! hundreds of megabytes if one keeps a large buffer alive.
//! [`Config::max_bytes`] gives the bulkhead a byte budget beside its slots;
//! [`Bulkhead::try_acquire_bytes`] takes a slot and its bytes together, or
//! neither. The `http` feature's `http::HttpConcurrencyLayer` reserves a
//! request's `Content-Length` before its body is read.
//!
//! # Not all calls are alike
//!
//! A [`Ticket`] gives a call a priority in the line of waiting callers and a
//! weight in slots: [`Bulkhead::acquire_with`], or through a layer,
//! [`ConcurrencyLayer::classify`] with a classifier over the request. A
//! weighted call takes all its slots or none, and whatever the
//! [`QueueOrder`], the head of the line is never bypassed: not by new
//! arrivals, not by lighter callers. When waiting stops paying,
//! [`Config::saturation_signal`] sheds at once instead, and [`Config::codel`]
//! cuts waits short while the line stands; [`Bulkhead::close`] and
//! [`Bulkhead::drain`] end a bulkhead's life gracefully.
//!
//! # Watching it
//!
//! [`Bulkhead::status`] is a snapshot (state now, lifetime totals, windows
//! from a minute to a day); [`Config::on_event`] sees every [`Event`]; the
//! `metrics` and `tracing` features report through those facades.
//!
//! # Guides
//!
//! How it is built and why, what it promises and what checks each promise,
//! HTTP, scheduling, adaptive limits, per-key bulkheads, the fleet ceiling,
//! observability and the figures: the modules of [`guide`](guide/index.html)
//! (on docs.rs; `docs/` in the repository).
//!
//! # Features
//!
//! | feature | what it adds |
//! | --- | --- |
//! | `http` | `http::HttpConcurrencyLayer`: `503` with `Retry-After`, slots held until the response body ends, a byte budget reserved before the request body is read; `ServiceSaturated::http_status` (without it the crate does not depend on `http`) |
//! | `axum` | `IntoResponse` for [`ServiceSaturated`] (implies `http`) |
//! | `metrics` | `tower_inflight_*` counters, gauges and histograms through the `metrics` facade |
//! | `tracing` | a debug event per rejection; a warning per reclaimed slot, per invalid weight, and when the saturation signal goes up |
//! | `serde` | [`Status`] is `Serialize` |
//! | `redis` | [`redis::ClusterCeiling`]: one ceiling on calls in flight across every replica, leases in Redis |
//! | `test-util` | `ManualClock` and `Config::clock`: a test steps past `reclaim_after` without sleeping |
//!
//! [tower]: https://docs.rs/tower

#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod adaptive;
mod bulkhead;
pub mod ceiling;
mod config;
mod error;
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub mod http;
pub mod keyed;
#[cfg(all(test, tower_inflight_loom))]
mod loom_models;
mod observe;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis;
mod slots;
mod sync;
mod ticket;
mod tower;
mod wait;

#[cfg(any(test, feature = "test-util"))]
pub use bulkhead::ManualClock;
pub use bulkhead::{Acquire, BorrowedPermit, Bulkhead, ByteReservation, DrainTimedOut, Permit};
pub use config::{Config, ConfigError};
pub use error::{ServiceSaturated, ShedReason};
pub use observe::{Event, Status, Totals, Window};
pub use ticket::Ticket;
pub use tower::{
    Classified, ClassifiedFuture, ClassifiedLayer, Concurrency, ConcurrencyLayer, ResponseFuture,
};
pub use wait::{Comparator, QueueOrder, WaitingCall};

/// The guides: the pages under `docs/` in the repository, here so that
/// they can be read beside the API (and their code is run as doc tests).
#[cfg(any(docsrs, all(doctest, feature = "axum", feature = "redis")))]
pub mod guide {
    #[doc = include_str!("../docs/design.md")]
    pub mod design {}
    #[doc = include_str!("../docs/guarantees.md")]
    pub mod guarantees {}
    #[doc = include_str!("../docs/http.md")]
    pub mod http {}
    #[doc = include_str!("../docs/scheduling.md")]
    pub mod scheduling {}
    #[doc = include_str!("../docs/adaptive.md")]
    pub mod adaptive {}
    #[doc = include_str!("../docs/tenants.md")]
    pub mod tenants {}
    #[doc = include_str!("../docs/cluster.md")]
    pub mod cluster {}
    #[doc = include_str!("../docs/observability.md")]
    pub mod observability {}
    #[doc = include_str!("../docs/overload.md")]
    pub mod overload {}
    #[doc = include_str!("../docs/performance.md")]
    pub mod performance {}
}

/// The README, its code compiled and run as doc tests.
#[cfg(all(doctest, feature = "axum", feature = "redis"))]
#[doc = include_str!("../README.md")]
struct Readme;

/// The error type of [`Concurrency`]: the inner service's error, or
/// [`ServiceSaturated`], boxed.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
