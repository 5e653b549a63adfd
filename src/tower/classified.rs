//! The tower layer whose calls carry a [`Ticket`] chosen from the request.

use crate::bulkhead::{Bulkhead, Permit};
use crate::ticket::Ticket;
use crate::tower::{admit, take_ready, Parked, ResponseFuture, TicketAdmission};
use crate::BoxError;
use pin_project_lite::pin_project;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tower_layer::Layer;
use tower_service::Service;

/// Wraps services in a [`Classified`] bulkhead: each call's priority and
/// weight come from its request. Built by
/// [`ConcurrencyLayer::classify`](crate::ConcurrencyLayer::classify).
#[derive(Clone)]
pub struct ClassifiedLayer<F> {
    bulkhead: Bulkhead,
    classify: F,
}

/// [`Concurrency`](crate::Concurrency) for calls that are not all alike:
/// a classifier gives each request a [`Ticket`], a priority in the line of
/// waiting callers and a weight in slots.
///
/// # Readiness
///
/// The ticket is known only once the request is, so this service never
/// waits in `poll_ready`, which is the inner service's readiness alone. In
/// `call`, a request that finds room takes its slots and calls the inner
/// service at once, as [`Concurrency`](crate::Concurrency) does. One that
/// must wait (a `wait` budget and no room) waits in the response future,
/// holding no slot: the ready inner service goes into the future with it, to
/// be called once the slots are handed over, and a clone of it takes its
/// place. That is why the inner service must be `Clone`, as for tower's
/// `AsyncFilter`; for a service that reserves capacity when polled ready
/// (a `Buffer`), that reservation is held while the request waits.
pub struct Classified<S, F> {
    inner: S,
    bulkhead: Bulkhead,
    classify: F,
}

impl<F> ClassifiedLayer<F> {
    pub(crate) fn new(bulkhead: Bulkhead, classify: F) -> Self {
        Self { bulkhead, classify }
    }

    /// The bulkhead shared by every service this layer wraps.
    pub fn bulkhead(&self) -> Bulkhead {
        self.bulkhead.clone()
    }
}

impl<S, F: Clone> Layer<S> for ClassifiedLayer<F> {
    type Service = Classified<S, F>;

    fn layer(&self, inner: S) -> Self::Service {
        Classified {
            inner,
            bulkhead: self.bulkhead.clone(),
            classify: self.classify.clone(),
        }
    }
}

impl<S, F> Classified<S, F> {
    /// The bulkhead this service takes its slots from.
    pub fn bulkhead(&self) -> &Bulkhead {
        &self.bulkhead
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, consuming this one.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, F, Request> Service<Request> for Classified<S, F>
where
    S: Service<Request> + Clone,
    S::Error: Into<BoxError>,
    F: Fn(&Request) -> Ticket,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ClassifiedFuture<S, Request>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let ticket = (self.classify)(&request);
        let state = match admit(&self.bulkhead, ticket) {
            TicketAdmission::Admitted(claim) => {
                // A permit before the inner call, which may panic.
                let permit = Permit::new(self.bulkhead.shared().clone(), claim);
                State::Running {
                    response: ResponseFuture::called(self.inner.call(request), permit),
                }
            }
            TicketAdmission::Wait(acquire) => {
                let ready = take_ready(&mut self.inner);
                State::Waiting {
                    parked: Parked::new(acquire, (ready, request)),
                }
            }
            TicketAdmission::Shed(shed) => State::Running {
                response: ResponseFuture::shed(shed),
            },
        };
        ClassifiedFuture { state }
    }
}

pin_project! {
    /// Future for [`Classified`]'s responses: waiting for slots, then the
    /// inner call holding them, or a shed call that fails at once.
    pub struct ClassifiedFuture<S, Request>
    where
        S: Service<Request>,
    {
        #[pin]
        state: State<S, Request>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, Request>
    where
        S: Service<Request>,
    {
        Waiting { parked: Pin<Box<Parked<(S, Request)>>> },
        Running { #[pin] response: ResponseFuture<S::Future> },
    }
}

impl<S, Request> Future for ClassifiedFuture<S, Request>
where
    S: Service<Request>,
    S::Error: Into<BoxError>,
{
    type Output = Result<S::Response, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Waiting { parked } => {
                    let response = match ready!(parked.as_mut().poll_admitted(cx)) {
                        (Ok(permit), (mut inner, request)) => {
                            ResponseFuture::called(inner.call(request), permit)
                        }
                        (Err(shed), _) => ResponseFuture::shed(shed),
                    };
                    state.set(State::Running { response });
                }
                StateProj::Running { response } => return response.poll(cx),
            }
        }
    }
}

impl<S: fmt::Debug, F> fmt::Debug for Classified<S, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Classified")
            .field("inner", &self.inner)
            .field("bulkhead", &self.bulkhead)
            .finish_non_exhaustive()
    }
}

impl<S: Clone, F: Clone> Clone for Classified<S, F> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            bulkhead: self.bulkhead.clone(),
            classify: self.classify.clone(),
        }
    }
}

impl<F> fmt::Debug for ClassifiedLayer<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClassifiedLayer")
            .field("bulkhead", &self.bulkhead)
            .finish_non_exhaustive()
    }
}

impl<S, Request> fmt::Debug for ClassifiedFuture<S, Request>
where
    S: Service<Request>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Waiting { .. } => "waiting",
            State::Running { .. } => "running",
        };
        f.debug_struct("ClassifiedFuture")
            .field("state", &state)
            .finish()
    }
}
