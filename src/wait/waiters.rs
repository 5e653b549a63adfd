//! The queue of callers parked for a slot.
//!
//! It is touched only when the bulkhead is full: the fast path reads one
//! word (the count of parked callers, and whether the bulkhead is closed),
//! and nothing else, to learn that it may go ahead. Parked
//! callers are served oldest first, and a freed slot goes straight to the head
//! of the line (the releaser claims it on the head's behalf), so a new arrival
//! can never take it first.
//!
//! A caller that gives up leaves the line where it stands (its node knows
//! its place), so the line never holds more than the callers waiting.
//!
//! Wakers are collected while the line is locked and woken once it is
//! unlocked, as tokio's semaphore does: a task woken under the lock may run
//! at once on another thread and go straight for the lock.

use crate::bulkhead::Clock;
use crate::error::ShedReason;
use crate::slots::{Claim, SlotTable};
use crate::sync::{lock, loom_seqcst_fence, Arc, AtomicU64, Mutex, Ordering};
use crate::ticket::Ticket;
use crate::wait::{Line, MovablePlace, Place, QueueOrder};
use std::task::{Context, Poll, Waker};

/// The word the fast path reads: how many callers are parked (low 32 bits),
/// and whether the bulkhead is closed (the top bit). Every arrival takes
/// the slow path while either is set, and is refused once the bulkhead is
/// closed.
const PARKED: u64 = (1 << 32) - 1;
const CLOSED: u64 = 1 << 63;

#[derive(Debug, Default)]
pub(crate) struct Waiters {
    /// How many nodes in `queue` are `Parked`, and `CLOSED` (see
    /// `PARKED`). Written only under the lock.
    parked: AtomicU64,
    queue: Mutex<Line<Arc<Node>>>,
}

/// One parked caller, shared between the queue and the caller's future.
#[derive(Debug)]
pub(crate) struct Node {
    state: Mutex<NodeState>,
    /// How many slots the caller takes.
    weight: usize,
    priority: i32,
    /// Where it stands in the line, set once it is in. Read and written
    /// only under the line's lock.
    place: Mutex<Option<Place>>,
}

/// Wakers of callers whose wait was ended under the line's lock, woken when
/// this is dropped. Declare it before the lock's guard, so that it drops
/// after it. Eight inline, more on the heap: a dispatch rarely serves more.
#[derive(Default)]
struct WakeList {
    inline: [Option<Waker>; 8],
    spilled: Vec<Waker>,
}

impl WakeList {
    fn push(&mut self, waker: Waker) {
        match self.inline.iter_mut().find(|slot| slot.is_none()) {
            Some(slot) => *slot = Some(waker),
            None => self.spilled.push(waker),
        }
    }
}

impl Drop for WakeList {
    fn drop(&mut self) {
        for waker in self.inline.iter_mut().filter_map(Option::take) {
            waker.wake();
        }
        for waker in self.spilled.drain(..) {
            waker.wake();
        }
    }
}

#[derive(Debug)]
enum NodeState {
    Parked(Option<Waker>),
    /// A slot was claimed for this caller and is its to take.
    Granted(Claim),
    /// Turned away while parked: the bulkhead was closed, or its waiters
    /// cancelled.
    Refused(ShedReason),
    /// Taken, expired or cancelled.
    Done,
}

/// What a caller that leaves the line had come to.
#[derive(Debug)]
pub(crate) enum Left {
    /// A slot had been handed to it: it is the caller's to use or give back.
    Granted(Claim),
    /// It had been turned away (closed, cancelled) for this reason.
    Refused(ShedReason),
    /// Nothing: it was still waiting, and has left the line now.
    Waiting,
}

/// What a caller that may wait gets on arrival.
#[derive(Debug)]
pub(crate) enum Arrival {
    Admitted(Claim),
    Parked(Arc<Node>),
    QueueFull,
    Closed,
}

impl Node {
    fn is_parked(&self) -> bool {
        matches!(*lock(&self.state), NodeState::Parked(_))
    }

