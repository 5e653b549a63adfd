//! The future of a caller that may wait for a slot.

use crate::bulkhead::Shared;
use crate::error::{ServiceSaturated, ShedReason};
use crate::permit::Permit;
use crate::saturation::{SaturationSignal, Verdict};
use crate::sync::Arc;
use crate::ticket::Ticket;
use crate::waiters::{Arrival, Node};
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
        #[pin]
        state: State,
    }
}

pin_project! {
    #[project = StateProj]
    enum State {
        Arriving,
        Parked { place: Place, #[pin] budget: Sleep },
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
    /// Records the end of the wait (once).
    fn record(&mut self, admitted: bool) {
        if !std::mem::replace(&mut self.recorded, true) {
            let waiting = self.shared.waiters().parked();
            self.shared
                .observer()
                .waited(self.since.elapsed(), admitted, waiting);
            self.shared.wait_ended(admitted, self.probe);
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
            state: State::Arriving,
        }
    }
}

impl Future for Acquire {
    type Output = Result<Permit, ServiceSaturated>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Arriving => {
                    let shared = &**this.shared;
                    let now = shared.now();
                    let reason = match shared.try_claim_weighted(this.ticket.get_weight(), now) {
                        Ok(claim) => {
                            this.state.set(State::Done);
                            return Poll::Ready(Ok(Permit::new(this.shared.clone(), claim)));
                        }
                        Err(reason) => reason,
                    };
                    let wait = match shared.config().wait {
                        Some(wait) if reason == ShedReason::LimitReached => wait,
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
                        shared.now(),
                        shared.config().max_waiting,
                        this.ticket.get_priority(),
                        this.ticket.get_weight(),
                    );
                    if probe && !matches!(arrival, Arrival::Parked(_)) {
                        // The probe never waited: a slot was free after all
                        // (waiting pays), or it was turned away.
                        let admitted = matches!(arrival, Arrival::Admitted(_));
                        shared.signal_wait_ended(admitted, true);
                    }
                    match arrival {
                        Arrival::Admitted(claim) => {
                            this.state.set(State::Done);
                            return Poll::Ready(Ok(Permit::new(this.shared.clone(), claim)));
                        }
                        Arrival::QueueFull => {
                            this.state.set(State::Done);
                            return Poll::Ready(Err(shared.saturated(ShedReason::TooManyWaiting)));
                        }
                        Arrival::Closed => {
                            this.state.set(State::Done);
                            return Poll::Ready(Err(shared.saturated(ShedReason::Closed)));
                        }
                        Arrival::Parked(node) => {
                            let observer = shared.observer();
                            shared.see_in_flight_when_refused(|| shared.now());
                            observer.parked(shared.waiters().parked());
                            #[cfg(feature = "metrics")]
                            observer.waiting_by_priority(
                                this.ticket.get_priority(),
                                shared.waiters().depth(this.ticket.get_priority()),
                            );
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
                        }
                    }
                }
                StateProj::Parked { place, budget } => {
                    let shared = &place.shared;
                    if let Poll::Ready(outcome) = shared.waiters().poll_granted(&place.node, cx) {
                        place.record(outcome.is_ok());
                        let outcome = match outcome {
                            Ok(claim) => Ok(Permit::new(this.shared.clone(), claim)),
                            Err(reason) => Err(place.shared.saturated(reason)),
                        };
                        this.state.set(State::Done);
                        return Poll::Ready(outcome);
                    }
                    ready!(budget.poll(cx));
                    let granted =
                        shared
                            .waiters()
                            .leave(&place.node, shared.slots(), shared.now(), true);
                    place.record(granted.is_some());
                    let shared = &place.shared;
                    let outcome = match granted {
                        Some(claim) => Ok(Permit::new(this.shared.clone(), claim)),
                        None => Err(shared.saturated(ShedReason::WaitExpired)),
                    };
                    this.state.set(State::Done);
                    return Poll::Ready(outcome);
                }
                StateProj::Done => panic!("`Acquire` polled after completion"),
            }
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        // Dropped while waiting: the caller gave up.
        let shared = &self.shared;
        let granted = shared
            .waiters()
            .leave(&self.node, shared.slots(), shared.now(), false);
        self.record(false);
        if let Some(claim) = granted {
            self.shared.release(&claim);
        }
    }
}

impl fmt::Debug for Acquire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Arriving => "arriving",
            State::Parked { .. } => "parked",
            State::Done => "done",
        };
        f.debug_struct("Acquire").field("state", &state).finish()
    }
}
