//! Loom models of the slot table and the waiter queue: every interleaving of
//! two or three threads, with an injected clock so that expiry is part of the
//! model. Run with:
//!
//! ```text
//! RUSTFLAGS="--cfg tower_inflight_loom" LOOM_MAX_PREEMPTIONS=3 cargo test --release --lib loom
//! ```

use crate::bulkhead::{Clock, ManualClock};
use crate::slots::SlotTable;
use crate::sync::{Arc, AtomicUsize, Ordering};
use crate::wait::{Arrival, MovablePlace, QueueOrder, Waiters};
use loom::thread;

const HOLD: u64 = 10;

/// Claims a slot, counts itself in while it holds it, and checks that no
/// more than `limit` ever hold one at once.
/// A clock that stands still: the models race threads, not time.
fn still() -> Clock {
    Clock::Manual(ManualClock::new())
}

fn hold_once(table: &SlotTable, holders: &AtomicUsize, limit: usize) -> bool {
    let Some(claim) = table.try_claim(1, Ordering::Relaxed) else {
        return false;
    };
    let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
    assert!(now <= limit, "{now} holders of {limit} slots");
    holders.fetch_sub(1, Ordering::SeqCst);
    assert!(
        table.release(&claim) == 1,
        "a release found its slot taken by another"
    );
    true
}

#[test]
fn loom_two_claimers_never_share_one_slot() {
    loom::model(|| {
        let table = Arc::new(SlotTable::new(1, 1, HOLD, None));
        let holders = Arc::new(AtomicUsize::new(0));
        let other = {
            let (table, holders) = (table.clone(), holders.clone());
            thread::spawn(move || hold_once(&table, &holders, 1))
        };
        hold_once(&table, &holders, 1);
        other.join().unwrap();
        assert_eq!(table.held(1), 0, "every slot is free at the end");
    });
}

#[test]
fn loom_three_claimers_on_two_slots() {
    loom::model(|| {
        let table = Arc::new(SlotTable::new(2, 1, HOLD, None));
        let holders = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let (table, holders) = (table.clone(), holders.clone());
                thread::spawn(move || hold_once(&table, &holders, 2))
            })
            .collect();
        // Two slots, three claimers at most two of which hold at once: the
        // third may fail only while both others hold.
        hold_once(&table, &holders, 2);
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(table.held(1), 0);
    });
}

#[test]
fn loom_late_release_never_frees_the_reclaimer_slot() {
    loom::model(|| {
        let table = Arc::new(SlotTable::new(1, 1, HOLD, Some(1000)));
        let old = table.try_claim(1, Ordering::Relaxed).unwrap();
        assert!(table.reserve_bytes(&old, 600));
        // The old holder is late: its deadline (1 + HOLD) has passed.
        let expired = 1 + HOLD;
        let reclaimer = {
            let table = table.clone();
            thread::spawn(move || {
                let claim = table.try_claim(expired, Ordering::Relaxed);
                if let Some(claim) = &claim {
                    assert!(table.reserve_bytes(claim, 300));
                }
                claim
            })
        };
        // The late holder gives back its bytes (if still recorded), then its slot.
        let late_bytes = table.unrecord_bytes(&old, 600);
        let late_slot = table.release(&old) > 0;
        let claim = reclaimer.join().unwrap();
        match claim {
            Some(claim) => {
                // Either the late holder released first (and the slot was
                // free, not reclaimed), or the slot was reclaimed and the late
                // release did nothing.
                assert_eq!(
                    claim.reclaimed(),
                    !late_slot,
                    "the late release freed the reclaimer's slot"
                );
                assert_eq!(table.held(expired), 1, "the reclaimer still holds its slot");
                // The 600 bytes came back exactly once: by the reclaimer, or by
                // the late holder before the reclaim.
                let reserved = table.bytes_reserved();
                let expected = if late_bytes { 300 + 600 } else { 300 };
                assert_eq!(reserved, expected);
                assert_eq!(table.release(&claim), 1);
            }
            None => assert!(
                late_slot,
                "nobody else took the slot, so its release must work"
            ),
        }
    });
}

