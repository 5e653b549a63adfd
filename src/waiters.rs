//! The queue of callers parked for a slot.
//!
//! It is touched only when the bulkhead is full: the fast path reads the
//! `parked` count, and nothing else, to learn that nobody is waiting. Parked
//! callers are served oldest first, and a freed slot goes straight to the head
//! of the line (the releaser claims it on the head's behalf), so a new arrival
//! can never take it first.
//!
//! A caller that gives up stays in the queue, marked done, until it reaches
//! the front: removing it from the middle would cost a search, and the
//! dispatcher skips it for free.

use crate::clock::Clock;
use crate::error::ShedReason;
use crate::line::{Line, QueueOrder};
use crate::slots::{Claim, SlotTable};
use crate::sync::{lock, loom_seqcst_fence, Arc, AtomicUsize, Mutex, Ordering};
use std::task::{Context, Poll, Waker};

/// Set in `parked` once the bulkhead is closed, so that the fast path's one
/// load sees it: every arrival then takes the slow path and is refused.
const CLOSED: usize = 1 << (usize::BITS - 1);

#[derive(Debug, Default)]
pub(crate) struct Waiters {
    /// How many nodes in `queue` are `Parked` (and `CLOSED`). Written only
    /// under the lock.
    parked: AtomicUsize,
    queue: Mutex<Line<Arc<Node>>>,
}

/// One parked caller, shared between the queue and the caller's future.
#[derive(Debug)]
pub(crate) struct Node {
    state: Mutex<NodeState>,
    /// How many slots the caller takes.
    weight: usize,
    priority: i32,
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
    pub(crate) fn new(order: QueueOrder) -> Self {
        Self {
            parked: AtomicUsize::new(0),
            queue: Mutex::new(Line::new(order)),
        }
    }

    /// Callers parked now. `Relaxed`: the fast path only needs a hint, since a
    /// caller that misses a parked neighbour arrived, in effect, before it.
    #[inline]
    pub(crate) fn parked(&self) -> usize {
        self.parked.load(Ordering::Relaxed) & !CLOSED
    }

    /// Nobody parked and not closed: the fast path may go ahead.
    #[inline]
    pub(crate) fn quiet(&self) -> bool {
        self.parked.load(Ordering::Relaxed) == 0
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.parked.load(Ordering::SeqCst) & CLOSED != 0
    }

    #[inline]
    fn count(&self) -> usize {
        self.parked.load(Ordering::SeqCst) & !CLOSED
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
        let mut queue = lock(&self.queue);
        self.parked.fetch_or(CLOSED, Ordering::SeqCst);
        self.refuse_parked(&mut queue, ShedReason::Closed);
    }

    /// Refuses every caller parked now.
    pub(crate) fn cancel(&self) {
        let mut queue = lock(&self.queue);
        self.refuse_parked(&mut queue, ShedReason::Cancelled);
    }

    fn refuse_parked(&self, queue: &mut Line<Arc<Node>>, reason: ShedReason) {
        let nodes: Vec<_> = queue.drain().collect();
        for node in nodes {
            self.resolve(queue, &node, NodeState::Refused(reason));
        }
    }

