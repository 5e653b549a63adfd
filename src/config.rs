//! A bulkhead's configuration and its validation.

use crate::bulkhead::{max_reclaim_after, ManualClock};
use crate::ceiling::{Ceiling, Given, Install};
use crate::observe::{Event, Hook};
use crate::slots::{MAX_BYTES, MAX_SLOTS};
use crate::wait::{CodelSettings, QueueOrder, Thresholds};
use std::{fmt, sync::Arc, time::Duration};

/// How a bulkhead behaves: its limit, when an abandoned slot is reclaimed, and
/// whether a caller may wait for a slot.
///
/// `limit` and `reclaim_after` are required because no default is right for
/// them: `limit` is sized to the resource you protect (usually your connection
/// pool), and `reclaim_after` must be longer than any legitimate call, which
/// only your client's timeout knows.
///
/// ```
/// use std::time::Duration;
/// use tower_inflight::Config;
///
/// let config = Config::new(25, Duration::from_secs(30)) // limit, reclaim_after
///     .wait(Duration::from_millis(50))                  // park up to 50 ms for a slot
///     .max_waiting(64)                                  // shed at once past 64 parked
///     .name("payments");
/// assert!(config.validate().is_ok());
///
/// let bad = Config::new(25, Duration::from_secs(1)).wait(Duration::from_secs(1));
/// assert_eq!(bad.validate().unwrap_err().field(), "wait");
/// ```
#[derive(Clone, Debug)]
pub struct Config {
    pub(crate) limit: usize,
    pub(crate) reclaim_after: Duration,
    pub(crate) wait: Option<Duration>,
    pub(crate) max_waiting: Option<usize>,
    pub(crate) name: Option<Arc<str>>,
    pub(crate) retry_after: Duration,
    pub(crate) clock: Option<ManualClock>,
    pub(crate) max_bytes: Option<u64>,
    pub(crate) on_event: Option<Hook>,
    // The settings most bulkheads leave out are boxed: a configuration is
    // copied into every key of a keyed bulkhead (which, with one of them
    // set, allocates it anew for each key made).
    pub(crate) saturation_signal: Option<Box<Thresholds>>,
    pub(crate) queue_order: QueueOrder,
    pub(crate) codel: Option<Box<CodelSettings>>,
    pub(crate) adaptive: Option<Box<crate::adaptive::Adaptive>>,
    pub(crate) ceiling: Option<Arc<dyn Install>>,
}

impl Config {
    /// At most `limit` calls in flight; a slot held for `reclaim_after`
    /// without being released is taken to be abandoned and reused.
    ///
    /// Set `reclaim_after` longer than your client's timeout: reclaiming a
    /// slot from a call that is merely slow briefly admits more than `limit`.
    /// It may be up to about 34 years (12 days with a
    /// [`ManualClock`](crate::ManualClock)); a longer one, `Duration::MAX`
    /// included, is refused by [`validate`](Self::validate) rather than cut,
    /// since a hold the slot table cannot date would free slots early.
    pub fn new(limit: usize, reclaim_after: Duration) -> Self {
        Self {
            limit,
            reclaim_after,
            wait: None,
            max_waiting: None,
            name: None,
            retry_after: Duration::from_secs(1),
            clock: None,
            max_bytes: None,
            on_event: None,
            saturation_signal: None,
            queue_order: QueueOrder::Fifo,
            codel: None,
            adaptive: None,
            ceiling: None,
        }
    }

