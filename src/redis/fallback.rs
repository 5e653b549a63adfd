//! The places under `WhenUnreachable::LocalLimit`: calls admitted without a
//! lease while Redis is away, each given back by its permit, or, if the
//! permit leaked, taken back after `reclaim_after` as its local slot is.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

pub(super) struct FallbackPlaces {
    limit: usize,
    /// How long a place may be held: the bulkhead's `reclaim_after`.
    hold: Duration,
    /// Each place held, by id, with when it is taken back. At most `limit`
    /// entries: a place is only added below it.
    places: Mutex<Vec<(u64, Instant)>>,
    next_id: AtomicU64,
}

impl FallbackPlaces {
    pub(super) fn new(limit: usize, hold: Duration) -> Self {
        Self {
            limit,
            hold,
            places: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(0),
        }
    }

    fn places(&self) -> std::sync::MutexGuard<'_, Vec<(u64, Instant)>> {
        self.places
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A place, by id, if fewer than the limit are held (those past their
    /// hold are taken back first).
    pub(super) fn take(&self) -> Option<u64> {
        let now = Instant::now();
        let mut places = self.places();
        places.retain(|&(_, until)| until > now);
        if places.len() >= self.limit {
            return None;
        }
        // Relaxed: the id only has to be unique.
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        // `validate` keeps `reclaim_after` within what an instant can hold
        // past now; fall back to a year rather than panic.
        let until = now
            .checked_add(self.hold)
            .or_else(|| now.checked_add(Duration::from_secs(365 * 86_400)))
            .unwrap_or(now);
        places.push((id, until));
        Some(id)
    }

    /// Gives place `id` back; nothing if it was taken back already (its
    /// permit leaked, or the bulkhead was reset), so a late give-back never
    /// frees another's place.
    pub(super) fn give_back(&self, id: u64) {
        self.places().retain(|&(held, _)| held != id);
    }

    /// Whether place `id` is still held (not given back, not taken back).
    pub(super) fn holds(&self, id: u64) -> bool {
        let now = Instant::now();
        self.places()
            .iter()
            .any(|&(held, until)| held == id && until > now)
    }

    pub(super) fn held(&self) -> usize {
        let now = Instant::now();
        self.places()
            .iter()
            .filter(|&&(_, until)| until > now)
            .count()
    }

    /// Forgets every place, as `Bulkhead::reset` forgets every slot.
    pub(super) fn clear(&self) {
        self.places().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_place_held_past_its_hold_is_taken_back_and_its_late_give_back_frees_nothing() {
        let places = FallbackPlaces::new(1, Duration::from_millis(100));
        let leaked = places.take().unwrap();
        assert_eq!(places.take(), None);
        tokio::time::sleep(Duration::from_millis(101)).await;
        let next = places.take().unwrap();
        places.give_back(leaked); // late: the leaked place's id, not the new one's
        assert_eq!(places.held(), 1);
        assert_eq!(places.take(), None);
        places.give_back(next);
        assert_eq!(places.held(), 0);
    }

    #[test]
    fn clear_forgets_every_place() {
        let places = FallbackPlaces::new(2, Duration::from_secs(30));
        let (a, _b) = (places.take().unwrap(), places.take().unwrap());
        places.clear();
        assert_eq!(places.held(), 0);
        places.give_back(a);
        assert!(places.take().is_some() && places.take().is_some() && places.take().is_none());
    }
}
