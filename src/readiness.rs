//! What `poll_ready` decides and `call` acts on, shared by the tower and the
//! HTTP services so that both keep the same contract.

use crate::acquire::Acquire;
use crate::bulkhead::Bulkhead;
use crate::error::ServiceSaturated;
use crate::permit::Permit;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

/// A service's readiness to take a slot. It belongs to one service value:
/// clones start afresh.
#[derive(Debug, Default)]
pub(crate) enum Readiness {
    /// Nothing decided yet, or there was room: `call` takes a slot.
    #[default]
    Idle,
    /// Parked until a slot is handed over or the wait budget is spent.
    Waiting(Pin<Box<Acquire>>),
    /// A slot was handed over while waiting.
    Admitted(Permit),
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
            if bulkhead.shared().config().wait.is_none() {
                return Poll::Ready(());
            }
        }
        self.poll_ready_slow(bulkhead, cx)
    }

    fn poll_ready_slow(&mut self, bulkhead: &Bulkhead, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            match self {
                Readiness::Idle => {
                    let shared = bulkhead.shared();
                    if shared.config().wait.is_none() || shared.has_room() {
                        return Poll::Ready(());
                    }
                    *self = Readiness::Waiting(Box::pin(bulkhead.acquire()));
                }
                Readiness::Waiting(acquire) => {
                    *self = match ready!(acquire.as_mut().poll(cx)) {
                        Ok(permit) => Readiness::Admitted(permit),
                        Err(shed) => Readiness::Shed(shed),
                    };
                    return Poll::Ready(());
                }
                // Polled again after the budget ran out: if a slot has come
                // free since, let `call` take it rather than shed beside it.
                // The spent budget is not started again.
                Readiness::Shed(_) if bulkhead.shared().has_room() => {
                    *self = Readiness::Idle;
                    return Poll::Ready(());
                }
                Readiness::Admitted(_) | Readiness::Shed(_) => return Poll::Ready(()),
            }
        }
    }

    /// The slot for the call being made now: the one handed over while
    /// waiting, or a free one, or the reason there is none.
    #[inline]
    pub(crate) fn take(&mut self, bulkhead: &Bulkhead) -> Result<Permit, ServiceSaturated> {
        if let Readiness::Idle = self {
            return bulkhead.try_acquire();
        }
        self.take_decided(bulkhead)
    }

    fn take_decided(&mut self, bulkhead: &Bulkhead) -> Result<Permit, ServiceSaturated> {
        match std::mem::take(self) {
            Readiness::Admitted(permit) => Ok(permit),
            Readiness::Shed(shed) => Err(shed),
            // `Waiting` means `poll_ready` was not ready: a caller's bug, which
            // the bulkhead answers as if no wait had been asked for.
            Readiness::Idle | Readiness::Waiting(_) => bulkhead.try_acquire(),
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
