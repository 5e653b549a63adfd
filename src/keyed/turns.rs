//! Turns at the ceiling: the keys whose callers wait for a ceiling slot are
//! served in turns, weighted, as start-time fair queuing does it.
//!
//! Each caller in line is given a *tag*: its key's last tag plus the cost
//! of a call at the key's weight (64 units at weight 1, 64/w at weight `w`,
//! rounded so that `n` calls cost `64 n / w` to the unit), or the *virtual
//! time* (the tag of the last caller served), whichever is later. A caller
//! that leaves unserved (its wait ran out, or it was dropped) gives its
//! place to the last of its key's callers whose tags follow on from its own
//! (its *run*), if there is one, and the place that frees at the end of the
//! key's turns is given back: so callers who gave up push neither their
//! key's callers still in line nor its next caller back. (A caller that
//! took its tag from the virtual time begins a run of its own: moved ahead
//! to an earlier run's place, it would go before callers of other keys that
//! came before it.) The line serves the lowest tag first. So a key with a
//! thousand callers waiting and a key with one alternate; a key of weight 2
//! gets two turns to one; and a key that arrives late starts at the virtual
//! time,
//! neither ahead of the keys that waited (as a tag of 0 would put it) nor
//! behind the backlog of a busy key. (Ordering by each key's count of its
//! own callers in line would not do: a key that keeps one caller waiting
//! would always go before another key's later callers, and starve them.)
//!
//! A caller of a key below its guaranteed share takes no turn: it goes to
//! the head of the line, and what its key was promised costs the key none of
//! its turns at what it borrows.
//!
//! At one tag, callers of different keys go in the order they came to the
//! ceiling's line, and a caller moved keeps its own: at a tie, a caller
//! moved into the place of one that gave up may go after a caller of
//! another key that came after the one that gave up. (Keeping every
//! caller's order as if the one that gave up had never come would move each
//! caller of its run up one place, for every caller that gives up; callers
//! give up in crowds.) And a caller that gives up moves the last of its
//! run past any key-mate of the run that has left the line meanwhile (a
//! busy runtime served it out of turn, or has not yet taken up the slot
//! handed to it): the caller moved may then go ahead of a caller of another
//! key that came before it, by one turn for each such key-mate. So may a
//! caller that gives up after the virtual time passed it (a slot was handed
//! to it, not yet taken up): the last of its run, which came later, is
//! moved below the virtual time it came at.
//!
//! A caller's place in the ceiling's line is its tag, 64 bits (at 64 units
//! a turn, more turns than any line will see), past every `i32` priority
//! (so that a caller of the ceiling itself goes ahead of the turns), or the
//! head of the line for a key below its guaranteed share. Its priority, which names it in the
//! ceiling's metrics, says which of the two it is: -1 below its share, 0 in
//! turn.

use crate::bulkhead::Bulkhead;
use crate::sync::{lock, Arc, AtomicU64, Mutex, Ordering};
use crate::wait::MovablePlace;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

/// What a call costs its key's turn at weight 1; at weight `w`, `COST / w`
/// on average.
const COST: u64 = 64;

/// Where the places of callers taking turns begin in the ceiling's line:
/// past every `i32` priority.
const IN_TURN: i64 = 1 << 32;

/// The heaviest weight: a call costs one unit.
pub(crate) const MAX_WEIGHT: u64 = COST;

/// A key's weight, held to 1 ..= 64.
pub(crate) fn weight(weight: usize) -> u64 {
    (weight as u64).clamp(1, MAX_WEIGHT)
}

/// A key's place in turn: where its next caller's tag starts, and what is
/// left over of its last caller's cost, in 1/weight units (so that `n`
/// calls cost `COST n / weight` exactly).
#[derive(Debug, Default)]
pub(crate) struct KeyTurn {
    next_tag: AtomicU64,
    carry: AtomicU64,
    /// Its callers in line taking turns (not those below its share).
    /// Touched only under the turns' lock.
    in_turn: Mutex<InTurns>,
}

