//! The error a bulkhead returns when it sheds a call.

use std::{fmt, sync::Arc, time::Duration};

/// A call was not started because the bulkhead was full.
///
/// This is *your own* backpressure, not the dependency's failure: the wrapped
/// service never ran, so a retry layer outside the bulkhead should not retry
/// it blindly and a circuit breaker inside it never sees it. Its HTTP form is
/// `503 Service Unavailable` with a `Retry-After` hint
/// ([`http_status`](Self::http_status), [`retry_after`](Self::retry_after)),
/// unlike a remote's `429 Too Many Requests`.
///
/// Through [`ConcurrencyLayer`](crate::ConcurrencyLayer) it arrives inside a
/// [`BoxError`](crate::BoxError); downcast to get it back:
///
/// ```
/// # use std::time::Duration;
/// use tower_inflight::{BoxError, ServiceSaturated, ShedReason};
///
/// fn describe(error: &BoxError) -> &'static str {
///     match error.downcast_ref::<ServiceSaturated>() {
///         Some(shed) if shed.reason() == ShedReason::WaitExpired => "busy, waited in vain",
///         Some(_) => "busy",
///         None => "failed",
///     }
/// }
/// # let bulkhead = tower_inflight::Bulkhead::new(tower_inflight::Config::new(1, Duration::from_secs(1)));
/// # let _held = bulkhead.try_acquire().unwrap();
/// # let error: BoxError = bulkhead.try_acquire().unwrap_err().into();
/// # assert_eq!(describe(&error), "busy");
/// ```
#[derive(Clone, Debug)]
pub struct ServiceSaturated {
    name: Option<Arc<str>>,
    limit: usize,
    reason: ShedReason,
    retry_after: Duration,
    /// A key's own bulkhead refused it (see [`is_per_key`](Self::is_per_key)).
    per_key: bool,
}

/// Why a bulkhead shed a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ShedReason {
    /// Every slot was held and the bulkhead has no `wait` budget (or the
    /// call could not wait). Free slots count as held while they are set
    /// aside for a weighted caller at the head of the line, or when fewer
    /// are free than the call's weight.
    LimitReached,
    /// The caller waited its whole `wait` budget and no slot came free.
    WaitExpired,
    /// Every slot was held (as for `LimitReached`) and `max_waiting`
    /// callers were already parked.
    TooManyWaiting,
    /// A slot was free but the byte budget
    /// ([`Config::max_bytes`](crate::Config::max_bytes)) was not; the slot
    /// was given back.
    Bytes,
    /// The bulkhead was [closed](crate::Bulkhead::close).
    Closed,
    /// The caller was waiting when its waiters were
    /// [cancelled](crate::Bulkhead::cancel_waiting).
    Cancelled,
    /// Every slot was held (as for `LimitReached`) and recent waits have
    /// mostly expired, so the caller was shed at once instead of waiting
    /// ([`Config::saturation_signal`](crate::Config::saturation_signal)).
    Saturated,
    /// The call asked for a weight of 0 slots, or more than the bulkhead
    /// has: it could never run ([`Ticket::weight`](crate::Ticket::weight)).
    InvalidWeight,
    /// A local slot was free, but the ceiling shared with other bulkheads
    /// was full: every replica together held its limit of leases (and the
    /// `wait` budget, if any, ran out asking). The local slot was given
    /// back. See [`ceiling`](crate::ceiling), and on Redis,
    /// [`ClusterCeiling`](crate::redis::ClusterCeiling).
    ClusterLimit,
    /// The ceiling's store could not be reached (or the call may not wait
    /// for a round trip, as `try_acquire` may not), and the ceiling's
    /// policy says to shed (on Redis,
    /// [`WhenUnreachable`](crate::redis::WhenUnreachable)). The local slot
    /// was given back.
    ClusterUnavailable,
    /// The call's key is new, and its [`KeyedBulkhead`](crate::keyed::KeyedBulkhead)
    /// holds `max_keys` keys already, none of them idle: nothing was
    /// allocated for it.
    TooManyKeys,
}

impl ShedReason {
    /// How many reasons there are, for tables indexed by reason.
    pub(crate) const COUNT: usize = REASONS.len();

    /// Every reason, in the order of [`index`](Self::index).
    #[cfg(feature = "metrics")]
    pub(crate) const ALL: [ShedReason; Self::COUNT] = {
        let mut all = [ShedReason::LimitReached; Self::COUNT];
        let mut at = 0;
        while at < Self::COUNT {
            all[at] = REASONS[at].0;
            at += 1;
        }
        all
    };

    /// Whether the call was refused for want of a slot (rather than bytes,
    /// a closed bulkhead, a cancelled wait or a bad weight).
    pub(crate) fn is_for_want_of_a_slot(self) -> bool {
        matches!(
            self,
            ShedReason::LimitReached
                | ShedReason::WaitExpired
                | ShedReason::TooManyWaiting
                | ShedReason::Saturated
        )
    }

    /// Its place in [`REASONS`], and in every table indexed by reason.
    pub(crate) fn index(self) -> usize {
        self as usize
    }

    /// A short, stable, lower-case label, fit for logs and metric labels.
    pub fn as_str(self) -> &'static str {
        REASONS[self.index()].1
    }
}