    /// Whether a slot was handed to this caller and not yet taken.
    #[cfg(all(test, tower_inflight_loom))]
    pub(crate) fn is_granted(&self) -> bool {
        matches!(*lock(&self.state), NodeState::Granted(_))
    }
}

impl Waiters {
    pub(crate) fn new() -> Self {
        Self {
            parked: AtomicU64::new(0),
            queue: Mutex::new(Line::default()),
        }
    }

    /// Callers parked now. `Relaxed`: the fast path only needs a hint, since a
    /// caller that misses a parked neighbour arrived, in effect, before it.
    #[inline]
    pub(crate) fn parked(&self) -> usize {
        (self.parked.load(Ordering::Relaxed) & PARKED) as usize
    }

    /// Nobody parked, and not closed: the fast path may go ahead.
    /// `Relaxed`: a hint, since a caller that misses a neighbour parking
    /// arrived, in effect, before it.
    #[inline(always)]
    pub(crate) fn calm(&self) -> bool {
        self.parked.load(Ordering::Relaxed) & (PARKED | CLOSED) == 0
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.parked.load(Ordering::SeqCst) & CLOSED != 0
    }

    /// Callers parked, read `SeqCst`: the releaser's side of the
    /// store-buffering pattern (its slot freed, then this read).
    #[inline]
    fn count(&self) -> usize {
        (self.parked.load(Ordering::SeqCst) & PARKED) as usize
    }

