//! What an adaptive algorithm is given, and what it answers.

use std::time::Duration;

/// What a finished call says of the dependency.
///
/// Behind the HTTP layers, a handler may put one in its response's
/// extensions, which the layer then takes over its reading of the status:
///
/// ```
/// use tower_inflight::adaptive::Outcome;
///
/// // Answered from a cache: it says nothing of the dependency's latency.
/// let mut response = http::Response::new(String::from("from the cache"));
/// response.extensions_mut().insert(Outcome::Ignore);
/// # let _ = response;
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// It was served: its latency is a sample.
    Success,
    /// The dependency was overloaded (it timed out, or answered 503, 429 or
    /// another 5xx): a sign to shrink. Its latency is no sample.
    Dropped,
    /// It says nothing of the dependency's capacity (an error before any
    /// I/O, a cache hit, a call that did no work): not a sample.
    Ignore,
}

/// One finished call, as an [`Algorithm`] sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct Sample {
    /// From admission to the outcome.
    pub latency: Duration,
    /// Calls in flight when this one was admitted, itself included.
    pub in_flight: usize,
    /// Whether the dependency dropped it ([`Outcome::Dropped`]).
    pub dropped: bool,
    /// When it finished, on the bulkhead's clock (from an arbitrary start):
    /// for algorithms that work in windows of time.
    pub now: Duration,
}

impl Sample {
    /// A sample, for testing an [`Algorithm`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_inflight::adaptive::{Aimd, Algorithm, Sample};
    ///
    /// let mut aimd = Aimd::default();
    /// let sample = Sample::new(Duration::from_millis(10), 20, false, Duration::ZERO);
    /// assert_eq!(aimd.update(&sample, 20), 21);
    /// ```
    pub fn new(latency: Duration, in_flight: usize, dropped: bool, now: Duration) -> Self {
        Self {
            latency,
            in_flight,
            dropped,
            now,
        }
    }
}

/// An algorithm that moves a limit from the samples of finished calls.
///
/// The bulkhead calls [`update`](Self::update) once for each sample, one
/// call at a time, and puts the answer in force, clamped to
/// `[Adaptive::min, Config::limit]`. An algorithm is cloned for each
/// bulkhead a configuration builds (each key of a keyed bulkhead adapts
/// alone), so it must be `Clone`.
///
/// ```
/// use tower_inflight::adaptive::{Algorithm, Sample};
///
/// /// Halves on a drop, grows by one otherwise.
/// #[derive(Clone)]
/// struct Halving;
///
/// impl Algorithm for Halving {
///     fn update(&mut self, sample: &Sample, limit: usize) -> usize {
///         if sample.dropped { limit / 2 } else { limit + 1 }
///     }
/// }
/// ```
pub trait Algorithm: Send + 'static {
    /// The limit to put in force after `sample`, given `limit`, the limit in
    /// force now.
    fn update(&mut self, sample: &Sample, limit: usize) -> usize;

    /// The latency the algorithm takes as the dependency's own, without
    /// queueing, if it keeps one: reported by `metrics`.
    fn baseline(&self) -> Option<Duration> {
        None
    }
}