/// A key's callers in line taking turns, by tag (and rank, their order of
/// coming), in runs: a caller whose tag came from its key's chain (its
/// key's last tag plus its cost) goes on its key's latest run, if a caller
/// of that run is still in line; otherwise, or if its tag came from the
/// virtual time, it begins a run. The last caller of a run takes the place
/// of one of its run that leaves unserved.
#[derive(Debug, Default)]
struct InTurns {
    callers: BTreeMap<(u64, u64), Arc<InTurn>>,
    /// The tag and rank of the first caller in line of each run (the
    /// first caller of a run served, its next goes on from there).
    run_starts: BTreeSet<(u64, u64)>,
    /// Where the key's latest run began: its callers in line are those at
    /// or past it.
    latest_run: u64,
}

/// A caller's place in its key's line: its tag and rank.
type At = (u64, u64);

/// The callers of a run behind one that left it: from its tag to the next
/// run's start.
type Behind = (Bound<At>, Bound<At>);

impl InTurns {
    /// Puts `caller` in line at `at`: on its key's latest run, or beginning
    /// a run if its tag came `from_virtual_time` or no caller of that run
    /// is in line.
    fn join(&mut self, at: At, caller: Arc<InTurn>, from_virtual_time: bool) {
        let latest_run_in_line = self.callers.range((self.latest_run, 0)..).next().is_some();
        if from_virtual_time || !latest_run_in_line {
            self.run_starts.insert(at);
            self.latest_run = at.0;
        }
        self.callers.insert(at, caller);
    }

    /// Takes the caller at `at` out of line: whether it began its run, and
    /// the callers of its run behind it.
    fn take(&mut self, at: At) -> (bool, Behind) {
        self.callers.remove(&at);
        let began_run = self.run_starts.remove(&at);
        let run_end = self
            .run_starts
            .range((at.0, 0)..)
            .next()
            .map_or(Bound::Unbounded, |&(start, _)| Bound::Excluded((start, 0)));
        (began_run, (Bound::Included((at.0, 0)), run_end))
    }

    /// A run whose first caller was served goes on from its next caller
    /// still in line, if one is.
    fn go_on_from_next(&mut self, behind: Behind) {
        if let Some((&next, _)) = self.callers.range(behind).next() {
            self.run_starts.insert(next);
        }
    }

    /// Takes the last caller of a run out of line, `behind` one that left.
    fn take_last(&mut self, behind: Behind) -> Option<(At, Arc<InTurn>)> {
        let (&at, _) = self.callers.range(behind).next_back()?;
        self.callers.remove_entry(&at)
    }

    /// Puts back at tag `tag` the caller of rank `rank` moved there, the
    /// start of its run if the one whose place it took `began_run`.
    fn put_moved(&mut self, tag: u64, rank: u64, caller: Arc<InTurn>, began_run: bool) {
        if began_run {
            self.run_starts.insert((tag, rank));
        }
        self.callers.insert((tag, rank), caller);
    }
}

/// A caller taking turns, shared with its key's `in_turn`: its tag may
/// change while it waits (see [`Turns::leave`]).
#[derive(Debug)]
struct InTurn {
    /// Written only under the turns' lock.
    tag: AtomicU64,
    /// What the place at its tag cost its key, and the key's carry before
    /// it: given back if that place is the one that frees. They go with
    /// the place: a caller moved to another's place takes its figures.
    /// Written only under the turns' lock.
    cost: AtomicU64,
    carry_before: AtomicU64,
    /// Its place in the ceiling's line, moved with its tag.
    movable: Arc<MovablePlace>,
}

#[derive(Debug, Default)]
pub(crate) struct Turns {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The tag of the last caller served (the virtual time).
    served: u64,
    /// The next caller's rank among its key's callers of one tag.
    next_rank: u64,
}

