//! The adaptive limit's configuration, and the state a bulkhead keeps for it.

use crate::adaptive::{Algorithm, Capacity, Outcome, Sample};
use crate::sync::{lock, Mutex};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Decides what an error from the inner service says of the dependency.
pub type ErrorClassifier = Arc<dyn Fn(&(dyn std::error::Error + 'static)) -> Outcome + Send + Sync>;

/// An adaptive limit, for [`Config::adaptive`](crate::Config::adaptive): the
/// algorithm, the least limit it may set, and where it starts. The most it
/// may set is the configuration's `limit`.
///
/// ```
/// use std::time::Duration;
/// use tower_inflight::adaptive::{Adaptive, Vegas};
/// use tower_inflight::{Bulkhead, Config};
///
/// let bulkhead = Bulkhead::new(
///     Config::new(100, Duration::from_secs(30))
///         .adaptive(Adaptive::new(Vegas::default()).min(4).initial(10)),
/// );
/// assert_eq!(bulkhead.limit(), 10);
/// ```
#[derive(Clone)]
pub struct Adaptive {
    make: Arc<dyn Fn() -> Box<dyn Algorithm> + Send + Sync>,
    pub(crate) min: usize,
    pub(crate) initial: Option<usize>,
    errors: Option<ErrorClassifier>,
}

impl Adaptive {
    /// A limit moved by `algorithm`, from a least of 1, starting at 20 (or
    /// the configuration's `limit`, if lower).
    pub fn new<A: Algorithm + Clone + Sync>(algorithm: A) -> Self {
        Self {
            make: Arc::new(move || Box::new(algorithm.clone())),
            min: 1,
            initial: None,
            errors: None,
        }
    }

    /// The least limit the algorithm may set (1 unless set). Refused at
    /// construction if 0 or over the configuration's `limit`.
    pub fn min(mut self, min: usize) -> Self {
        self.min = min;
        self
    }

    /// The limit in force when the bulkhead is made (20 unless set, kept
    /// within `[min, limit]`). Refused at construction if outside them.
    pub fn initial(mut self, initial: usize) -> Self {
        self.initial = Some(initial);
        self
    }

    /// What an error of the inner service, other than a timeout, says of
    /// the dependency. Unless set, nothing: it is ignored. A timeout
    /// (`tower::timeout::error::Elapsed`, `tokio::time::error::Elapsed`, or
    /// an error wrapping one) is always a drop. (Behind the HTTP layers,
    /// whose inner service may have any error type, the classifier sees
    /// the errors that are a `BoxError`.)
    ///
    /// ```
    /// use tower_inflight::adaptive::{Adaptive, Outcome};
    ///
    /// // Connection errors say the dependency is overloaded.
    /// let adaptive = Adaptive::default().classify_errors(|error| {
    ///     if error.to_string().contains("connection refused") {
    ///         Outcome::Dropped
    ///     } else {
    ///         Outcome::Ignore
    ///     }
    /// });
    /// ```
    pub fn classify_errors<F>(mut self, classify: F) -> Self
    where
        F: Fn(&(dyn std::error::Error + 'static)) -> Outcome + Send + Sync + 'static,
    {
        self.errors = Some(Arc::new(classify));
        self
    }

    /// The initial limit for a configuration whose `limit` is `max`.
    pub(crate) fn initial_for(&self, max: usize) -> usize {
        let min = self.min.min(max);
        self.initial
            .map_or(20, |initial| initial.min(max))
            .clamp(min, max)
    }
}

impl Default for Adaptive {
    /// [`Capacity`], with its defaults.
    fn default() -> Self {
        Self::new(Capacity::default())
    }
}

impl fmt::Debug for Adaptive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Adaptive")
            .field("min", &self.min)
            .field("initial", &self.initial)
            .field("classify_errors", &self.errors.is_some())
            .finish_non_exhaustive()
    }
}

/// A bulkhead's adaptive limit: its own algorithm, and its bounds.
pub(crate) struct AdaptiveLimit {
    /// Locked for each sample, and across putting its answer in force, so
    /// that limits are put in force in the order the algorithm gave them.
    algorithm: Mutex<Box<dyn Algorithm>>,
    min: usize,
    max: usize,
    errors: Option<ErrorClassifier>,
}

impl AdaptiveLimit {
    pub(crate) fn new(adaptive: &Adaptive, max: usize) -> Self {
        Self {
            algorithm: Mutex::new((adaptive.make)()),
            // A key's limit may be under the configured least.
            min: adaptive.min.min(max),
            max,
            errors: adaptive.errors.clone(),
        }
    }

    /// The outcome of a call that failed with `error`.
    pub(crate) fn classify_error(&self, error: &(dyn std::error::Error + 'static)) -> Outcome {
        if is_timeout(error) {
            return Outcome::Dropped;
        }
        // A shed by a bulkhead further in is no sign of this dependency's
        // capacity, whatever the classifier would say of errors.
        if error.is::<crate::ServiceSaturated>() {
            return Outcome::Ignore;
        }
        self.errors
            .as_ref()
            .map_or(Outcome::Ignore, |classify| classify(error))
    }

    /// The outcome of a call that failed with `error`, of any type: a
    /// `BoxError` is classified as [`classify_error`](Self::classify_error)
    /// does; a timeout's own error is a drop; anything else is ignored.
    #[cfg(feature = "http")]
    pub(crate) fn classify_any(&self, error: &dyn std::any::Any) -> Outcome {
        if let Some(boxed) = error.downcast_ref::<crate::BoxError>() {
            self.classify_error(&**boxed)
        } else if error.is::<tokio::time::error::Elapsed>()
            || error.is::<tower::timeout::error::Elapsed>()
        {
            Outcome::Dropped
        } else {
            Outcome::Ignore
        }
    }

    /// Feeds `sample` to the algorithm, with the limit `in_force` reads
    /// under the algorithm's lock, and puts its answer, clamped, in force
    /// with `put_in_force` under the same lock: two samples recorded at
    /// once each see the limit the other left, in the order they took the
    /// lock. Returns the move made, if any, and the algorithm's baseline
    /// latency: what follows a move (waking the callers waiting, the event
    /// hook) is the caller's to do once the lock is let go.
    pub(crate) fn update(
        &self,
        sample: &Sample,
        in_force: impl FnOnce() -> usize,
        put_in_force: impl FnOnce(usize),
    ) -> (Option<(usize, usize)>, Option<Duration>) {
        let mut algorithm = lock(&self.algorithm);
        let from = in_force();
        let to = algorithm.update(sample, from).clamp(self.min, self.max);
        let moved = (to != from).then(|| {
            put_in_force(to);
            (from, to)
        });
        (moved, algorithm.baseline())
    }
}

impl fmt::Debug for AdaptiveLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveLimit")
            .field("min", &self.min)
            .field("max", &self.max)
            .finish_non_exhaustive()
    }
}

/// Whether `error`, or an error it wraps, is a timeout.
fn is_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut error = Some(error);
    while let Some(current) = error {
        if current.is::<tokio::time::error::Elapsed>()
            || current.is::<tower::timeout::error::Elapsed>()
        {
            return true;
        }
        error = current.source();
    }
    false
}
