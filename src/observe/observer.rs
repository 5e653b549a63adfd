//! What a bulkhead tells about itself: lifetime counters, the per-minute
//! rollups, the event hook, and (with their features) metrics and tracing.
//! Every event passes through here, so each is described once.

use crate::error::ShedReason;
use crate::observe::{Event, Hook, Refusals, Rollups, Totals};
use crate::sync::{AtomicU64, Ordering};
use std::time::Duration;

#[derive(Debug)]
pub(crate) struct Observer {
    hook: Option<Hook>,
    refusals: Refusals,
    reclaimed: AtomicU64,
    waits: AtomicU64,
    wait_nanos: AtomicU64,
    pub(crate) rollups: Rollups,
    #[cfg(feature = "metrics")]
    metrics: crate::observe::Metrics,
    #[cfg(feature = "tracing")]
    service: std::sync::Arc<str>,
    #[cfg(feature = "tracing")]
    limit: usize,
}

impl Observer {
    /// `name` and `limit` label the metrics and logs, when those features
    /// are on; the limit also sizes the refusal lanes. An `adaptive`
    /// limit also reports its baseline latency.
    pub(crate) fn new(
        name: Option<&str>,
        limit: usize,
        hook: Option<Hook>,
        rollups: Rollups,
        adaptive: bool,
    ) -> Self {
        #[cfg(any(feature = "metrics", feature = "tracing"))]
        let service = name.unwrap_or("bulkhead");
        #[cfg(not(feature = "metrics"))]
        let _ = adaptive;
        Self {
            hook,
            refusals: Refusals::new(name, limit),
            reclaimed: AtomicU64::new(0),
            waits: AtomicU64::new(0),
            wait_nanos: AtomicU64::new(0),
            rollups,
            #[cfg(feature = "metrics")]
            metrics: crate::observe::Metrics::register(service, limit, adaptive),
            #[cfg(feature = "tracing")]
            service: service.into(),
            #[cfg(feature = "tracing")]
            limit,
        }
    }

    #[inline]
    fn emit(&self, event: Event) {
        if let Some(hook) = &self.hook {
            (hook.0)(&event);
        }
    }

    /// Whether an event hook was set.
    #[inline(always)]
    pub(crate) fn has_hook(&self) -> bool {
        self.hook.is_some()
    }

    /// A permit was granted: counted in the metrics. Its event is
    /// [`admitted_event`](Self::admitted_event), apart, since the hook may
    /// panic before the permit exists. (The total of `Totals::admitted`,
    /// and the slots it holds, are counted by the slot table, which also
    /// keeps the in-flight gauge.)
    #[inline]
    pub(crate) fn admitted(&self) {
        #[cfg(feature = "metrics")]
        self.metrics.admitted.increment(1);
    }

    /// A permit's holder released its slots after `held`, if it was
    /// measured.
    #[inline]
    pub(crate) fn released(&self, held: Option<Duration>) {
        #[cfg(feature = "metrics")]
        if let Some(held) = held {
            self.metrics.hold_seconds.record(held.as_secs_f64());
        }
        let _ = held;
    }

    /// The adaptive limit moved from `from` to `to`.
    #[cold]
    pub(crate) fn limit_changed(&self, from: usize, to: usize) {
        self.emit(Event::LimitChanged { from, to });
        #[cfg(feature = "metrics")]
        self.metrics.limit.set(to as f64);
        #[cfg(feature = "tracing")]
        tracing::debug!(service = %self.service, from, to, "adaptive limit moved");
    }

    /// The adaptive limit's algorithm reported `baseline` as the latency
    /// without queueing.
    #[inline]
    pub(crate) fn baseline_latency(&self, baseline: Option<Duration>) {
        #[cfg(feature = "metrics")]
        if let Some(baseline) = baseline {
            self.metrics.baseline_latency(baseline);
        }
        let _ = baseline;
    }

    /// The event of an admission.
    pub(crate) fn admitted_event(&self) {
        self.emit(Event::Admitted);
    }

    /// The events of `slots` reclaimed slots, counted by
    /// [`reclaimed`](Self::reclaimed).
    pub(crate) fn reclaimed_events(&self, slots: usize) {
        for _ in 0..slots {
            self.emit(Event::Reclaimed);
        }
    }