/// A caller's place in turn: where it goes in the ceiling's line, and its
/// tag.
#[derive(Debug)]
pub(crate) struct Turn {
    /// Its place in the ceiling's line, lowest first when it came: [`FIRST`]
    /// for a key below its share.
    pub(crate) place: i64,
    /// A caller taking turns (not one below its key's share), and its key
    /// in its key's `in_turn`.
    in_turn: Option<(Arc<InTurn>, u64)>,
}

/// The place of a caller whose key is below its share: the head of the line.
const FIRST: i64 = i64::MIN;

impl Turn {
    /// Its priority in the ceiling's metrics: -1 below its key's share, 0
    /// in turn.
    pub(crate) fn priority(&self) -> i32 {
        -i32::from(self.place == FIRST)
    }

    /// Its place in the ceiling's line that [`Turns::leave`] may move: a
    /// caller taking turns has one; one below its key's share stays first.
    pub(crate) fn movable(&self) -> Option<Arc<MovablePlace>> {
        let (in_turn, _) = self.in_turn.as_ref()?;
        Some(in_turn.movable.clone())
    }
}

/// Where a caller of `tag` taking turns goes in the ceiling's line: past
/// every `i32` priority, so that a caller of the ceiling itself, in line by
/// its own priority, goes ahead of the keys' turns.
fn place_in_turn(tag: u64) -> i64 {
    i64::try_from(tag)
        .unwrap_or(i64::MAX)
        .saturating_add(IN_TURN)
}

impl Turns {
    /// A turn for the next caller of a key of `weight` (held to 1 ..= 64);
    /// `first` puts it ahead of every turn by tag, and takes none (a key
    /// below its guaranteed share: its promised slots are not borrowed, so
    /// they cost it no turns).
    pub(crate) fn enter(&self, key: &KeyTurn, weight: u64, first: bool) -> Turn {
        if first {
            return Turn {
                place: FIRST,
                in_turn: None,
            };
        }
        let mut state = lock(&self.state);
        // Relaxed: written only under the lock.
        let next_tag = key.next_tag.load(Ordering::Relaxed);
        let tag = next_tag.max(state.served);
        let carry_before = key.carry.load(Ordering::Relaxed);
        let owed = COST + carry_before;
        let cost = owed / weight;
        key.next_tag
            .store(tag.saturating_add(cost), Ordering::Relaxed);
        key.carry.store(owed % weight, Ordering::Relaxed);
        let place = place_in_turn(tag);
        let in_turn = Arc::new(InTurn {
            tag: AtomicU64::new(tag),
            cost: AtomicU64::new(cost),
            carry_before: AtomicU64::new(carry_before),
            movable: Arc::new(MovablePlace::new(place)),
        });
        let rank = state.next_rank;
        state.next_rank += 1;
        lock(&key.in_turn).join((tag, rank), in_turn.clone(), tag > next_tag);
        Turn {
            place,
            in_turn: Some((in_turn, rank)),
        }
    }

