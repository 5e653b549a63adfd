//! What `poll_ready` decides and `call` acts on, shared by the tower and the
//! HTTP services so that both keep the same contract.

use crate::bulkhead::{Acquire, Bulkhead, Granted, Permit, Shared};
use crate::error::ServiceSaturated;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

/// The ready service, for a call that waits for its slots in its response
/// future and calls it there; `service` keeps a clone, not yet ready:
/// readiness belongs to the value that was polled ready, and the next
/// `poll_ready` is the clone's.
pub(crate) fn take_ready<S: Clone>(service: &mut S) -> S {
    let clone = service.clone();
    std::mem::replace(service, clone)
}

/// A service's readiness to take a slot. It belongs to one service value:
/// clones start afresh.
#[derive(Debug, Default)]
pub(crate) enum Readiness {
    /// Nothing decided yet, or there was room: `call` takes a slot.
    #[default]
    Idle,
    /// Parked until a slot is handed over or the wait budget is spent.
    Waiting(Pin<Box<Acquire>>),
    /// Slots were handed over while waiting: made a permit in `call`,
    /// with the bytes the call brings; given back if the service is
    /// dropped first.
    Admitted(Granted),
    /// The wait budget ran out.
    Shed(ServiceSaturated),
}

impl Readiness {
    /// Ready when there is room (taking nothing), or, with a `wait` budget
    /// and no room, once a slot is handed over or the budget is spent.
    /// Never an error: saturation is for `call` to report.
    #[inline]
    pub(crate) fn poll_ready(&mut self, bulkhead: &Bulkhead, cx: &mut Context<'_>) -> Poll<()> {
        if let Readiness::Idle = self {
            if !bulkhead.shared().may_wait() {
                return Poll::Ready(());
            }
        }
        self.poll_ready_slow(bulkhead, cx)
    }

    fn poll_ready_slow(&mut self, bulkhead: &Bulkhead, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            match self {
                // Only with a `wait` budget or a cluster ceiling: `poll_ready`
                // answers without them. A lease is a round trip, so with a
                // ceiling the slot and the lease are taken here, and held
                // until `call`.
                Readiness::Idle => {
                    if bulkhead.shared().has_room_for_call() {
                        return Poll::Ready(());
                    }
                    *self = Readiness::Waiting(Box::pin(bulkhead.acquire()));
                }
                Readiness::Waiting(acquire) => {
                    *self = match ready!(acquire.as_mut().poll_granted(cx)) {
                        Ok(granted) => Readiness::Admitted(granted),
                        Err(shed) => Readiness::Shed(shed),
                    };
                    return Poll::Ready(());
                }
                // Polled again after the budget ran out: if a slot has come
                // free since, let `call` take it rather than shed beside it.
                // The spent budget is not started again.
                Readiness::Shed(_) if bulkhead.shared().has_room_for_call() => {
                    *self = Readiness::Idle;
                    return Poll::Ready(());
                }
                Readiness::Admitted(_) | Readiness::Shed(_) => return Poll::Ready(()),
            }
        }
    }

    /// Makes the call being made now with its slot (the one handed over
    /// while waiting, or a free one) and `bytes` of the byte budget, or
    /// sheds it with the reason there is none.
    ///
    /// The permit is handed to `admitted` rather than returned in a
    /// `Result`: moving it out of one copies it with wide loads that stall
    /// on the narrower stores that have just written it, which cost a call
    /// through the layer a third of its time. It exists before `admitted`
    /// runs, so a panicking inner call still releases it.
    #[inline]
    pub(crate) fn call<R>(
        &mut self,
        bulkhead: &Bulkhead,
        bytes: u64,
        admitted: impl FnOnce(Permit) -> R,
        shed: impl FnOnce(ServiceSaturated) -> R,
    ) -> R {
        if let Readiness::Idle = self {
            let shared = bulkhead.shared();
            return match shared.claim_or_shed() {
                // Without bytes (the tower layer, always), the permit is
                // built in place: not through `Shared::permit`'s `Result`.
                Ok(claim) if bytes == 0 => admitted(Permit::new(shared.clone(), claim)),
                Ok(claim) => match Shared::permit(shared, claim, bytes) {
                    Ok(permit) => admitted(permit),
                    Err(refused) => shed(refused),
                },
                Err(refused) => shed(refused),
            };
        }
        match self.take_decided(bulkhead, bytes) {
            Ok(permit) => admitted(permit),
            Err(reason) => shed(reason),
        }
    }

    fn take_decided(
        &mut self,
        bulkhead: &Bulkhead,
        bytes: u64,
    ) -> Result<Permit, ServiceSaturated> {
        match std::mem::take(self) {
            Readiness::Admitted(granted) => granted.into_permit(bytes),
            Readiness::Shed(shed) => Err(shed),
            // `Waiting` means `poll_ready` was not ready: a caller's bug, which
            // the bulkhead answers as if no wait had been asked for.
            Readiness::Idle | Readiness::Waiting(_) => {
                let shared = bulkhead.shared();
                let claim = shared.claim_or_shed()?;
                Shared::permit(shared, claim, bytes)
            }
        }
    }

    pub(crate) fn as_str(&self) -> &'static str {
        match self {
            Readiness::Idle => "idle",
            Readiness::Waiting(_) => "waiting",
            Readiness::Admitted(_) => "admitted",
            Readiness::Shed(_) => "shed",
        }
    }
}