    /// Ends the wait of the caller behind `node` with `outcome`, and wakes
    /// it; `false` if it was no longer parked (it gave up meanwhile).
    fn resolve(&self, queue: &mut Line<Arc<Node>>, node: &Node, outcome: NodeState) -> bool {
        let mut state = lock(&node.state);
        let NodeState::Parked(waker) = &mut *state else {
            return false;
        };
        let waker = waker.take();
        *state = outcome;
        queue.left(node.priority);
        self.parked.fetch_sub(1, Ordering::SeqCst);
        drop(state);
        if let Some(waker) = waker {
            waker.wake();
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
        self.dispatch(&mut lock(&self.queue), slots, clock.now());
    }

    /// A caller that may not wait, arriving while others are parked: it gets a
    /// slot only if one is still free once every parked caller has been served.
    pub(crate) fn claim_behind_parked(
        &self,
        slots: &SlotTable,
        now: u64,
        weight: usize,
    ) -> Option<Claim> {
        let mut queue = lock(&self.queue);
        self.dispatch(&mut queue, slots, now);
        if self.parked.load(Ordering::SeqCst) == 0 {
            // Nobody parked, and not closed.
            slots.try_claim_weighted(now, weight, Ordering::SeqCst)
        } else {
            None
        }
    }

    /// A caller that may wait: admitted if nobody is parked and a slot is
    /// free, otherwise parked at the tail of the line (unless `max_parked`
    /// callers already are).
    pub(crate) fn arrive(
        &self,
        slots: &SlotTable,
        now: u64,
        max_parked: Option<usize>,
        priority: i32,
        weight: usize,
    ) -> Arrival {
        let mut queue = lock(&self.queue);
        if self.is_closed() {
            return Arrival::Closed;
        }
        self.dispatch(&mut queue, slots, now);
        let parked = self.count();
        if parked == 0 {
            if let Some(claim) = slots.try_claim_weighted(now, weight, Ordering::SeqCst) {
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
        });
        queue.push(priority, weight, node.clone());
        self.parked.fetch_add(1, Ordering::SeqCst);
        loom_seqcst_fence();
        // A slot freed after the scan above, by a releaser that read
        // `parked` before the increment, is found here.
        self.dispatch(&mut queue, slots, now);
        Arrival::Parked(node)
    }

    /// Hands free slots to parked callers in the line's order, until either
    /// runs out. The head of the line is never bypassed: if it needs more
    /// slots than are free, nobody behind it is served, and freed slots
    /// stay free for it (the fast path is closed while anyone is parked).
    fn dispatch(&self, queue: &mut Line<Arc<Node>>, slots: &SlotTable, now: u64) {
        while self.count() > 0 {
            let Some((place, head)) = queue.peek_next(self.count()) else {
                // `parked` and the queue disagree; never strand a caller's count.
                self.parked.fetch_and(CLOSED, Ordering::SeqCst);
                break;
            };
            if !head.is_parked() {
                // It gave up; it is skipped for free.
                queue.take(place);
                continue;
            }
            let weight = head.weight;
            let Some(claim) = slots.try_claim_weighted(now, weight, Ordering::SeqCst) else {
                break;
            };
            // The very entry seen, even if a custom order would now pick another.
            let head = queue.take(place);
            if !self.resolve(queue, &head, NodeState::Granted(claim)) {
                // Cannot happen while the queue is locked; never strand the slot.
                slots.release(&claim);
            }
        }
        if self.count() == 0 {
            queue.clear();
        }
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
        now: u64,
        last_chance: bool,
    ) -> Option<Claim> {
        let mut queue = lock(&self.queue);
        if last_chance {
            self.dispatch(&mut queue, slots, now);
        }
        let mut state = lock(&node.state);
        match std::mem::replace(&mut *state, NodeState::Done) {
            NodeState::Granted(claim) => Some(claim),
            NodeState::Parked(_) => {
                queue.left(node.priority);
                self.parked.fetch_sub(1, Ordering::SeqCst);
                drop(state);
                self.drop_finished_front(&mut queue);
                // If it was the head, waiting for more slots than were
                // free, the caller behind it may fit in those slots now.
                self.dispatch(&mut queue, slots, now);
                None
            }
            NodeState::Refused(_) | NodeState::Done => None,
        }
    }

    /// Callers give up mostly in arrival order, so the nodes they leave behind
    /// sit at the front: pop them now rather than let the queue grow while no
    /// slot comes free.
    fn drop_finished_front(&self, queue: &mut Line<Arc<Node>>) {
        if self.count() == 0 {
            queue.clear();
            return;
        }
        queue.prune(|node| matches!(*lock(&node.state), NodeState::Done));
    }
}
