//! Admission of a call that carries a [`Ticket`] (the classified tower and
//! HTTP services): it cannot wait in `poll_ready`, since its ticket comes
//! with the request, so it is admitted when it is made, waits in its
//! response future, or is shed.

use crate::bulkhead::{Acquire, Bulkhead, Permit};
use crate::error::{ServiceSaturated, ShedReason};
use crate::slots::Claim;
use crate::ticket::Ticket;
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

/// What a call that carries a [`Ticket`] gets when it is made. Such a call
/// cannot wait in `poll_ready`, since its ticket comes with the request: it
/// is admitted now, or waits in its response future, or is shed.
// Under loom, whose locks and `Arc`s are larger, `Acquire` passes clippy's
// bound; in a build it does not, and a box would cost the wait an allocation.
#[cfg_attr(tower_inflight_loom, allow(clippy::large_enum_variant))]
pub(crate) enum TicketAdmission {
    /// Its slots, claimed: the caller makes the permit where it keeps it.
    Admitted(Claim),
    /// No room, and a `wait` budget: wait with this (in a [`Parked`]).
    Wait(Acquire),
    Shed(ServiceSaturated),
}

/// Decides a [`TicketAdmission`] for the classified services. Always
/// inlined, and the claim made a permit
/// only where it is kept, so that it is not copied through memory on its
/// way (see [`Readiness::call`]).
#[inline(always)]
pub(crate) fn admit(bulkhead: &Bulkhead, ticket: Ticket) -> TicketAdmission {
    let shared = bulkhead.shared();
    if shared.has_ceiling() {
        // A lease is a round trip: taken in the response future.
        return TicketAdmission::Wait(bulkhead.acquire_with(ticket));
    }
    let now = shared.now();
    match shared.try_claim_weighted(ticket.get_weight(), now) {
        Ok(claim) => TicketAdmission::Admitted(claim),
        Err(ShedReason::LimitReached) if shared.config().wait.is_some() => {
            TicketAdmission::Wait(bulkhead.acquire_with(ticket))
        }
        Err(reason) => TicketAdmission::Shed(shared.saturated_at(reason, now)),
    }
}

pin_project! {
    /// A call that waits in its response future for its slots, with what it
    /// will be made with once they are handed over. Boxed as a whole: the
    /// state is rare and large (a timer), so it costs one allocation and
    /// does not make every call's future as large.
    pub(crate) struct Parked<T> {
        #[pin]
        acquire: Acquire,
        call: Option<T>,
    }
}

impl<T> Parked<T> {
    pub(crate) fn new(acquire: Acquire, call: T) -> Pin<Box<Self>> {
        Box::pin(Self {
            acquire,
            call: Some(call),
        })
    }

    /// Waits for the slots, then gives back what the call is made with,
    /// beside its permit or the reason it was shed.
    pub(crate) fn poll_admitted(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<(Result<Permit, ServiceSaturated>, T)> {
        let this = self.project();
        let admitted = ready!(this.acquire.poll(cx));
        let call = this
            .call
            .take()
            .expect("a parked call polled after it was admitted");
        Poll::Ready((admitted, call))
    }
}