/// Every reason, in the order it is declared in (its `index`), with its
/// label and what it says to a person: the one list of them.
const REASONS: [(ShedReason, &str, &str); 11] = [
    (ShedReason::LimitReached, "limit", "all slots in use"),
    (
        ShedReason::WaitExpired,
        "wait_expired",
        "no slot came free within the wait budget",
    ),
    (
        ShedReason::TooManyWaiting,
        "too_many_waiting",
        "too many callers already waiting",
    ),
    (ShedReason::Bytes, "bytes", "the byte budget is spent"),
    (ShedReason::Closed, "closed", "the bulkhead is closed"),
    (ShedReason::Cancelled, "cancelled", "waiting was cancelled"),
    (
        ShedReason::Saturated,
        "saturated",
        "all slots in use, and recent waits were futile",
    ),
    (
        ShedReason::InvalidWeight,
        "invalid_weight",
        "the call's weight is 0 or more than the limit",
    ),
    (
        ShedReason::ClusterLimit,
        "cluster_limit",
        "the cluster-wide ceiling is full",
    ),
    (
        ShedReason::ClusterUnavailable,
        "cluster_unavailable",
        "the cluster ceiling could not be asked",
    ),
    (
        ShedReason::TooManyKeys,
        "too_many_keys",
        "too many keys held, none of them idle",
    ),
];

// Each reason is at its own index: the table and the enum agree.
const _: () = {
    let mut at = 0;
    while at < REASONS.len() {
        assert!(REASONS[at].0 as usize == at);
        at += 1;
    }
};

impl fmt::Display for ShedReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REASONS[self.index()].2)
    }
}

impl ServiceSaturated {
    pub(crate) fn new(
        name: Option<Arc<str>>,
        limit: usize,
        reason: ShedReason,
        retry_after: Duration,
    ) -> Self {
        Self {
            name,
            limit,
            reason,
            retry_after,
            per_key: false,
        }
    }

    /// The same refusal, made by a key's own bulkhead: named `name` if that
    /// bulkhead has no name of its own.
    pub(crate) fn by_key(mut self, name: Option<&Arc<str>>) -> Self {
        self.per_key = true;
        if self.name.is_none() {
            self.name = name.cloned();
        }
        self
    }

    /// The name of the bulkhead that shed the call, if it was given one.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// The bulkhead's limit: how many calls it lets run at once.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Whether a key's own limit refused the call, rather than the ceiling
    /// of a keyed bulkhead (or a plain bulkhead). Its [`name`](Self::name)
    /// is the per-key configuration's, or the ceiling's if that has none,
    /// and its [`limit`](Self::limit) the key's.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_inflight::keyed::{KeyedBulkhead, KeyedConfig};
    /// use tower_inflight::Config;
    ///
    /// let tenants = KeyedBulkhead::new(
    ///     KeyedConfig::new(Config::new(1, Duration::from_secs(30)))
    ///         .ceiling(Config::new(8, Duration::from_secs(30)).name("tenants")),
    /// );
    /// let _held = tenants.try_acquire(&"acme").unwrap();
    /// let shed = tenants.try_acquire(&"acme").unwrap_err();
    /// assert!(shed.is_per_key());
    /// assert_eq!(shed.limit(), 1);
    /// assert_eq!(
    ///     shed.to_string(),
    ///     "bulkhead `tenants` saturated (limit 1 per key): all slots in use"
    /// );
    /// ```
    pub fn is_per_key(&self) -> bool {
        self.per_key
    }

    /// Why the call was shed.
    pub fn reason(&self) -> ShedReason {
        self.reason
    }

    /// How long a client should wait before trying again (the bulkhead's
    /// [`Config::retry_after`](crate::Config::retry_after)).
    pub fn retry_after(&self) -> Duration {
        self.retry_after
    }

    /// `503 Service Unavailable`: the server's own bulkhead refused the call.
    /// Except for [`ShedReason::InvalidWeight`], which no retry can cure: a
    /// classifier asked for a weight the bulkhead cannot give, a server bug,
    /// so `500 Internal Server Error`.
    #[cfg(feature = "http")]
    #[cfg_attr(docsrs, doc(cfg(feature = "http")))]
    pub fn http_status(&self) -> http::StatusCode {
        match self.reason {
            ShedReason::InvalidWeight => http::StatusCode::INTERNAL_SERVER_ERROR,
            _ => http::StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

impl fmt::Display for ServiceSaturated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.name {
            Some(name) => write!(f, "bulkhead `{name}` saturated")?,
            None => f.write_str("bulkhead saturated")?,
        }
        let per_key = if self.per_key { " per key" } else { "" };
        write!(f, " (limit {}{per_key}): {}", self.limit, self.reason)
    }
}

impl std::error::Error for ServiceSaturated {}

#[cfg(all(test, not(tower_inflight_loom)))]
mod tests {
    use super::*;

    #[test]
    fn display_names_the_bulkhead_its_limit_and_the_reason() {
        let shed = ServiceSaturated::new(
            Some("payments".into()),
            25,
            ShedReason::TooManyWaiting,
            Duration::from_secs(1),
        );
        assert_eq!(
            shed.to_string(),
            "bulkhead `payments` saturated (limit 25): too many callers already waiting"
        );
        #[cfg(feature = "http")]
        assert_eq!(shed.http_status(), http::StatusCode::SERVICE_UNAVAILABLE);
    }
}
