//! The tower service.

use crate::acquire::Acquire;
use crate::bulkhead::Bulkhead;
use crate::error::ServiceSaturated;
use crate::future::ResponseFuture;
use crate::permit::Permit;
use crate::BoxError;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tower_service::Service;

/// Caps how many calls to the inner service are in flight at once.
///
/// Each call takes a slot of the shared [`Bulkhead`] and holds it until its
/// response future completes or is dropped. Over the limit the inner service
/// is not called: the call fails at once with [`ServiceSaturated`] inside a
/// [`BoxError`].
///
/// # Readiness
///
/// When there is room, `poll_ready` is ready and the slot is taken in `call`,
/// so a clone that was polled ready and then idles (a keep-alive connection
/// between requests) holds no slot. Saturation never makes `poll_ready` fail
/// or stall: without a `wait` budget it is ready and `call` sheds, as
/// `tower::load_shed` does. With a `wait` budget and no room, `poll_ready`
/// waits (holding no slot) until a slot is handed to this service or the
/// budget runs out, and `call` then uses that slot or sheds. The inner service
/// is polled first, so no slot is held while it is not ready.
pub struct Concurrency<S> {
    inner: S,
    bulkhead: Bulkhead,
    state: State,
}

/// What `poll_ready` decided, for `call` to act on.
enum State {
    /// Nothing decided yet, or there was room: `call` takes a slot.
    Idle,
    /// Parked until a slot is handed over or the wait budget is spent.
    Waiting(Pin<Box<Acquire>>),
    /// A slot was handed over while waiting.
    Admitted(Permit),
    /// The wait budget ran out.
    Shed(ServiceSaturated),
}

impl<S> Concurrency<S> {
    /// Wraps `inner` in `bulkhead`.
    pub fn new(inner: S, bulkhead: Bulkhead) -> Self {
        Self {
            inner,
            bulkhead,
            state: State::Idle,
        }
    }

    /// The bulkhead this service takes its slots from.
    pub fn bulkhead(&self) -> &Bulkhead {
        &self.bulkhead
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, consuming this one.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, Request> Service<Request> for Concurrency<S>
where
    S: Service<Request>,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        ready!(self.inner.poll_ready(cx)).map_err(Into::into)?;
        loop {
            match &mut self.state {
                State::Idle => {
                    let shared = self.bulkhead.shared();
                    if shared.config().wait.is_none() || shared.has_room() {
                        return Poll::Ready(Ok(()));
                    }
                    self.state = State::Waiting(Box::pin(self.bulkhead.acquire()));
                }
                State::Waiting(acquire) => {
                    self.state = match ready!(acquire.as_mut().poll(cx)) {
                        Ok(permit) => State::Admitted(permit),
                        Err(shed) => State::Shed(shed),
                    };
                    return Poll::Ready(Ok(()));
                }
                State::Admitted(_) | State::Shed(_) => return Poll::Ready(Ok(())),
            }
        }
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let permit = match std::mem::replace(&mut self.state, State::Idle) {
            State::Admitted(permit) => permit,
            State::Shed(shed) => return ResponseFuture::shed(shed),
            // `Waiting` means `poll_ready` was not ready: a caller's bug, which
            // the bulkhead answers as if no wait had been asked for.
            State::Idle | State::Waiting(_) => match self.bulkhead.try_acquire() {
                Ok(permit) => permit,
                Err(shed) => return ResponseFuture::shed(shed),
            },
        };
        ResponseFuture::called(self.inner.call(request), permit)
    }
}

impl<S: Clone> Clone for Concurrency<S> {
    /// The clone shares the bulkhead but not this service's readiness: a slot
    /// handed to this service is not the clone's to use.
    fn clone(&self) -> Self {
        Self::new(self.inner.clone(), self.bulkhead.clone())
    }
}

impl<S: fmt::Debug> fmt::Debug for Concurrency<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Idle => "idle",
            State::Waiting(_) => "waiting",
            State::Admitted(_) => "admitted",
            State::Shed(_) => "shed",
        };
        f.debug_struct("Concurrency")
            .field("inner", &self.inner)
            .field("bulkhead", &self.bulkhead)
            .field("state", &state)
            .finish()
    }
}
