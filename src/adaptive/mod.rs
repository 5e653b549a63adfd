//! Adaptive limits: a limit that finds the dependency's capacity, and keeps
//! finding it as it moves.
//!
//! A static limit is a guess. Set too high it protects nothing: calls queue
//! inside the dependency and latency climbs. Set too low it sheds calls that
//! could have been served. With [`Config::adaptive`](crate::Config::adaptive)
//! the limit given to [`Config::new`](crate::Config::new) becomes the most
//! the bulkhead ever admits, and the limit in force moves between
//! [`Adaptive::min`] and it, from each call's outcome and latency.
//!
//! ```
//! use std::time::Duration;
//! use tower::ServiceBuilder;
//! use tower_inflight::adaptive::Adaptive;
//! use tower_inflight::{Config, ConcurrencyLayer};
//!
//! let config = Config::new(200, Duration::from_secs(30)).adaptive(Adaptive::default());
//! let layer = ConcurrencyLayer::new(config);
//! let bulkhead = layer.bulkhead();
//! # let service = tower::service_fn(|_: ()| async { Ok::<_, std::convert::Infallible>(()) });
//! let service = ServiceBuilder::new().layer(layer).service(service);
//! assert_eq!(bulkhead.limit(), 20); // where it starts: `Adaptive::initial`
//! ```
//!
//! # What feeds it
//!
//! Only what the dependency says. A call the bulkhead sheds, a caller that
//! waits or gives up waiting, and a call cancelled before it finished are
//! never samples. Of the calls that finish:
//! - through [`ConcurrencyLayer`](crate::ConcurrencyLayer), a response is a
//!   sample of latency; an error that is a timeout
//!   (`tower::timeout::error::Elapsed`, `tokio::time::error::Elapsed`) is a
//!   *drop*, a sign of overload; any other error is ignored unless
//!   [`Adaptive::classify_errors`] says otherwise (an error before any I/O
//!   says nothing of the dependency's capacity);
//! - through [`HttpConcurrencyLayer`](crate::http::HttpConcurrencyLayer),
//!   503, 429 and the other 5xx statuses are drops, everything else a
//!   latency sample, measured when the response's head arrives (a refusal
//!   by a bulkhead further in is nothing); errors are as above;
//! - a [`Permit`](crate::Permit) taken by hand is a latency sample when it
//!   is dropped, unless [`Permit::record`](crate::Permit::record) said
//!   otherwise first (or it is dropped while its thread panics, or after
//!   its slot was reclaimed).
//!
//! Put a timeout inside the bulkhead, so that it sees the timeout's error:
//! a timeout outside it cancels the call, which is no sample.
//!
//! # The algorithms
//!
//! - [`Capacity`], the default: Little's law on windows of samples. It
//!   takes the dependency's capacity to be its throughput times its
//!   latency without queueing, and goes there in one step when latency
//!   says calls queue; it grows only while the limit is reached and latency
//!   stays near that baseline. See its docs for why it is shaped so.
//! - [`Vegas`], [`Gradient2`] and [`Aimd`], as Netflix's
//!   `concurrency-limits` defines them.
//! - Your own: implement [`Algorithm`].
//!
//! # What it cannot do
//!
//! It sees only this process's calls. A dependency shared with clients it
//! does not know of looks slower as they load it, and the limit shrinks to
//! leave them room; it cannot win capacity from them. With very little
//! traffic (a few calls a second) there are too few samples to learn from:
//! the limit stays where it is until the limit is reached. And a limit
//! follows capacity over windows of samples, not within one call: a
//! dependency that collapses at once still gets the calls admitted before
//! the limit moved.

mod aimd;
mod algorithm;
mod capacity;
mod gradient2;
mod limit;
mod vegas;

pub use aimd::Aimd;
pub use algorithm::{Algorithm, Outcome, Sample};
pub use capacity::Capacity;
pub use gradient2::Gradient2;
pub(crate) use limit::AdaptiveLimit;
pub use limit::{Adaptive, ErrorClassifier};
pub use vegas::Vegas;

/// `log10(limit)`, at least 1, as Netflix's algorithms scale their steps.
pub(crate) fn log10_at_least_one(limit: f64) -> f64 {
    limit.log10().floor().max(1.0)
}

/// An algorithm's own estimate of the limit, a real number, while it is the
/// limit in force; else the limit in force. Clamped by the bounds, an
/// estimate starts again from where they put it, as Netflix's algorithms
/// clamp their own: one left to run past the maximum would stop shrinking.
pub(crate) fn in_force(estimate: Option<f64>, limit: usize) -> f64 {
    match estimate {
        Some(estimate) if estimate as usize == limit => estimate,
        _ => limit as f64,
    }
}