    /// `turn`'s caller, of `key`, left the line of `ceiling`: `served`, or
    /// gone (shed, or dropped). A caller gone leaves its place to the last
    /// caller of its run, moved there in the ceiling's line, and the place
    /// that frees, the last of the run, is given back if it was its key's
    /// last. (Not to its key's last caller: one that took its tag from the
    /// virtual time, in a later run, would go ahead of callers of other keys
    /// that came before it.)
    pub(crate) fn leave(&self, key: &KeyTurn, turn: &Turn, served: bool, ceiling: &Bulkhead) {
        let Some((caller, rank)) = &turn.in_turn else {
            return; // below its key's share: it took no turn
        };
        let mut state = lock(&self.state);
        let mut in_turns = lock(&key.in_turn);
        // Relaxed: written only under the lock.
        let tag = caller.tag.load(Ordering::Relaxed);
        let (began_run, behind) = in_turns.take((tag, *rank));
        if served {
            if began_run {
                in_turns.go_on_from_next(behind);
            }
            state.served = state.served.max(tag);
            return;
        }
        // Relaxed, all: written only under the lock.
        let figures = |of: &InTurn| {
            (
                of.cost.load(Ordering::Relaxed),
                of.carry_before.load(Ordering::Relaxed),
            )
        };
        // The place that frees, with its cost and the carry before it.
        let (mut freed, (mut freed_cost, mut carry_before)) = (tag, figures(caller));
        // Its place goes to the last caller of its run, and that one's frees.
        if let Some(((last_tag, last_rank), last)) = in_turns.take_last(behind) {
            let (cost, carry) = figures(caller);
            (freed, (freed_cost, carry_before)) = (last_tag, figures(&last));
            last.tag.store(tag, Ordering::Relaxed);
            last.cost.store(cost, Ordering::Relaxed);
            last.carry_before.store(carry, Ordering::Relaxed);
            // Under the turns' lock, then the line's: nothing takes them the
            // other way round.
            ceiling.move_in_line(&last.movable, place_in_turn(tag));
            in_turns.put_moved(tag, last_rank, last, began_run);
        }
        // If the place that freed was its key's last, the key's next caller
        // starts there (or at the virtual time, if that is later), with the
        // carry found there.
        let next_tag = key.next_tag.load(Ordering::Relaxed);
        if freed.saturating_add(freed_cost) == next_tag {
            key.carry.store(carry_before, Ordering::Relaxed);
            key.next_tag.store(freed, Ordering::Relaxed);
        }
    }
}

#[cfg(all(test, not(tower_inflight_loom)))]
mod tests {
    use super::*;
    use crate::Config;
    use std::time::Duration;

    /// A ceiling whose line is never used: these tests order turns alone.
    fn ceiling() -> Bulkhead {
        Bulkhead::new(Config::new(1, Duration::from_secs(30)))
    }

    /// Serves the lowest place of the callers in line, `rounds` times,
    /// each key keeping `backlog` callers in line.
    fn serve(weights: &[u64], backlog: usize, rounds: usize) -> Vec<usize> {
        let turns = Turns::default();
        let keys: Vec<KeyTurn> = weights.iter().map(|_| KeyTurn::default()).collect();
        let mut line: Vec<(usize, Turn)> = Vec::new();
        let enter = |line: &mut Vec<(usize, Turn)>, key: usize| {
            line.push((key, turns.enter(&keys[key], weights[key], false)));
        };
        for key in 0..weights.len() {
            for _ in 0..backlog {
                enter(&mut line, key);
            }
        }
        let mut served = Vec::new();
        for _ in 0..rounds {
            let next = (0..line.len())
                .min_by_key(|&at| (line[at].1.place, at))
                .unwrap();
            let (key, turn) = line.remove(next);
            turns.leave(&keys[key], &turn, true, &ceiling());
            served.push(key);
            enter(&mut line, key);
        }
        served
    }

    fn share(served: &[usize], key: usize) -> usize {
        served.iter().filter(|&&of| of == key).count()
    }

    #[test]
    fn keys_alternate_whatever_their_backlog() {
        let served = serve(&[1, 1], 5, 20);
        for pair in served.chunks(2) {
            assert_ne!(pair[0], pair[1], "{served:?}");
        }
    }

    #[test]
    fn turns_follow_the_weights_whatever_they_are() {
        for (heavy, light, expected) in [(2, 1, 40), (40, 20, 40), (64, 32, 40), (3, 1, 45)] {
            let served = serve(&[heavy, light], 8, 60);
            let got = share(&served, 0);
            assert!(
                got.abs_diff(expected) <= 1,
                "weights {heavy}:{light} gave {got} of 60: {served:?}"
            );
        }
        // 64 and 33 are not served alike: 64/97 of the turns.
        let served = serve(&[64, 33], 8, 97);
        assert!(share(&served, 0).abs_diff(64) <= 1, "{served:?}");
    }

