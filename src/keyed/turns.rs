//! Turns at the ceiling: the keys whose callers wait for a ceiling slot are
//! served in turns, weighted, as start-time fair queuing does it.
//!
//! Each caller in line is given a *tag*: its key's last tag plus the cost
//! of a call at the key's weight (64 units at weight 1, 1 at weight 64), or
//! the *virtual time* (the tag of the last caller served), whichever is
//! later. The line serves the lowest tag first. So a key with a thousand
//! callers waiting and a key with one alternate; a key of weight 2 gets two
//! turns to one; and a key that arrives late starts at the virtual time,
//! neither ahead of the keys that waited (as a tag of 0 would put it) nor
//! behind the backlog of a busy key (as a count of its own callers put it,
//! which let a key that kept one caller waiting starve another's later
//! callers).
//!
//! The ceiling's line takes `i32` priorities: a tag is given as its
//! distance from a base, moved up to the virtual time whenever nobody is in
//! line, so it grows only while the line is never empty (by 64 a turn: a
//! backlog of more than 30 million turns without a break saturates it, and
//! the callers past that are served first come, first served).

use crate::sync::{lock, Mutex};
use std::sync::atomic::{AtomicU64, Ordering};

/// What a call costs its key's turn at weight 1; at weight `w`, `COST / w`.
const COST: u64 = 64;

/// The heaviest weight: a call costs one unit.
pub(crate) const MAX_WEIGHT: u64 = COST;

/// The cost of a call of a key of `weight` (held to 1 ..= 64).
pub(crate) fn cost_at(weight: u64) -> u64 {
    COST / weight.clamp(1, MAX_WEIGHT)
}

#[derive(Debug, Default)]
pub(crate) struct Turns {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The tag of the last caller served (the virtual time).
    served: u64,
    /// What a priority is measured from.
    base: u64,
    /// Callers holding a priority: in the ceiling's line, or about to be.
    in_line: usize,
}

/// A caller's place in turn: its priority in the ceiling's line, and its
/// tag.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Turn {
    pub(crate) priority: i32,
    tag: u64,
}

impl Turns {
    /// A turn for the next caller of a key whose last caller's tag ended at
    /// `next_tag`, and whose calls cost `cost`; `first` puts it ahead of
    /// every turn by tag (a key below its guaranteed share).
    pub(crate) fn enter(&self, next_tag: &AtomicU64, cost: u64, first: bool) -> Turn {
        let mut state = lock(&self.state);
        if state.in_line == 0 {
            // Nobody holds a priority measured from the old base.
            state.base = state.served;
        }
        state.in_line += 1;
        // Relaxed: written only under the lock.
        let tag = next_tag.load(Ordering::Relaxed).max(state.served);
        next_tag.store(tag.saturating_add(cost), Ordering::Relaxed);
        let priority = if first {
            i32::MIN
        } else {
            i32::try_from(tag - state.base).unwrap_or(i32::MAX)
        };
        Turn { priority, tag }
    }

    /// `turn`'s caller left the line: `served`, or gone (shed, or dropped).
    pub(crate) fn leave(&self, turn: Turn, served: bool) {
        let mut state = lock(&self.state);
        state.in_line -= 1;
        if served {
            state.served = state.served.max(turn.tag);
        }
    }
}

#[cfg(all(test, not(tower_inflight_loom)))]
mod tests {
    use super::*;

    /// Serves the lowest priority of the callers given, `rounds` times, each
    /// key sending a new caller whenever one of its own is served.
    fn serve(weights: &[u64], backlog: usize, rounds: usize) -> Vec<usize> {
        let turns = Turns::default();
        let next_tags: Vec<AtomicU64> = weights.iter().map(|_| AtomicU64::new(0)).collect();
        let mut line: Vec<(usize, Turn)> = Vec::new();
        for (key, &weight) in weights.iter().enumerate() {
            for _ in 0..backlog {
                line.push((key, turns.enter(&next_tags[key], cost_at(weight), false)));
            }
        }
        let mut served = Vec::new();
        for _ in 0..rounds {
            let next = (0..line.len())
                .min_by_key(|&at| (line[at].1.priority, at))
                .unwrap();
            let (key, turn) = line.remove(next);
            turns.leave(turn, true);
            served.push(key);
            let weight = weights[key];
            line.push((key, turns.enter(&next_tags[key], cost_at(weight), false)));
        }
        served
    }

    #[test]
    fn keys_alternate_whatever_their_backlog() {
        let served = serve(&[1, 1], 5, 20);
        for pair in served.chunks(2) {
            assert_ne!(pair[0], pair[1], "{served:?}");
        }
    }

    #[test]
    fn a_key_of_weight_two_gets_two_turns_to_one() {
        let served = serve(&[2, 1], 8, 30);
        let heavy = served.iter().filter(|&&key| key == 0).count();
        assert_eq!(heavy, 20, "{served:?}");
    }

    #[test]
    fn a_late_key_starts_at_the_virtual_time() {
        let turns = Turns::default();
        let (busy, late) = (AtomicU64::new(0), AtomicU64::new(0));
        let backlog: Vec<Turn> = (0..10)
            .map(|_| turns.enter(&busy, cost_at(1), false))
            .collect();
        for turn in &backlog[..5] {
            turns.leave(*turn, true);
        }
        // Five of the busy key's callers served: a new key goes next, not
        // after the busy key's whole backlog, nor ahead of the one served.
        let newcomer = turns.enter(&late, cost_at(1), false);
        assert!(newcomer.priority < backlog[5].priority);
        assert!(newcomer.priority >= backlog[4].priority);
    }
}