    /// One parked caller fewer. Never below zero: a borrow would run into
    /// `CLOSED`, and close the bulkhead.
    fn count_out(&self) {
        let _ = self
            .parked
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |word| {
                debug_assert!(word & PARKED != 0, "a parked count below zero");
                Some(if word & PARKED == 0 { word } else { word - 1 })
            });
    }

    /// Claims `weight` slots for a caller, under the line's lock. `SeqCst`:
    /// the waiting side of the store-buffering pattern with a releaser.
    fn claim(&self, slots: &SlotTable, now: u64, weight: usize) -> Option<Claim> {
        slots.try_claim_weighted(now, weight, Ordering::SeqCst)
    }

    /// How many callers of each priority are parked now.
    pub(crate) fn depths(&self) -> std::collections::BTreeMap<i32, usize> {
        lock(&self.queue).depths().clone()
    }

    /// How many callers of `priority` are parked now.
    #[cfg(feature = "metrics")]
    pub(crate) fn depth(&self, priority: i32) -> usize {
        lock(&self.queue)
            .depths()
            .get(&priority)
            .copied()
            .unwrap_or(0)
    }

    /// Refuses every arrival from now on, and every caller parked now.
    pub(crate) fn close(&self) {
        let mut woken = WakeList::default();
        let mut queue = lock(&self.queue);
        self.parked.fetch_or(CLOSED, Ordering::SeqCst);
        self.refuse_parked(&mut queue, ShedReason::Closed, &mut woken);
    }

    /// Refuses every caller parked now.
    pub(crate) fn cancel(&self) {
        let mut woken = WakeList::default();
        let mut queue = lock(&self.queue);
        self.refuse_parked(&mut queue, ShedReason::Cancelled, &mut woken);
    }

    fn refuse_parked(&self, queue: &mut Line<Arc<Node>>, reason: ShedReason, woken: &mut WakeList) {
        let nodes: Vec<_> = queue.drain().collect();
        for node in nodes {
            self.resolve(queue, &node, NodeState::Refused(reason), woken);
        }
    }

    /// Ends the wait of the caller behind `node` (out of the line already)
    /// with `outcome`, its waker to be woken once the line is unlocked;
    /// `false` if it was no longer parked (it gave up meanwhile).
    fn resolve(
        &self,
        queue: &mut Line<Arc<Node>>,
        node: &Node,
        outcome: NodeState,
        woken: &mut WakeList,
    ) -> bool {
        let mut state = lock(&node.state);
        let NodeState::Parked(waker) = &mut *state else {
            return false;
        };
        let waker = waker.take();
        *state = outcome;
        *lock(&node.place) = None;
        queue.left(node.priority);
        self.count_out();
        drop(state);
        if let Some(waker) = waker {
            woken.push(waker);
        }
        true
    }

    /// Called after a slot is freed: hands free slots to parked callers. The
    /// `SeqCst` load pairs with the `SeqCst` release in the slot table (see
    /// the slot table's "Memory ordering").
    #[inline(always)]
    pub(crate) fn after_release(&self, slots: &SlotTable, clock: &Clock) {
        loom_seqcst_fence();
        if self.count() > 0 {
            self.dispatch_after_release(slots, clock);
        }
    }

    #[cold]
    fn dispatch_after_release(&self, slots: &SlotTable, clock: &Clock) {
        let mut woken = WakeList::default();
        let mut queue = lock(&self.queue);
        self.dispatch(&mut queue, slots, clock.now(), &mut woken);
    }

    /// A caller that may not wait, arriving while others are parked: it gets a
    /// slot only if one is still free once every parked caller has been served.
    pub(crate) fn claim_behind_parked(
        &self,
        slots: &SlotTable,
        clock: &Clock,
        weight: usize,
    ) -> Option<Claim> {
        let mut woken = WakeList::default();
        let mut queue = lock(&self.queue);
        // Read once the line is ours: a claim dated before a wait for the
        // lock could be reclaimed that much before `reclaim_after`.
        let now = clock.now();
        self.dispatch(&mut queue, slots, now, &mut woken);
        if self.parked.load(Ordering::SeqCst) & (PARKED | CLOSED) == 0 {
            // Nobody parked, and not closed.
            self.claim(slots, now, weight)
        } else {
            None
        }
    }

    /// A caller that may wait: admitted if nobody is parked and a slot is
    /// free, otherwise parked in the line where `order` (the bulkhead's,
    /// always the same) puts its `ticket` (unless `max_parked` callers
    /// already are).
    pub(crate) fn arrive(
        &self,
        slots: &SlotTable,
        clock: &Clock,
        max_parked: Option<usize>,
        order: &QueueOrder,
        ticket: Ticket,
        movable: Option<&MovablePlace>,
    ) -> Arrival {
        let (priority, weight) = (ticket.get_priority(), ticket.get_weight());
        let mut woken = WakeList::default();
        let mut queue = lock(&self.queue);
        // Read once the line is ours (see `claim_behind_parked`).
        let now = clock.now();
        if self.is_closed() {
            return Arrival::Closed;
        }
        self.dispatch(&mut queue, slots, now, &mut woken);
        let parked = self.count();
        if parked == 0 {
            if let Some(claim) = self.claim(slots, now, weight) {
                return Arrival::Admitted(claim);
            }
        }
        if max_parked.is_some_and(|max| parked >= max) {
            return Arrival::QueueFull;
        }
        let node = Arc::new(Node {
            state: Mutex::new(NodeState::Parked(None)),
            weight,
            priority,
            place: Mutex::new(None),
        });
        // A movable place is read, and the node noted beside it, under the
        // line's lock: a move comes before or after, never between.
        let ticket = match movable {
            Some(movable) => ticket.place_in_line(movable.arrive(node.clone())),
            None => ticket,
        };
        let place = queue.push_ticket(order, ticket, node.clone());
        *lock(&node.place) = Some(place);
        // `SeqCst`: the arrival's side of the store-buffering pattern with a
        // releaser (see `after_release`): counted in, then the slots read.
        self.parked.fetch_add(1, Ordering::SeqCst);
        loom_seqcst_fence();
        // A slot freed after the scan above, by a releaser that read
        // `parked` before the increment, is found here.
        self.dispatch(&mut queue, slots, now, &mut woken);
        Arrival::Parked(node)
    }

    /// Hands free slots to parked callers in the line's order, until either
    /// runs out. The head of the line is never bypassed: if it needs more
    /// slots than are free, nobody behind it is served, and freed slots
    /// stay free for it (the fast path is closed while anyone is parked).
    fn dispatch(
        &self,
        queue: &mut Line<Arc<Node>>,
        slots: &SlotTable,
        now: u64,
        woken: &mut WakeList,
    ) {
        while self.count() > 0 {
            let Some((place, head)) = queue.peek_next(self.count()) else {
                // `parked` and the queue disagree; never strand a caller's count.
                self.parked.fetch_and(!PARKED, Ordering::SeqCst);
                break;
            };
            if !head.is_parked() {
                // Cannot happen: a caller leaves the line as its wait ends.
                queue.take(place);
                continue;
            }
            let weight = head.weight;
            if weight > slots.limit() {
                // The limit in force moved below it while it waited (an
                // adaptive limit): it would hold up the line for good.
                let head = queue.take(place);
                self.resolve(
                    queue,
                    &head,
                    NodeState::Refused(ShedReason::LimitReached),
                    woken,
                );
                continue;
            }
            let Some(claim) = self.claim(slots, now, weight) else {
                break;
            };
            // The very entry seen, even if a custom order would now pick another.
            let head = queue.take(place);
            if !self.resolve(queue, &head, NodeState::Granted(claim), woken) {
                // Cannot happen while the queue is locked; never strand the slot.
                slots.release(&claim);
            }
        }
        if self.count() == 0 {
            queue.clear();
        }
    }

    /// Moves the caller of `movable` to `place` in the line (an order by
    /// priority), if it is still waiting there; if it has not come to the
    /// line yet, it will go to `place` when it does.
    pub(crate) fn move_in_line(&self, movable: &MovablePlace, place: i64) {
        let mut queue = lock(&self.queue);
        movable.move_to(place, |node| {
            // A node served or gone keeps a stale place: never put back.
            if node.is_parked() {
                let mut at = lock(&node.place);
                if let Some(from) = *at {
                    *at = Some(queue.move_to(from, place));
                }
            }
        });
    }

    /// The caller behind `node` checks for its slot, leaving its waker to be
    /// woken by if none has come yet.
    pub(crate) fn poll_granted(
        &self,
        node: &Node,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Claim, ShedReason>> {
        let mut state = lock(&node.state);
        match &mut *state {
            NodeState::Granted(claim) => {
                let claim = *claim;
                *state = NodeState::Done;
                Poll::Ready(Ok(claim))
            }
            NodeState::Refused(reason) => {
                let reason = *reason;
                *state = NodeState::Done;
                Poll::Ready(Err(reason))
            }
            NodeState::Parked(waker) => {
                match waker {
                    Some(waker) if waker.will_wake(cx.waker()) => {}
                    _ => *waker = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
            NodeState::Done => Poll::Pending,
        }
    }

    /// The caller behind `node` leaves the line (its budget ran out, or it was
    /// dropped). Returns the slot it was granted meanwhile, if any; the caller
    /// decides whether to use it or to release it for the next in line.
    /// `last_chance`: first hand out slots that came free without a release
    /// (reclaimed ones), so that nobody gives up beside a free slot.
    pub(crate) fn leave(
        &self,
        node: &Node,
        slots: &SlotTable,
        clock: &Clock,
        last_chance: bool,
    ) -> Left {
        let mut woken = WakeList::default();
        let mut queue = lock(&self.queue);
        // Read once the line is ours (see `claim_behind_parked`).
        let now = clock.now();
        if last_chance {
            self.dispatch(&mut queue, slots, now, &mut woken);
        }
        let mut state = lock(&node.state);
        match std::mem::replace(&mut *state, NodeState::Done) {
            NodeState::Granted(claim) => Left::Granted(claim),
            NodeState::Parked(_) => {
                drop(state);
                if let Some(place) = lock(&node.place).take() {
                    queue.remove(place);
                }
                queue.left(node.priority);
                self.count_out();
                // If it was the head, waiting for more slots than were
                // free, the caller behind it may fit in those slots now.
                self.dispatch(&mut queue, slots, now, &mut woken);
                Left::Waiting
            }
            NodeState::Refused(reason) => Left::Refused(reason),
            // Its outcome was taken already: nothing is left.
            NodeState::Done => Left::Waiting,
        }
    }

    /// How many entries the line holds, callers waiting or not.
    #[cfg(all(test, not(tower_inflight_loom)))]
    pub(crate) fn line_len(&self) -> usize {
        lock(&self.queue).len()
    }
}

#[cfg(all(test, not(tower_inflight_loom)))]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::sync::atomic::AtomicBool;
    use std::task::Wake;

    const HOLD: u64 = 100;

    /// A clock standing still, for arrivals and departures.
    fn clock() -> Clock {
        Clock::Manual(crate::ManualClock::new())
    }

    fn parked(arrival: Arrival) -> Arc<Node> {
        match arrival {
            Arrival::Parked(node) => node,
            other => panic!("not parked: {other:?}"),
        }
    }

    #[test]
    fn callers_that_leave_from_the_middle_of_the_line_leave_nothing_behind() {
        for order in [
            QueueOrder::PriorityFifo,
            QueueOrder::PriorityLifo,
            QueueOrder::Fifo,
            QueueOrder::Lifo,
            QueueOrder::AdaptiveLifo { after: 2 },
            QueueOrder::custom(|a, b| a.priority().cmp(&b.priority())),
        ] {
            let slots = SlotTable::new(1, 1, HOLD, None);
            let _held = slots.try_claim(1, Ordering::Relaxed).unwrap();
            let waiters = Waiters::new();
            // Steady overload with three priorities: ten wait, and each new
            // arrival makes the one in the middle of the line give up.
            let mut waiting = VecDeque::new();
            for round in 0..1_000 {
                let priority = round % 3;
                waiting.push_back(parked(waiters.arrive(
                    &slots,
                    &clock(),
                    None,
                    &order,
                    Ticket::new().priority(priority),
                    None,
                )));
                if waiting.len() > 10 {
                    let quitter = waiting.remove(waiting.len() / 2).unwrap();
                    assert!(matches!(
                        waiters.leave(&quitter, &slots, &clock(), false),
                        Left::Waiting
                    ));
                }
            }
            assert_eq!(waiters.parked(), 10, "{order:?}");
            assert_eq!(waiters.line_len(), 10, "{order:?}");
            assert_eq!(waiters.depths().values().sum::<usize>(), 10, "{order:?}");
        }
    }

    /// Records whether the line was unlocked when it was woken.
    struct CheckUnlocked {
        waiters: Arc<Waiters>,
        unlocked: AtomicBool,
        woken: AtomicBool,
    }

    impl Wake for CheckUnlocked {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }

        fn wake_by_ref(self: &Arc<Self>) {
            let unlocked = self.waiters.queue.try_lock().is_ok();
            self.unlocked.store(unlocked, Ordering::SeqCst);
            self.woken.store(true, Ordering::SeqCst);
        }
    }

    fn park_with_checker(waiters: &Arc<Waiters>, slots: &SlotTable) -> Arc<CheckUnlocked> {
        let node = parked(waiters.arrive(
            slots,
            &clock(),
            None,
            &QueueOrder::Fifo,
            Ticket::new(),
            None,
        ));
        let checker = Arc::new(CheckUnlocked {
            waiters: waiters.clone(),
            unlocked: AtomicBool::new(false),
            woken: AtomicBool::new(false),
        });
        let waker = Waker::from(checker.clone());
        let mut cx = Context::from_waker(&waker);
        assert!(waiters.poll_granted(&node, &mut cx).is_pending());
        checker
    }

    #[test]
    fn wakers_run_after_the_line_is_unlocked() {
        let slots = SlotTable::new(1, 1, HOLD, None);
        let waiters = Arc::new(Waiters::default());
        let held = slots.try_claim(1, Ordering::Relaxed).unwrap();

        let granted = park_with_checker(&waiters, &slots);
        slots.release(&held);
        waiters.after_release(&slots, &Clock::Manual(crate::ManualClock::new()));

        let _held = slots.try_claim(1, Ordering::Relaxed);
        let cancelled = park_with_checker(&waiters, &slots);
        waiters.cancel();
        let closed = park_with_checker(&waiters, &slots);
        waiters.close();

        for (what, checker) in [
            ("granted", granted),
            ("cancelled", cancelled),
            ("closed", closed),
        ] {
            assert!(checker.woken.load(Ordering::SeqCst), "{what}: not woken");
            assert!(
                checker.unlocked.load(Ordering::SeqCst),
                "{what}: woken under the lock"
            );
        }
    }
}