/// A caller short of bytes sweeps up an expired holder's bytes while
/// another caller claims that holder's slot and reserves bytes of its own:
/// the leaked bytes come back exactly once, and the new holder's record is
/// never taken in their place.
#[test]
fn loom_a_byte_sweep_never_takes_the_next_holder_s_record() {
    loom::model(|| {
        let table = Arc::new(SlotTable::new(1, 1, HOLD, Some(1000)));
        let leaked = table.try_claim(1, Ordering::Relaxed).unwrap();
        assert!(table.reserve_bytes(&leaked, 600));
        let expired = 1 + HOLD;
        let sweeper = {
            let table = table.clone();
            thread::spawn(move || table.reclaim_expired(expired))
        };
        let claim = table.try_claim(expired, Ordering::Relaxed).unwrap();
        let reserved = table.reserve_bytes(&claim, 600);
        sweeper.join().unwrap();
        // Whoever gave the leaked bytes back, they came back once, and the
        // new holder's bytes (if the budget had room for them) are its own.
        assert_eq!(table.reclaim_expired(expired), 0);
        let expected = if reserved { 600 } else { 0 };
        assert_eq!(table.bytes_reserved(), expected);
        if reserved {
            assert!(table.unrecord_bytes(&claim, 600), "its record was taken");
        }
        assert_eq!(table.release(&claim), 1);
    });
}

/// A holder records its bytes while a reset frees its slot and a new
/// holder takes the slot and records bytes of its own: the first holder's
/// bytes come back exactly once (by the reset, by the new holder finding
/// them on its record, or by the first holder itself), and the new
/// holder's are counted.
#[test]
fn loom_bytes_recorded_racing_a_reset_come_back_once() {
    loom::model(|| {
        let table = Arc::new(SlotTable::new(1, 1, HOLD, Some(1000)));
        let first = table.try_claim(1, Ordering::Relaxed).unwrap();
        let resetter = {
            let table = table.clone();
            thread::spawn(move || {
                table.reset(1);
                let next = table.try_claim(1, Ordering::Relaxed).unwrap();
                let recorded = table.reserve_bytes(&next, 300);
                (next, recorded)
            })
        };
        table.reserve_bytes(&first, 600);
        let (next, recorded) = resetter.join().unwrap();
        assert!(recorded, "the budget has room for both");
        assert_eq!(table.bytes_reserved(), 300, "only the new holder's bytes");
        assert!(
            !table.unrecord_bytes(&first, 600),
            "the first holder's are gone"
        );
        assert!(table.unrecord_bytes(&next, 300));
        assert_eq!((table.release(&first), table.release(&next)), (0, 1));
    });
}

#[test]
fn loom_reset_in_the_same_tick_keeps_the_new_holder() {
    loom::model(|| {
        let table = Arc::new(SlotTable::new(1, 1, HOLD, None));
        let old = table.try_claim(1, Ordering::Relaxed).unwrap();
        let resetter = {
            let table = table.clone();
            thread::spawn(move || {
                table.reset(1);
                table.try_claim(1, Ordering::Relaxed)
            })
        };
        let late = table.release(&old) > 0;
        if let Some(new) = resetter.join().unwrap() {
            assert_eq!(
                table.held(1),
                1,
                "the old permit freed the new holder's slot"
            );
            assert_eq!(table.release(&new), 1);
            let _ = late;
        }
        assert_eq!(table.held(1), 0);
    });
}

/// One thread releases the one held slot of a table of `limit` while a
/// waiter for `weight` slots arrives: whichever goes first, the waiter ends
/// up with its slots, never parked beside them.
fn waiter_meets_a_release(limit: usize, weight: usize) {
    loom::model(move || {
        let table = Arc::new(SlotTable::new(limit, 1, HOLD, None));
        let waiters = Arc::new(Waiters::default());
        let held = table.try_claim(1, Ordering::Relaxed).unwrap();
        let releaser = {
            let (table, waiters) = (table.clone(), waiters.clone());
            thread::spawn(move || {
                table.release(&held);
                waiters.after_release(&table, &Clock::Manual(ManualClock::new()));
            })
        };
        let arrival = waiters.arrive(
            &table,
            &still(),
            None,
            &QueueOrder::Fifo,
            crate::Ticket::new().weight(weight),
            None,
        );
        releaser.join().unwrap();
        let got_slots = match &arrival {
            Arrival::Admitted(_) => true,
            Arrival::Parked(node) => node.is_granted(),
            Arrival::QueueFull | Arrival::Closed => false,
        };
        assert!(got_slots, "the waiter parked although its slots came free");
        assert_eq!(waiters.parked(), 0);
        assert_eq!(table.in_flight(), weight);
    });
}

