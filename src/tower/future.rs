//! The response future.

use crate::bulkhead::Permit;
use crate::error::ServiceSaturated;
use crate::BoxError;
use pin_project_lite::pin_project;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

pin_project! {
    /// Future for [`Concurrency`](crate::Concurrency)'s responses: the inner
    /// call holding its slot, or a shed call that fails at once.
    pub struct ResponseFuture<F> {
        #[pin]
        kind: Kind<F>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F> {
        Called { #[pin] future: F, permit: Option<Permit> },
        Shed { shed: Option<ServiceSaturated> },
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn called(future: F, mut permit: Permit) -> Self {
        permit.ignore_unless_recorded();
        Self {
            kind: Kind::Called {
                future,
                permit: Some(permit),
            },
        }
    }

    pub(crate) fn shed(shed: ServiceSaturated) -> Self {
        Self {
            kind: Kind::Shed { shed: Some(shed) },
        }
    }
}

impl<F, T, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    type Output = Result<T, BoxError>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Called { future, permit } => {
                let output = ready!(future.poll(cx)).map_err(Into::into);
                if let Some(permit) = permit {
                    permit.record_result(output.as_ref());
                }
                // Free the slot now, not whenever the caller drops this
                // future. Dropped in place, not moved out first: a move
                // copies it with wide loads that stall on the narrower
                // stores that wrote it.
                *permit = None;
                Poll::Ready(output)
            }
            KindProj::Shed { shed } => {
                let shed = shed
                    .take()
                    .expect("`ResponseFuture` polled after completion");
                Poll::Ready(Err(shed.into()))
            }
        }
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Called { .. } => "called",
            Kind::Shed { .. } => "shed",
        };
        f.debug_struct("ResponseFuture")
            .field("kind", &kind)
            .finish()
    }
}
