//! Figures from outcomes: a class of tenants' success, latency, goodput.

use crate::load::{Outcome, Status};
use std::time::Duration;

pub(crate) use crate::demo::quantile;

/// How one class of tenants (the quiet ones, or the noisy one) fared.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Class {
    pub(crate) requests: usize,
    /// Requests sent per second.
    pub(crate) offered: f64,
    /// % of requests answered 200 within the client's timeout.
    pub(crate) success: f64,
    /// % of requests answered 503.
    pub(crate) shed: f64,
    /// % of requests given up at the client's timeout, or failed otherwise.
    pub(crate) failed: f64,
    /// Latency of the successful requests.
    pub(crate) p50: Duration,
    pub(crate) p99: Duration,
    /// Successful requests per second, among those sent in the steady
    /// window: from `warm_up` after the load starts to `warm_up` before it
    /// ends. Counted by when they were sent, not when they finished: with
    /// every call taking the same time, calls finish in clumps, and a window
    /// of finishes would count a clump more or less by where its edges fall.
    pub(crate) goodput: f64,
}

impl Class {
    pub(crate) fn new<'a>(
        outcomes: impl Iterator<Item = &'a Outcome>,
        seconds: f64,
        warm_up: f64,
    ) -> Self {
        let outcomes: Vec<&Outcome> = outcomes.collect();
        let requests = outcomes.len();
        if requests == 0 {
            return Self::default();
        }
        let share = |status: Status| {
            100.0 * outcomes.iter().filter(|o| o.status == status).count() as f64 / requests as f64
        };
        let mut ok: Vec<Duration> = outcomes
            .iter()
            .filter(|o| o.status == Status::Ok)
            .map(|o| o.latency)
            .collect();
        let window = warm_up..seconds - warm_up;
        let in_window = outcomes
            .iter()
            .filter(|o| o.status == Status::Ok && window.contains(&o.due))
            .count();
        Self {
            requests,
            offered: requests as f64 / seconds,
            success: share(Status::Ok),
            shed: share(Status::Shed),
            failed: share(Status::TimedOut) + share(Status::Failed),
            p50: quantile(&mut ok, 0.50),
            p99: quantile(&mut ok, 0.99),
            goodput: in_window as f64 / (seconds - 2.0 * warm_up),
        }
    }
}