    /// Lets a caller that finds every slot held wait up to `wait` for one,
    /// holding no slot meanwhile, before it is shed. The default is not to
    /// wait at all; `Duration::ZERO` means the same.
    ///
    /// `wait` must be shorter than `reclaim_after`: waiting without a bound
    /// is the pile-up a bulkhead exists to prevent.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = (!wait.is_zero()).then_some(wait);
        self
    }

    /// Caps how many callers may wait at once; past it a caller is shed at
    /// once. Only matters with a [`wait`](Self::wait) budget. Unbounded by
    /// default (the number parked is then bounded by arrival rate × `wait`).
    pub fn max_waiting(mut self, max_waiting: usize) -> Self {
        self.max_waiting = Some(max_waiting);
        self
    }

    /// A name for the bulkhead, carried by its errors and logs.
    pub fn name(mut self, name: impl Into<Arc<str>>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The hint [`ServiceSaturated::retry_after`](crate::ServiceSaturated::retry_after)
    /// gives clients (one second by default).
    pub fn retry_after(mut self, retry_after: Duration) -> Self {
        self.retry_after = retry_after;
        self
    }

    /// Gives the bulkhead a byte budget beside its slots: a call admitted by
    /// [`Bulkhead::try_acquire_bytes`](crate::Bulkhead::try_acquire_bytes) or
    /// [`acquire_bytes`](crate::Bulkhead::acquire_bytes) takes a slot *and* its
    /// share of `max_bytes`, or neither. A count of calls bounds no bytes: a
    /// few admitted requests can hold far more memory than the rest together.
    pub fn max_bytes(mut self, max_bytes: u64) -> Self {
        self.max_bytes = Some(max_bytes);
        self
    }

    /// In which order waiting callers get freed slots ([`QueueOrder::Fifo`]
    /// by default). Priorities come from a call's [`Ticket`](crate::Ticket)
    /// ([`Bulkhead::acquire_with`](crate::Bulkhead::acquire_with), a
    /// classifier) or from
    /// [`Bulkhead::acquire_with_priority`](crate::Bulkhead::acquire_with_priority):
    /// the lower, the sooner.
    ///
    /// A keyed bulkhead's ceiling takes none of its own: its line takes
    /// turns across keys, and one set there is refused at construction.
    pub fn queue_order(mut self, order: QueueOrder) -> Self {
        self.queue_order = order;
        self
    }

    /// Stops making callers wait when waiting has been futile: once at least
    /// `min_waits` waits have ended within `window` and at least
    /// `expired_ratio` of them expired, a caller that finds every slot held
    /// is shed at once ([`ShedReason::Saturated`](crate::ShedReason::Saturated))
    /// instead of parking. One caller at a time still parks as a probe; when
    /// its wait succeeds, parking resumes. It never refuses a free slot: it
    /// only skips waits that would most likely expire.
    ///
    /// Only matters with a [`wait`](Self::wait) budget.
    pub fn saturation_signal(
        mut self,
        expired_ratio: f64,
        min_waits: u64,
        window: Duration,
    ) -> Self {
        self.saturation_signal = Some(Box::new(Thresholds {
            expired_ratio,
            min_waits,
            window,
        }));
        self
    }

    /// Cuts new waits to `target` once the line of waiting callers has not
    /// emptied for `interval` (CoDel, as in Meta's "Fail at Scale"). A line
    /// that empties now and then is absorbing bursts, and gets the whole
    /// [`wait`](Self::wait) budget; one that has stood for a whole interval
    /// is a standing queue, where long waits only add latency and mostly
    /// expire. Callers already waiting keep their budget. `target` must be
    /// above zero and shorter than `wait`, `interval` above zero; typical
    /// values are a few milliseconds and about a hundred.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_inflight::Config;
    ///
    /// let config = Config::new(32, Duration::from_secs(30))
    ///     .wait(Duration::from_millis(200))
    ///     .codel(Duration::from_millis(5), Duration::from_millis(100));
    /// assert!(config.validate().is_ok());
    /// ```
    pub fn codel(mut self, target: Duration, interval: Duration) -> Self {
        self.codel = Some(Box::new(CodelSettings { target, interval }));
        self
    }

    /// Makes the limit adaptive: it moves between
    /// [`Adaptive::min`](crate::adaptive::Adaptive::min) and this
    /// configuration's `limit`, from each call's outcome and latency (see
    /// [`adaptive`](crate::adaptive)). [`Bulkhead::limit`](crate::Bulkhead::limit)
    /// and the status report the limit in force.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_inflight::adaptive::Adaptive;
    /// use tower_inflight::{Bulkhead, Config};
    ///
    /// let bulkhead = Bulkhead::new(
    ///     Config::new(200, Duration::from_secs(30)).adaptive(Adaptive::default()),
    /// );
    /// assert_eq!(bulkhead.limit(), 20);
    /// assert_eq!(bulkhead.status().max_limit, 200);
    /// ```
    pub fn adaptive(mut self, adaptive: crate::adaptive::Adaptive) -> Self {
        self.adaptive = Some(Box::new(adaptive));
        self
    }

    /// Calls `hook` for every [`Event`]: a call admitted or shed, a slot
    /// reclaimed, a wait ended. The hook runs on the caller's thread, inside
    /// the bulkhead's bookkeeping, so it must be quick and must not block;
    /// without one, nothing is paid for it.
    pub fn on_event(mut self, hook: impl Fn(&Event) + Send + Sync + 'static) -> Self {
        self.on_event = Some(Hook(Arc::new(hook)));
        self
    }

    /// A ceiling on calls in flight shared with other bulkheads, on top of
    /// this one's own `limit` (see [`ceiling`](crate::ceiling)): a call
    /// takes its local slots first, then a lease, both or neither. Every
    /// bulkhead built from this configuration asks `ceiling`. A
    /// configuration has one ceiling: this replaces any given before.
    pub fn ceiling(mut self, ceiling: impl Ceiling) -> Self {
        self.ceiling = Some(Arc::new(Given(ceiling)));
        self
    }

    /// Reads deadlines from `clock` instead of the system's monotonic clock,
    /// so tests can step past `reclaim_after` without sleeping. The `wait`
    /// budget is unaffected: it is timed by Tokio, whose clock tests pause
    /// with `tokio::time::pause`.
    #[cfg(any(test, feature = "test-util"))]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    pub fn clock(mut self, clock: ManualClock) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Checks the configuration, naming the field that is wrong.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.limit == 0 {
            return Err(ConfigError::new(
                "limit",
                "must be at least 1: a bulkhead of 0 slots would shed every call",
            ));
        }
        if self.limit > MAX_SLOTS {
            return Err(ConfigError::new(
                "limit",
                format!("{} is over the maximum of {MAX_SLOTS}", self.limit),
            ));
        }
        if self.reclaim_after.is_zero() {
            return Err(ConfigError::new(
                "reclaim_after",
                "must be longer than zero: set it above your client's timeout",
            ));
        }
        let max_reclaim_after = max_reclaim_after(self.clock.is_some());
        if self.reclaim_after > max_reclaim_after {
            return Err(ConfigError::new(
                "reclaim_after",
                format!(
                    "{:?} is over the maximum of {max_reclaim_after:?} ({} days), the longest hold a slot can date{}",
                    self.reclaim_after,
                    max_reclaim_after.as_secs() / 86_400,
                    if self.clock.is_some() { " on a ManualClock" } else { "" },
                ),
            ));
        }
        if let Some(wait) = self.wait {
            if wait >= self.reclaim_after {
                return Err(ConfigError::new(
                    "wait",
                    format!(
                        "{wait:?} must be shorter than reclaim_after ({:?}): an unbounded wait is the pile-up the limit exists to prevent",
                        self.reclaim_after
                    ),
                ));
            }
        }
        if let Some(adaptive) = &self.adaptive {
            if adaptive.min == 0 || adaptive.min > self.limit {
                return Err(ConfigError::new(
                    "adaptive.min",
                    format!(
                        "{} must be at least 1 and at most the limit ({})",
                        adaptive.min, self.limit
                    ),
                ));
            }
            if let Some(initial) = adaptive.initial {
                if initial < adaptive.min || initial > self.limit {
                    return Err(ConfigError::new(
                        "adaptive.initial",
                        format!(
                            "{initial} must be within adaptive.min ({}) and the limit ({})",
                            adaptive.min, self.limit
                        ),
                    ));
                }
            }
        }
        if self.max_waiting == Some(0) {
            return Err(ConfigError::new(
                "max_waiting",
                "must be at least 1; to shed at once instead of waiting, leave `wait` unset",
            ));
        }
        if let Some(ceiling) = &self.ceiling {
            ceiling.validate(self)?;
        }
        if let Some(&thresholds) = self.saturation_signal.as_deref() {
            if !(thresholds.expired_ratio > 0.0 && thresholds.expired_ratio <= 1.0) {
                return Err(ConfigError::new(
                    "saturation_signal",
                    format!(
                        "expired_ratio {} must be in (0, 1]",
                        thresholds.expired_ratio
                    ),
                ));
            }
            if thresholds.min_waits == 0 || thresholds.window.is_zero() {
                return Err(ConfigError::new(
                    "saturation_signal",
                    "min_waits and window must be above zero: the signal needs waits to judge by",
                ));
            }
        }
        if let Some(&codel) = self.codel.as_deref() {
            if codel.target.is_zero() || codel.interval.is_zero() {
                return Err(ConfigError::new(
                    "codel",
                    "target and interval must be above zero",
                ));
            }
            if self.wait.is_some_and(|wait| codel.target >= wait) {
                return Err(ConfigError::new(
                    "codel",
                    format!(
                        "target {:?} must be shorter than wait ({:?}): it is the cut-down wait",
                        codel.target, self.wait
                    ),
                ));
            }
        }
        match self.max_bytes {
            Some(0) => return Err(ConfigError::new(
                "max_bytes",
                "must be at least 1: a byte budget of 0 would shed every call that carries a body",
            )),
            Some(max_bytes) if max_bytes > MAX_BYTES => {
                return Err(ConfigError::new(
                    "max_bytes",
                    format!("{max_bytes} is over the maximum of {MAX_BYTES} (4 TiB)"),
                ))
            }
            _ => {}
        }
        Ok(())
    }
}

