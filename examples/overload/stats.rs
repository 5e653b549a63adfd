//! Figures from outcomes: percentiles, the Erlang-B floor, peak memory.

use crate::demo::Rng;
use crate::load::{Arrivals, Outcome, Status};
use std::time::Duration;

pub(crate) use crate::demo::quantile;

pub(crate) fn latencies(outcomes: &[Outcome], status: Status) -> Vec<Duration> {
    outcomes
        .iter()
        .filter(|o| o.status == status)
        .map(|o| o.latency)
        .collect()
}

pub(crate) fn count(outcomes: &[Outcome], status: Status) -> usize {
    outcomes.iter().filter(|o| o.status == status).count()
}

/// Erlang's loss formula: the share of Poisson arrivals that find all
/// `servers` busy when `erlangs` of work is offered. No limiter that never
/// queues can shed less under Poisson arrivals.
pub(crate) fn erlang_b(erlangs: f64, servers: usize) -> f64 {
    (1..=servers).fold(1.0, |blocked, k| {
        erlangs * blocked / (k as f64 + erlangs * blocked)
    })
}

/// The share an ideal limiter sheds: `servers` slots each busy for `service`
/// a call, and a FIFO line in which a caller waits at most `patience` (zero:
/// no line at all), simulated over many arrivals of the same kind.
pub(crate) fn fifo_floor(
    rate: f64,
    service: Duration,
    servers: usize,
    patience: Duration,
    arrivals: Arrivals,
    seed: u64,
) -> f64 {
    let (service, patience) = (service.as_secs_f64(), patience.as_secs_f64());
    let mut rng = Rng::new(seed ^ 0x5EED);
    // FIFO: each arrival starts on the earliest-free slot, if that is soon enough.
    let mut free_at = std::collections::BinaryHeap::from(vec![std::cmp::Reverse(0u64); servers]);
    let to_ns = |secs: f64| (secs * 1e9) as u64;
    let (mut now, mut shed, arrivals_count) = (0.0, 0usize, 200_000);
    for _ in 0..arrivals_count {
        now += arrivals.gap(&mut rng, rate);
        let earliest = free_at.peek().map_or(0, |r| r.0);
        let start = to_ns(now).max(earliest);
        if start - to_ns(now) <= to_ns(patience) {
            free_at.pop();
            free_at.push(std::cmp::Reverse(start + to_ns(service)));
        } else {
            shed += 1;
        }
    }
    shed as f64 / arrivals_count as f64
}

/// The process's peak resident memory since the last reset, in MiB (Linux).
pub(crate) fn peak_memory_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Starts a new peak-memory window (Linux: `clear_refs` with 5 resets VmHWM).
pub(crate) fn reset_peak_memory() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erlang_b_matches_known_values() {
        assert!((erlang_b(1.0, 1) - 0.5).abs() < 1e-12);
        assert!((erlang_b(8.0, 8) - 0.2356).abs() < 1e-3);
    }
}
