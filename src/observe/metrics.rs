//! The bulkhead's metrics, through the `metrics` facade.
//!
//! Handles are registered once, when the bulkhead is built, so a call costs
//! no key lookup and no allocation: install your recorder before building
//! the bulkhead. The one exception is the gauge of callers waiting with each
//! priority, registered the first time a caller waits with that priority,
//! through the global recorder. Every metric carries the label `service` (the bulkhead's
//! name, or `"bulkhead"`).

use crate::error::ShedReason;
use crate::sync::{lock, Mutex};
use metrics::{counter, gauge, histogram, Counter, Gauge, Histogram};
use std::collections::BTreeMap;

pub(crate) const ADMITTED: &str = "tower_inflight_admitted_total";
pub(crate) const REJECTED: &str = "tower_inflight_rejected_total";
pub(crate) const RECLAIMED: &str = "tower_inflight_reclaimed_total";
pub(crate) const IN_FLIGHT: &str = "tower_inflight_in_flight";
pub(crate) const WAITING: &str = "tower_inflight_waiting";
pub(crate) const WAITING_BY_PRIORITY: &str = "tower_inflight_waiting_by_priority";
pub(crate) const SATURATION_SIGNAL: &str = "tower_inflight_saturation_signal";
pub(crate) const LIMIT: &str = "tower_inflight_limit";
pub(crate) const BYTES_RESERVED: &str = "tower_inflight_bytes_reserved";
pub(crate) const WAIT_SECONDS: &str = "tower_inflight_wait_seconds";
pub(crate) const HOLD_SECONDS: &str = "tower_inflight_hold_seconds";
pub(crate) const BASELINE_LATENCY_SECONDS: &str = "tower_inflight_baseline_latency_seconds";

/// How many priorities get a waiting gauge of their own.
pub(crate) const MAX_PRIORITY_GAUGES: usize = 32;

#[derive(Debug)]
pub(crate) struct Metrics {
    pub(crate) admitted: Counter,
    pub(crate) rejected: [Counter; ShedReason::COUNT],
    pub(crate) reclaimed: Counter,
    pub(crate) in_flight: Gauge,
    pub(crate) waiting: Gauge,
    pub(crate) bytes_reserved: Gauge,
    pub(crate) wait_seconds: Histogram,
    pub(crate) hold_seconds: Histogram,
    pub(crate) saturation_signal: Gauge,
    /// The limit in force.
    pub(crate) limit: Gauge,
    /// The adaptive limit's baseline latency: registered only for an
    /// adaptive limit, so that static bulkheads do not report a zero.
    baseline_latency: Option<Gauge>,
    service: String,
    /// The per-priority gauges registered so far: parking is the slow path,
    /// but a registry lookup per park would still be waste.
    waiting_by_priority: Mutex<BTreeMap<i32, Gauge>>,
}

impl Metrics {
    pub(crate) fn register(service: &str, limit: usize, adaptive: bool) -> Self {
        let service = service.to_owned();
        let rejected = ShedReason::ALL.map(
            |reason| counter!(REJECTED, "service" => service.clone(), "reason" => reason.as_str()),
        );
        let limit_gauge = gauge!(LIMIT, "service" => service.clone());
        limit_gauge.set(limit as f64);
        Self {
            limit: limit_gauge,
            baseline_latency: adaptive
                .then(|| gauge!(BASELINE_LATENCY_SECONDS, "service" => service.clone())),
            admitted: counter!(ADMITTED, "service" => service.clone()),
            rejected,
            reclaimed: counter!(RECLAIMED, "service" => service.clone()),
            in_flight: gauge!(IN_FLIGHT, "service" => service.clone()),
            waiting: gauge!(WAITING, "service" => service.clone()),
            bytes_reserved: gauge!(BYTES_RESERVED, "service" => service.clone()),
            wait_seconds: histogram!(WAIT_SECONDS, "service" => service.clone()),
            hold_seconds: histogram!(HOLD_SECONDS, "service" => service.clone()),
            saturation_signal: gauge!(SATURATION_SIGNAL, "service" => service.clone()),
            service,
            waiting_by_priority: Mutex::new(BTreeMap::new()),
        }
    }

    /// Sets the gauge of the adaptive limit's baseline latency.
    pub(crate) fn baseline_latency(&self, latency: std::time::Duration) {
        if let Some(gauge) = &self.baseline_latency {
            gauge.set(latency.as_secs_f64());
        }
    }

    /// Sets the gauge of callers of `priority` waiting now. Only the first
    /// `MAX_PRIORITY_GAUGES` priorities seen get a gauge: priorities may come
    /// from request data, and each would be a time series.
    pub(crate) fn waiting_by_priority(&self, priority: i32, waiting: usize) {
        let mut gauges = lock(&self.waiting_by_priority);
        if gauges.len() >= MAX_PRIORITY_GAUGES && !gauges.contains_key(&priority) {
            return;
        }
        gauges
            .entry(priority)
            .or_insert_with(|| {
                gauge!(WAITING_BY_PRIORITY, "service" => self.service.clone(), "priority" => priority.to_string())
            })
            .set(waiting as f64);
    }
}