/// A [`Config`] that was refused, with the field at fault.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    field: &'static str,
    problem: String,
}

impl ConfigError {
    pub(crate) fn new(field: &'static str, problem: impl Into<String>) -> Self {
        Self {
            field,
            problem: problem.into(),
        }
    }

    /// `built`, or a panic with the error's message at the caller's caller
    /// (a `new` that panics on a bad configuration is `#[track_caller]`,
    /// and a panic in a closure would point here instead).
    #[track_caller]
    pub(crate) fn unwrap<T>(built: Result<T, Self>) -> T {
        match built {
            Ok(built) => built,
            Err(error) => panic!("{error}"),
        }
    }

    /// The same error, of the configuration of a keyed bulkhead's ceiling:
    /// its field is named `ceiling.<field>`.
    pub(crate) fn of_ceiling(self) -> Self {
        let field = match self.field {
            "limit" => "ceiling.limit",
            "reclaim_after" => "ceiling.reclaim_after",
            "wait" => "ceiling.wait",
            "max_waiting" => "ceiling.max_waiting",
            "max_bytes" => "ceiling.max_bytes",
            "saturation_signal" => "ceiling.saturation_signal",
            "codel" => "ceiling.codel",
            "adaptive.min" => "ceiling.adaptive.min",
            "adaptive.initial" => "ceiling.adaptive.initial",
            "cluster_ceiling.backoff" => "ceiling.cluster_ceiling.backoff",
            "cluster_ceiling.lease" => "ceiling.cluster_ceiling.lease",
            "cluster_ceiling.limit" => "ceiling.cluster_ceiling.limit",
            "cluster_ceiling.name" => "ceiling.cluster_ceiling.name",
            "cluster_ceiling.timeout" => "ceiling.cluster_ceiling.timeout",
            "cluster_ceiling.when_unreachable" => "ceiling.cluster_ceiling.when_unreachable",
            "cluster_ceiling.weight" => "ceiling.cluster_ceiling.weight",
            other => other,
        };
        Self { field, ..self }
    }

    /// The name of the configuration field that was refused, e.g. `"wait"`.
    pub fn field(&self) -> &'static str {
        self.field
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid bulkhead config: `{}` {}",
            self.field, self.problem
        )
    }
}

impl std::error::Error for ConfigError {}