/// A caller comes to a line ordered by priority at a place its owner moves
/// meanwhile, from behind another caller to ahead of it: whichever goes
/// first, the caller ends up at the moved place, and the slot freed next
/// goes to it. (A move that missed a caller coming to the line would leave
/// it behind.)
#[test]
fn loom_a_move_and_an_arrival_never_miss_each_other() {
    loom::model(|| {
        let table = Arc::new(SlotTable::new(1, 1, HOLD, None));
        let waiters = Arc::new(Waiters::new());
        let by_priority = QueueOrder::PriorityFifo;
        let held = table.try_claim(1, Ordering::Relaxed).unwrap();
        let Arrival::Parked(other) = waiters.arrive(
            &table,
            &still(),
            None,
            &by_priority,
            crate::Ticket::new().priority(5),
            None,
        ) else {
            panic!("the other caller parks: the only slot is held");
        };
        let movable = Arc::new(MovablePlace::new(10));
        let mover = {
            let (waiters, movable) = (waiters.clone(), movable.clone());
            thread::spawn(move || waiters.move_in_line(&movable, 1))
        };
        let arrival = waiters.arrive(
            &table,
            &still(),
            None,
            &by_priority,
            crate::Ticket::new(),
            Some(&movable),
        );
        mover.join().unwrap();
        let Arrival::Parked(moved) = arrival else {
            panic!("the moved caller parks: the only slot is held");
        };
        table.release(&held);
        waiters.after_release(&table, &Clock::Manual(ManualClock::new()));
        assert!(
            moved.is_granted(),
            "the freed slot went behind the moved caller"
        );
        assert!(!other.is_granted());
    });
}

#[test]
fn loom_a_waiter_never_parks_beside_a_freed_slot() {
    waiter_meets_a_release(1, 1);
}

/// A heavy waiter (both slots) arrives while the one held slot is released.
#[test]
fn loom_a_weighted_waiter_never_parks_beside_enough_free_slots() {
    waiter_meets_a_release(2, 2);
}

/// A weighted claim of both slots races a plain claim of one: they never
/// hold more than two slots between them, a weighted claim that loses a
/// slot to the other gives back what it took, and everything is free at
/// the end.
#[test]
fn loom_weighted_claim_is_all_or_nothing() {
    loom::model(|| {
        let table = Arc::new(SlotTable::new(2, 1, HOLD, None));
        let holders = Arc::new(AtomicUsize::new(0));
        let heavy = {
            let (table, holders) = (table.clone(), holders.clone());
            thread::spawn(move || {
                if let Some(claim) = table.try_claim_weighted(1, 2, Ordering::SeqCst) {
                    let now = holders.fetch_add(2, Ordering::SeqCst) + 2;
                    assert!(now <= 2, "{now} slots held of 2");
                    holders.fetch_sub(2, Ordering::SeqCst);
                    assert_eq!(table.release(&claim), 2, "both slots freed");
                }
            })
        };
        hold_once(&table, &holders, 2);
        heavy.join().unwrap();
        assert_eq!(table.held(1), 0, "every slot is free at the end");
    });
}

/// The fast path as `Shared::try_claim_weighted` takes it, on `table` and
/// `waiters`.
fn fast_claim(table: &SlotTable, waiters: &Waiters) -> Option<crate::slots::Claim> {
    if waiters.calm() {
        return table.try_claim(1, Ordering::Relaxed);
    }
    waiters.claim_behind_parked(table, &still(), 1)
}

/// A weighted claim of both slots races two light callers: it takes both
/// or neither, so either both light callers fit, or the weighted one got
/// both slots before them.
#[test]
fn loom_a_weighted_claim_never_sheds_a_light_caller_beside_a_free_slot() {
    loom::model(|| {
        let table = Arc::new(SlotTable::new(2, 1, HOLD, None));
        let waiters = Arc::new(Waiters::default());
        let heavy = {
            let (table, waiters) = (table.clone(), waiters.clone());
            thread::spawn(move || waiters.claim_behind_parked(&table, &still(), 2).is_some())
        };
        let first = {
            let (table, waiters) = (table.clone(), waiters.clone());
            thread::spawn(move || fast_claim(&table, &waiters).is_some())
        };
        let second = fast_claim(&table, &waiters).is_some();
        let heavy = heavy.join().unwrap();
        let first = first.join().unwrap();
        assert!(
            heavy != (first || second),
            "all or nothing: heavy {heavy}, light {first} {second}"
        );
        if !heavy {
            assert!(
                first && second,
                "a light caller was shed beside a free slot"
            );
        }
        assert_eq!(table.in_flight(), 2);
    });
}

/// A wedged holder's late release races a claim past its deadline, which
/// sweeps: the slot's count is given back once, by whichever frees the
/// entry, and the claimer's slot is never freed by the late release.
#[test]
fn loom_a_late_release_racing_a_sweep_gives_the_count_back_once() {
    loom::model(|| {
        let table = Arc::new(SlotTable::new(1, 1, HOLD, None));
        let old = table.try_claim(1, Ordering::Relaxed).unwrap();
        let expired = 1 + HOLD;
        let claimer = {
            let table = table.clone();
            thread::spawn(move || table.try_claim(expired, Ordering::Relaxed))
        };
        let late = table.release(&old);
        let claim = claimer.join().unwrap();
        match &claim {
            Some(claim) => assert_eq!(claim.reclaimed(), late == 0),
            // Only while the release was under way: its entry freed, its
            // count not yet given back.
            None => assert_eq!(late, 1, "shed beside an expired slot"),
        }
        assert_eq!(
            table.in_flight(),
            usize::from(claim.is_some()),
            "the count was given back twice, or never"
        );
        if let Some(claim) = claim {
            assert_eq!(table.release(&claim), 1);
        }
        assert_eq!(table.in_flight(), 0);
    });
}

