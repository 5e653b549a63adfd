//! The future of a caller that may wait for a slot.

use crate::bulkhead::{Granted, Leasing, Permit, Shared};
use crate::error::{ServiceSaturated, ShedReason};
use crate::sync::Arc;
use crate::ticket::Ticket;
use crate::wait::{Arrival, Left, MovablePlace, Node, SaturationSignal, Verdict, WaitEnd};
use pin_project_lite::pin_project;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::time::Sleep;

pin_project! {
    /// Future returned by [`Bulkhead::acquire`](crate::Bulkhead::acquire):
    /// resolves to a [`Permit`], or to [`ServiceSaturated`] once the `wait`
    /// budget is spent.
    #[must_use = "futures do nothing unless polled"]
    pub struct Acquire {
        shared: Arc<Shared>,
        ticket: Ticket,
        // Bytes of the byte budget the permit takes beside its slots.
        bytes: u64,
        // When the caller arrived, if its bulkhead has a ceiling:
        // a lease may be asked for until its `wait` budget is spent.
        arrived: Option<tokio::time::Instant>,
        // A place in line that its owner may move (see `MovablePlace`), in
        // place of the ticket's.
        movable: Option<Arc<MovablePlace>>,
        #[pin]
        state: State,
    }
}

pin_project! {
    #[project = StateProj]
    enum State {
        Arriving,
        Parked { place: Place, #[pin] budget: Sleep },
        // Holding its local slots, asking for a lease under the ceiling.
        Leasing { granted: Option<Granted>, leasing: Leasing },
        Done,
    }
}

/// A place in the waiter queue. Dropping it leaves the line, and passes on
/// a slot that was handed to it but never taken.
struct Place {
    shared: Arc<Shared>,
    node: Arc<Node>,
    since: tokio::time::Instant,
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    priority: i32,
    /// This wait is the saturation signal's probe.
    probe: bool,
    /// Whether the end of this wait has been recorded.
    recorded: bool,
}

impl Place {
    /// Records the end of the wait (once). Called once the slots, if any,
    /// are in a guard: the event hook it calls may panic.
    fn record(&mut self, end: WaitEnd) {
        if !std::mem::replace(&mut self.recorded, true) {
            let waiting = self.shared.waiters().parked();
            self.shared
                .observer()
                .waited(self.since.elapsed(), end == WaitEnd::Admitted, waiting);
            self.shared.wait_ended(end, self.probe);
            #[cfg(feature = "metrics")]
            self.shared
                .observer()
                .waiting_by_priority(self.priority, self.shared.waiters().depth(self.priority));
        }
    }
}

impl Acquire {
    pub(crate) fn new(shared: Arc<Shared>, ticket: Ticket) -> Self {
        Self {
            shared,
            ticket,
            bytes: 0,
            arrived: None,
            movable: None,
            state: State::Arriving,
        }
    }

    /// The caller goes to the line at `movable`'s place, if there is one,
    /// which its owner may move while it waits.
    pub(crate) fn in_movable_place(mut self, movable: Option<Arc<MovablePlace>>) -> Self {
        self.movable = movable;
        self
    }

    /// The permit also takes `bytes` of the byte budget, once it has its
    /// slots; if they do not fit, the slots are given back and the call is
    /// shed with [`ShedReason::Bytes`].
    pub(crate) fn with_bytes(mut self, bytes: u64) -> Self {
        self.bytes = bytes;
        self
    }

    /// Waits for the slots, without making them a permit: for a caller that
    /// learns the bytes it needs only later (a service ready before its call).
    pub(crate) fn poll_granted(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Granted, ServiceSaturated>> {
        let mut this = self.project();
        'poll: loop {
            let granted = match this.state.as_mut().project() {
                StateProj::Arriving => 'arriving: {
                    let shared = &**this.shared;
                    // Read only when a lease may be asked for again within
                    // the budget: a precise clock read is no part of a shed.
                    if shared.has_ceiling() && shared.config().wait.is_some() {
                        *this.arrived = Some(tokio::time::Instant::now());
                    }
                    let now = shared.now();
                    let reason = match shared.try_claim_weighted(this.ticket.get_weight(), now) {
                        Ok(claim) => break 'arriving Granted::new(this.shared.clone(), claim),
                        Err(reason) => reason,
                    };
                    // A weight over the limit in force (an adaptive limit
                    // that moved below it) could hold up the whole line.
                    let fits = this.ticket.get_weight() <= shared.slots().limit();
                    let wait = match shared.config().wait {
                        Some(wait) if reason == ShedReason::LimitReached && fits => wait,
                        _ => {
                            this.state.set(State::Done);
                            return Poll::Ready(Err(shared.saturated_at(reason, now)));
                        }
                    };
                    // Waiting has been futile of late: shed at once, unless
                    // this caller is the probe.
                    let verdict = shared
                        .saturation()
                        .map_or(Verdict::Park, SaturationSignal::verdict);
                    if verdict == Verdict::Skip {
                        this.state.set(State::Done);
                        return Poll::Ready(Err(shared.saturated(ShedReason::Saturated)));
                    }
                    let probe = verdict == Verdict::Probe;
                    let wait = shared.wait_budget(wait);
                    let arrival = shared.waiters().arrive(
                        shared.slots(),
                        shared.clock(),
                        shared.config().max_waiting,
                        &shared.config().queue_order,
                        *this.ticket,
                        this.movable.as_deref(),
                    );
                    let node = match arrival {
                        Arrival::Parked(node) => node,
                        Arrival::Admitted(claim) => {
                            let granted = Granted::new(this.shared.clone(), claim);
                            if probe {
                                // The probe never waited: a slot was free
                                // after all, so waiting pays.
                                shared.signal_wait_ended(WaitEnd::Admitted, true);
                            }
                            break 'arriving granted;
                        }
                        refused => {
                            let reason = match refused {
                                Arrival::QueueFull => ShedReason::TooManyWaiting,
                                _ => ShedReason::Closed,
                            };
                            if probe {
                                shared.signal_wait_ended(WaitEnd::Abandoned, true);
                            }
                            this.state.set(State::Done);
                            return Poll::Ready(Err(shared.saturated(reason)));
                        }
                    };
                    // In a place first: whatever panics below, the caller
                    // leaves the line when it is dropped.
                    let place = Place {
                        shared: this.shared.clone(),
                        node,
                        priority: this.ticket.get_priority(),
                        since: tokio::time::Instant::now(),
                        probe,
                        recorded: false,
                    };
                    let budget = tokio::time::sleep(wait);
                    this.state.set(State::Parked { place, budget });
                    let observer = shared.observer();
                    shared.see_in_flight_when_refused();
                    observer.parked(shared.waiters().parked());
                    #[cfg(feature = "metrics")]
                    observer.waiting_by_priority(
                        this.ticket.get_priority(),
                        shared.waiters().depth(this.ticket.get_priority()),
                    );
                    // Parked: polled as such at once.
                    continue 'poll;
                }
                StateProj::Parked { place, budget } => {
                    let shared = &place.shared;
                    let (outcome, end) = match shared.waiters().poll_granted(&place.node, cx) {
                        Poll::Ready(Ok(claim)) => (Ok(claim), WaitEnd::Admitted),
                        // Turned away (closed, cancelled): refused, not expired.
                        Poll::Ready(Err(reason)) => (Err(reason), WaitEnd::Abandoned),
                        Poll::Pending => {
                            ready!(budget.poll(cx));
                            match shared.waiters().leave(
                                &place.node,
                                shared.slots(),
                                shared.clock(),
                                true,
                            ) {
                                Left::Granted(claim) => (Ok(claim), WaitEnd::Admitted),
                                // Turned away as its budget ran out.
                                Left::Refused(reason) => (Err(reason), WaitEnd::Abandoned),
                                Left::Waiting => (Err(ShedReason::WaitExpired), WaitEnd::Expired),
                            }
                        }
                    };
                    // The slots in a guard before the end is recorded: the
                    // event hook it calls may panic.
                    let outcome = outcome.map(|claim| Granted::new(this.shared.clone(), claim));
                    place.record(end);
                    match outcome {
                        Ok(granted) => granted,
                        Err(reason) => {
                            let shed = place.shared.saturated(reason);
                            this.state.set(State::Done);
                            return Poll::Ready(Err(shed));
                        }
                    }
                }
                StateProj::Leasing { granted, leasing } => {
                    // A close or a cancel wakes a caller asking, mid-ask.
                    let leased = match leasing.turned_away(this.shared, cx) {
                        Some(reason) => Err(reason),
                        None => ready!(leasing.poll(cx)),
                    };
                    let granted = granted
                        .take()
                        .expect("a lease is asked for by a caller holding its slots");
                    this.state.set(State::Done);
                    return Poll::Ready(match leased {
                        Ok(lease) => Ok(granted.with_lease(lease)),
                        // Both or neither: the local slots go back (to the
                        // next in line) as the grant is dropped.
                        Err(reason) => {
                            drop(granted);
                            Err(this.shared.saturated(reason))
                        }
                    });
                }
                StateProj::Done => panic!("`Acquire` polled after completion"),
            };
            // Its local slots granted, by whichever way: its lease next, if
            // its bulkhead has a ceiling.
            if let Some(done) =
                Self::then_lease(this.state.as_mut(), this.shared, *this.arrived, granted)
            {
                return done;
            }
        }
    }

    /// A caller has its local slots: it asks for its lease under the
    /// ceiling next (`None`: poll on), or, without a ceiling, it is
    /// done with them.
    fn then_lease(
        mut state: Pin<&mut State>,
        shared: &Arc<Shared>,
        arrived: Option<tokio::time::Instant>,
        granted: Granted,
    ) -> Option<Poll<Result<Granted, ServiceSaturated>>> {
        let deadline = arrived
            .zip(shared.config().wait)
            .and_then(|(arrived, wait)| arrived.checked_add(shared.wait_budget(wait)));
        match Leasing::start(shared, deadline) {
            Some(leasing) => {
                state.set(State::Leasing {
                    granted: Some(granted),
                    leasing,
                });
                None
            }
            None => {
                state.set(State::Done);
                Some(Poll::Ready(Ok(granted)))
            }
        }
    }
}

impl Future for Acquire {
    type Output = Result<Permit, ServiceSaturated>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let bytes = self.bytes;
        let granted = ready!(self.as_mut().poll_granted(cx));
        Poll::Ready(granted.and_then(|granted| granted.into_permit(bytes)))
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        // Dropped while waiting: the caller gave up. A slot handed to it
        // meanwhile goes on to the next in line before anything is recorded.
        let shared = &self.shared;
        let granted = shared
            .waiters()
            .leave(&self.node, shared.slots(), shared.clock(), false);
        if let Left::Granted(claim) = granted {
            shared.give_back_unused(&claim);
        }
        self.record(WaitEnd::Abandoned);
    }
}

impl fmt::Debug for Acquire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Arriving => "arriving",
            State::Parked { .. } => "parked",
            State::Leasing { .. } => "leasing",
            State::Done => "done",
        };
        f.debug_struct("Acquire").field("state", &state).finish()
    }
}
