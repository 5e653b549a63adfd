//! Figures from outcomes: percentiles, the Erlang-B floor, peak memory.

use crate::load::{Outcome, Status};
use std::time::Duration;

/// The `q` quantile (0..=1) of `values`, nearest rank; zero when empty.
pub(crate) fn quantile(values: &mut [Duration], q: f64) -> Duration {
    if values.is_empty() {
        return Duration::ZERO;
    }
    values.sort_unstable();
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

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