/// The limit is lowered from 2 to 1 while one slot is held, as another
/// caller claims and the holder releases: a claim that began after the
/// limit was lowered is never admitted beside the holder, and the count
/// ends at what is held.
#[test]
fn loom_a_lowered_limit_racing_claims_and_releases_never_over_admits() {
    loom::model(|| {
        let table = Arc::new(SlotTable::new(2, 1, HOLD, None));
        let lowered = Arc::new(loom::sync::atomic::AtomicBool::new(false));
        let held = table.try_claim(1, Ordering::Relaxed).unwrap();
        let lowerer = {
            let (table, lowered) = (table.clone(), lowered.clone());
            thread::spawn(move || {
                table.set_limit(1);
                lowered.store(true, Ordering::SeqCst);
            })
        };
        let releaser = {
            let table = table.clone();
            thread::spawn(move || table.release(&held))
        };
        let after_lowering = lowered.load(Ordering::SeqCst);
        let claim = table.try_claim(1, Ordering::Relaxed);
        let released = releaser.join().unwrap() == 1;
        lowerer.join().unwrap();
        assert!(released);
        if claim.is_some() && after_lowering {
            // Admitted under a limit of 1: only once the holder released.
            assert_eq!(table.in_flight(), 1);
        }
        assert_eq!(table.in_flight(), usize::from(claim.is_some()));
    });
}

/// The limit is lowered from 2 to 1 while one slot is held and another
/// caller claims: the claim is admitted only if it came before the
/// lowering, so the lowerer, looking right after, sees it held. The model
/// fails if a claim compares the count with a limit read apart from it:
/// read before the lowering, it would be admitted after it, over 1.
#[test]
fn loom_a_claim_racing_a_lowered_limit_is_admitted_only_before_it() {
    loom::model(|| {
        let table = Arc::new(SlotTable::new(2, 1, HOLD, None));
        let _held = table.try_claim(1, Ordering::Relaxed).unwrap();
        let lowerer = {
            let table = table.clone();
            thread::spawn(move || {
                table.set_limit(1);
                table.in_flight()
            })
        };
        let claim = table.try_claim(1, Ordering::Relaxed);
        let seen_after_lowering = lowerer.join().unwrap();
        if claim.is_some() {
            assert_eq!(seen_after_lowering, 2, "admitted over a limit of 1");
        }
    });
}

/// A reset races a claim that sweeps a leaked weighted claim: whichever
/// frees its entry gives back its whole weight, once, so the count ends
/// at what the ledger holds.
#[test]
fn loom_a_reset_racing_a_sweep_gives_a_weighted_claim_back_once() {
    loom::model(|| {
        let table = Arc::new(SlotTable::new(4, 1, HOLD, None));
        let _leaked = table.try_claim_weighted(1, 3, Ordering::Relaxed).unwrap();
        let _held = table.try_claim(1, Ordering::Relaxed).unwrap();
        let expired = 1 + HOLD;
        let resetter = {
            let table = table.clone();
            thread::spawn(move || table.reset(1))
        };
        let _claim = table.try_claim(expired, Ordering::Relaxed);
        resetter.join().unwrap();
        assert_eq!(
            table.in_flight(),
            table.held(expired),
            "slots counted that nobody holds, or held uncounted"
        );
    });
}

/// Two claims past the deadlines of two leaked slots: one of them sweeps,
/// and the other waits for the sweep rather than be shed beside an expired
/// slot. Both get a slot.
#[test]
fn loom_two_claims_past_two_leaked_deadlines_both_get_a_slot() {
    loom::model(|| {
        let table = Arc::new(SlotTable::new(3, 1, HOLD, None));
        let _leaked = table.try_claim(1, Ordering::Relaxed).unwrap();
        let _also_leaked = table.try_claim(1, Ordering::Relaxed).unwrap();
        let _held = table.try_claim(5, Ordering::Relaxed).unwrap();
        assert!(!table.has_room(5, 1));
        let expired = 2 + HOLD;
        let other = {
            let table = table.clone();
            thread::spawn(move || table.try_claim(expired, Ordering::SeqCst).is_some())
        };
        let mine = table.try_claim(expired, Ordering::SeqCst).is_some();
        let theirs = other.join().unwrap();
        assert!(
            mine && theirs,
            "shed beside an expired slot: {mine} {theirs}"
        );
    });
}