    #[test]
    fn a_late_key_starts_at_the_virtual_time() {
        let turns = Turns::default();
        let (busy, late) = (KeyTurn::default(), KeyTurn::default());
        let backlog: Vec<Turn> = (0..10).map(|_| turns.enter(&busy, 1, false)).collect();
        for turn in &backlog[..5] {
            turns.leave(&busy, turn, true, &ceiling());
        }
        // Five of the busy key's callers served: a new key goes next, not
        // after the busy key's whole backlog, nor ahead of the one served.
        let newcomer = turns.enter(&late, 1, false);
        assert!(newcomer.place < backlog[5].place);
        assert!(newcomer.place >= backlog[4].place);
    }

    #[test]
    fn callers_that_left_unserved_do_not_push_their_key_back() {
        let turns = Turns::default();
        let (gave_up, other) = (KeyTurn::default(), KeyTurn::default());
        // Eight callers of one key leave unserved; another key has six in
        // line.
        let leaving: Vec<Turn> = (0..8).map(|_| turns.enter(&gave_up, 1, false)).collect();
        for turn in leaving {
            turns.leave(&gave_up, &turn, false, &ceiling());
        }
        let others: Vec<Turn> = (0..6).map(|_| turns.enter(&other, 1, false)).collect();
        let back = turns.enter(&gave_up, 1, false);
        assert!(back.place <= others[0].place, "{back:?} behind {others:?}");
    }

    /// The tag a caller taking turns has now.
    fn tag_now(turn: &Turn) -> u64 {
        let (in_turn, _) = turn.in_turn.as_ref().unwrap();
        in_turn.tag.load(Ordering::Relaxed)
    }

    #[test]
    fn a_caller_that_leaves_unserved_hands_its_place_to_its_key_s_last() {
        let (turns, ceiling) = (Turns::default(), ceiling());
        let key = KeyTurn::default();
        let callers: Vec<Turn> = (0..4).map(|_| turns.enter(&key, 1, false)).collect();
        // The second leaves: the last takes its tag, the others keep theirs.
        turns.leave(&key, &callers[1], false, &ceiling);
        let tags: Vec<u64> = [0, 2, 3].map(|at| tag_now(&callers[at])).to_vec();
        assert_eq!(tags, [0, 128, 64]);
        // The place that freed, at the end, is given back: the next caller
        // comes right behind the key's callers still in line.
        let next = turns.enter(&key, 1, false);
        assert_eq!(tag_now(&next), 192);
        // The last leaves: nobody is behind it, and its place is given back.
        turns.leave(&key, &next, false, &ceiling);
        let again = turns.enter(&key, 1, false);
        assert_eq!(tag_now(&again), 192);
        // A caller below its share takes no turn, and leaves none behind.
        let first = turns.enter(&key, 1, true);
        let behind = turns.enter(&key, 1, false);
        assert_eq!(tag_now(&behind), 256);
        turns.leave(&key, &first, false, &ceiling);
        assert_eq!(tag_now(&behind), 256);
        assert_eq!(tag_now(&turns.enter(&key, 1, false)), 320);
    }

    #[test]
    fn a_caller_that_gives_up_hands_on_along_its_key_s_chain_only() {
        let (turns, ceiling) = (Turns::default(), ceiling());
        let (key, other) = (KeyTurn::default(), KeyTurn::default());
        // Its key's chain unbroken, a caller served out of turn behind it
        // (a busy runtime): one that gives up behind the virtual time still
        // hands its place on.
        let x = turns.enter(&key, 1, false);
        let (o0, o1) = (turns.enter(&other, 1, false), turns.enter(&other, 1, false));
        let (y, z) = (turns.enter(&key, 1, false), turns.enter(&key, 1, false));
        turns.leave(&other, &o0, true, &ceiling);
        turns.leave(&other, &o1, true, &ceiling);
        turns.leave(&key, &x, false, &ceiling);
        assert_eq!((tag_now(&y), tag_now(&z)), (64, 0));
        assert_eq!(key.next_tag.load(Ordering::Relaxed), 128);
        // A caller whose key's next caller took its tag from the virtual
        // time hands nothing on: that caller would go ahead of others.
        let (turns, late) = (Turns::default(), KeyTurn::default());
        let behind = turns.enter(&late, 1, false);
        let served = turns.enter(&other, 1, false);
        turns.leave(&other, &served, true, &ceiling);
        let from_the_virtual_time = turns.enter(&late, 1, false);
        turns.leave(&late, &behind, false, &ceiling);
        assert_eq!(tag_now(&from_the_virtual_time), 128);
    }