    /// `slots` slots were taken over from holders that kept them past
    /// `reclaim_after`: counted, and a warning each. Their events are
    /// [`reclaimed_events`](Self::reclaimed_events).
    #[cold]
    pub(crate) fn reclaimed(&self, slots: usize) {
        self.reclaimed.fetch_add(slots as u64, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        self.metrics.reclaimed.increment(slots as u64);
        for _ in 0..slots {
            #[cfg(feature = "tracing")]
            tracing::warn!(
                service = %self.service,
                "bulkhead reclaimed a slot held past reclaim_after without a release: \
                 a leaked permit, or reclaim_after shorter than a call can take"
            );
        }
    }

    /// `slots` slots were reclaimed, by a claim that was then given back
    /// unused or by a drain: counted, and an event each.
    #[cold]
    pub(crate) fn reclaimed_with_events(&self, slots: usize) {
        if slots > 0 {
            self.reclaimed(slots);
            self.reclaimed_events(slots);
        }
    }

    /// The in-flight gauge, for the slot table, which counts the slots held.
    #[cfg(feature = "metrics")]
    pub(crate) fn in_flight_gauge(&self) -> metrics::Gauge {
        self.metrics.in_flight.clone()
    }

    /// A call was refused for `reason`: counted, and the bulkhead's name
    /// handed out for its error (see [`Refusals`]).
    pub(crate) fn rejected(&self, reason: ShedReason) -> Option<std::sync::Arc<str>> {
        let name = self.refusals.refuse(reason);
        self.emit(Event::Rejected { reason });
        #[cfg(feature = "metrics")]
        self.metrics.rejected[reason.index()].increment(1);
        #[cfg(feature = "tracing")]
        if reason == ShedReason::InvalidWeight {
            tracing::warn!(
                service = %self.service,
                limit = self.limit,
                "bulkhead refused a call whose weight was 0 or over the limit: a classifier bug"
            );
        } else {
            tracing::debug!(service = %self.service, limit = self.limit, reason = reason.as_str(), "bulkhead shed a call");
        }
        name
    }

    pub(crate) fn waited(&self, waited: Duration, admitted: bool, waiting_now: usize) {
        self.waits.fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
        self.wait_nanos.fetch_add(nanos, Ordering::Relaxed);
        self.emit(Event::Waited { waited, admitted });
        #[cfg(feature = "metrics")]
        {
            self.metrics.wait_seconds.record(waited.as_secs_f64());
            self.metrics.waiting.set(waiting_now as f64);
        }
        let _ = waiting_now;
    }

    /// The saturation signal went up (`raised`) or down.
    #[cold]
    pub(crate) fn saturation_signal(&self, raised: bool) {
        self.emit(Event::SaturationSignal { raised });
        #[cfg(feature = "metrics")]
        self.metrics
            .saturation_signal
            .set(f64::from(u8::from(raised)));
        #[cfg(feature = "tracing")]
        if raised {
            tracing::warn!(
                service = %self.service,
                "bulkhead saturation signal up: waits are mostly expiring, callers that find every slot held are shed at once"
            );
        } else {
            tracing::info!(service = %self.service, "bulkhead saturation signal down: a probe's wait paid off");
        }
    }

    /// The number of callers of `priority` waiting changed.
    #[cfg(feature = "metrics")]
    pub(crate) fn waiting_by_priority(&self, priority: i32, waiting_now: usize) {
        self.metrics.waiting_by_priority(priority, waiting_now);
    }

    /// Someone was parked: the number waiting changed.
    pub(crate) fn parked(&self, waiting_now: usize) {
        #[cfg(feature = "metrics")]
        self.metrics.waiting.set(waiting_now as f64);
        let _ = waiting_now;
    }

    /// The bytes reserved changed.
    #[inline]
    pub(crate) fn bytes(&self, reserved: impl FnOnce() -> u64) {
        #[cfg(feature = "metrics")]
        self.metrics.bytes_reserved.set(reserved() as f64);
        let _ = reserved;
    }

    /// Every byte was forgotten (the slot table moves the in-flight gauge
    /// by the slots it freed).
    pub(crate) fn reset(&self) {
        #[cfg(feature = "metrics")]
        self.metrics.bytes_reserved.set(0.0);
    }

    /// The totals, as this observer counted them, with the `admitted`
    /// that the slot table counts.
    pub(crate) fn totals(&self, admitted: u64) -> Totals {
        let rejected = |reason: ShedReason| self.refusals.count(reason);
        Totals {
            admitted,
            rejected_limit: rejected(ShedReason::LimitReached),
            rejected_wait_expired: rejected(ShedReason::WaitExpired),
            rejected_too_many_waiting: rejected(ShedReason::TooManyWaiting),
            rejected_bytes: rejected(ShedReason::Bytes),
            rejected_closed: rejected(ShedReason::Closed),
            rejected_cancelled: rejected(ShedReason::Cancelled),
            rejected_saturated: rejected(ShedReason::Saturated),
            rejected_invalid_weight: rejected(ShedReason::InvalidWeight),
            rejected_cluster_limit: rejected(ShedReason::ClusterLimit),
            rejected_cluster_unavailable: rejected(ShedReason::ClusterUnavailable),
            reclaimed: self.reclaimed.load(Ordering::Relaxed),
            waits: self.waits.load(Ordering::Relaxed),
            wait_time: Duration::from_nanos(self.wait_nanos.load(Ordering::Relaxed)),
        }
    }
}
