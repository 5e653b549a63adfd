//! The tower service.

use crate::bulkhead::Bulkhead;
use crate::tower::{Readiness, ResponseFuture};
use crate::BoxError;
use std::fmt;
use std::task::{ready, Context, Poll};
use tower_service::Service;

/// Caps how many calls to the inner service are in flight at once.
///
/// Each call takes a slot of the shared [`Bulkhead`] and holds it until its
/// response future completes or is dropped. Over the limit the inner service
/// is not called: the call fails at once with
/// [`ServiceSaturated`](crate::ServiceSaturated) inside a [`BoxError`].
///
/// # Readiness
///
/// When there is room, `poll_ready` is ready and the slot is taken in `call`,
/// so a clone that was polled ready and then idles (a keep-alive connection
/// between requests) holds no slot. Saturation never makes `poll_ready` fail:
/// without a `wait` budget it is ready and `call` sheds, as
/// `tower::load_shed` does. With a `wait` budget and no room, `poll_ready`
/// waits (holding no slot) until a slot is handed to this service or the
/// budget runs out, and `call` then uses that slot or sheds. A slot handed
/// over this way is held from `poll_ready` until `call`, or until the service
/// is dropped, which hands it to the next in line. The inner service is
/// polled first, so no slot is held while it is not ready.
///
/// So a service that found room in `poll_ready` was promised nothing: if
/// another caller takes the last slot before its `call` (or an adaptive
/// limit is lowered meanwhile), the call is shed at once, without waiting,
/// even with a `wait` budget. That is the price of an
/// idle clone pinning nothing; callers that poll and call back to back (a
/// `Buffer`'s worker, hyper, axum, `ServiceExt::oneshot`) leave the window a
/// few instructions wide.
///
/// With a ceiling ([`Config::ceiling`](crate::Config::ceiling), or
/// `Config::cluster_ceiling` on Redis), a lease may be a round trip, which
/// `call` cannot wait for: `poll_ready` takes the slot and the lease, and
/// the service holds them until its `call` (or gives both back when
/// dropped), as tower's `ConcurrencyLimit` holds its permit.
pub struct Concurrency<S> {
    inner: S,
    bulkhead: Bulkhead,
    readiness: Readiness,
}

impl<S> Concurrency<S> {
    /// Wraps `inner` in `bulkhead`.
    pub fn new(inner: S, bulkhead: Bulkhead) -> Self {
        Self {
            inner,
            bulkhead,
            readiness: Readiness::Idle,
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

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        ready!(self.inner.poll_ready(cx)).map_err(Into::into)?;
        ready!(self.readiness.poll_ready(&self.bulkhead, cx));
        Poll::Ready(Ok(()))
    }

    #[inline]
    fn call(&mut self, request: Request) -> Self::Future {
        let inner = &mut self.inner;
        self.readiness.call(
            &self.bulkhead,
            0,
            |permit| ResponseFuture::called(inner.call(request), permit),
            ResponseFuture::shed,
        )
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
        f.debug_struct("Concurrency")
            .field("inner", &self.inner)
            .field("bulkhead", &self.bulkhead)
            .field("readiness", &self.readiness.as_str())
            .finish()
    }
}