    /// Serves callers of a key of its own until the virtual time is `to`.
    fn serve_until(turns: &Turns, to: u64) {
        let other = KeyTurn::default();
        for _ in 0..=to / COST {
            let turn = turns.enter(&other, 1, false);
            turns.leave(&other, &turn, true, &ceiling());
        }
    }

    /// A run given back whole (its one caller gave up) leaves its key's
    /// next caller, from the virtual time, a run of its own: were it taken
    /// for a part of the key's earlier run, a caller of that run who gives
    /// up would move it ahead of callers of other keys that came before it.
    #[test]
    fn a_caller_after_a_run_given_back_whole_begins_a_run() {
        let (turns, ceiling) = (Turns::default(), ceiling());
        let (key, late) = (KeyTurn::default(), KeyTurn::default());
        let x = turns.enter(&key, 1, false);
        serve_until(&turns, 192);
        let z = turns.enter(&key, 1, false);
        assert_eq!(tag_now(&z), 192, "from the virtual time");
        turns.leave(&key, &z, false, &ceiling);
        let w = turns.enter(&late, 1, false);
        let z2 = turns.enter(&key, 1, false);
        assert_eq!((tag_now(&w), tag_now(&z2)), (192, 192));
        turns.leave(&key, &x, false, &ceiling);
        assert_eq!(
            tag_now(&z2),
            192,
            "moved into the place of x, of another run"
        );
        assert!(w.place <= z2.place);
    }

    /// A run whose first caller in line was served (out of turn: a busy
    /// runtime takes up slots late) goes on from its next caller: not joined
    /// to the key's earlier run.
    #[test]
    fn a_run_whose_first_caller_was_served_goes_on_from_its_next() {
        let (turns, ceiling) = (Turns::default(), ceiling());
        let key = KeyTurn::default();
        let a = turns.enter(&key, 1, false);
        serve_until(&turns, 192);
        let (x, y) = (turns.enter(&key, 1, false), turns.enter(&key, 1, false));
        assert_eq!((tag_now(&x), tag_now(&y)), (192, 256));
        turns.leave(&key, &x, true, &ceiling);
        turns.leave(&key, &a, false, &ceiling);
        assert_eq!(
            tag_now(&y),
            256,
            "moved into the place of a, of another run"
        );
    }

    #[test]
    fn turns_keep_their_order_past_any_32_bit_count() {
        let turns = Turns::default();
        let (busy, late) = (KeyTurn::default(), KeyTurn::default());
        // A line never empty for 2^40 units: 17 billion turns of a busy key.
        let far = 1u64 << 40;
        busy.next_tag.store(far, Ordering::Relaxed);
        let first = turns.enter(&busy, 1, false);
        turns.leave(&busy, &first, true, &ceiling());
        let (busy_next, newcomer) = (turns.enter(&busy, 1, false), turns.enter(&late, 1, false));
        assert_eq!(
            newcomer.place,
            far as i64 + IN_TURN,
            "a new key starts at the virtual time"
        );
        assert!(newcomer.place < busy_next.place);
        assert!(first.place <= newcomer.place);
        let below_share = turns.enter(&late, 1, true);
        assert!(below_share.place < first.place);
        assert_eq!((below_share.priority(), newcomer.priority()), (-1, 0));
    }
}
