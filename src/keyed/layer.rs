//! The tower layer over a keyed bulkhead.

use crate::error::ServiceSaturated;
use crate::keyed::bulkhead::Start;
use crate::keyed::{KeyedBulkhead, KeyedPermit};
use crate::tower::take_ready;
use crate::BoxError;
use pin_project_lite::pin_project;
use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tower_layer::Layer;
use tower_service::Service;

/// Wraps services in a [`KeyedConcurrency`]: each request takes a slot of
/// the key `key_of` picks from it (a tenant from a header, a route, the
/// client's address), and one of the ceiling's, if there is one.
///
/// ```
/// use std::time::Duration;
/// use tower::{ServiceBuilder, ServiceExt};
/// use tower_inflight::keyed::{KeyedConcurrencyLayer, KeyedConfig};
/// use tower_inflight::Config;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// // Requests are (tenant, payload); each tenant gets 2 calls at once.
/// let layer = KeyedConcurrencyLayer::new(
///     KeyedConfig::new(Config::new(2, Duration::from_secs(30))),
///     |request: &(String, u32)| request.0.clone(),
/// );
/// let service = ServiceBuilder::new()
///     .layer(layer)
///     .service_fn(|(_, payload): (String, u32)| async move { Ok::<_, std::convert::Infallible>(payload) });
/// assert_eq!(service.oneshot(("acme".into(), 7)).await.unwrap(), 7);
/// # }
/// ```
#[derive(Clone)]
pub struct KeyedConcurrencyLayer<K, F> {
    pub(super) keyed: KeyedBulkhead<K>,
    key_of: F,
}

impl<K: Hash + Eq + Clone, F> KeyedConcurrencyLayer<K, F> {
    /// A layer with a new keyed bulkhead built from `config`.
    ///
    /// # Panics
    ///
    /// If the configuration is invalid; the message names the field. Build
    /// the bulkhead with [`KeyedBulkhead::try_new`] and use
    /// [`from_bulkhead`](Self::from_bulkhead) to get the error instead.
    #[track_caller]
    pub fn new(config: crate::keyed::KeyedConfig<K>, key_of: F) -> Self {
        Self::from_bulkhead(KeyedBulkhead::new(config), key_of)
    }

    /// A layer over an existing keyed bulkhead.
    pub fn from_bulkhead(keyed: KeyedBulkhead<K>, key_of: F) -> Self {
        Self { keyed, key_of }
    }

    /// The keyed bulkhead shared by every service this layer wraps.
    pub fn bulkhead(&self) -> KeyedBulkhead<K> {
        self.keyed.clone()
    }
}

impl<K, F> fmt::Debug for KeyedConcurrencyLayer<K, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedConcurrencyLayer")
            .field("keyed", &self.keyed)
            .finish_non_exhaustive()
    }
}

impl<S, K, F: Clone> Layer<S> for KeyedConcurrencyLayer<K, F> {
    type Service = KeyedConcurrency<S, K, F>;

    fn layer(&self, inner: S) -> Self::Service {
        KeyedConcurrency {
            inner,
            keyed: self.keyed.clone(),
            key_of: self.key_of.clone(),
        }
    }
}

/// Caps the calls in flight per key, and optionally for all keys together;
/// built by [`KeyedConcurrencyLayer`].
///
/// `poll_ready` is the inner service's readiness alone: the key comes with
/// the request. In `call`, a request whose key has room takes its slots and
/// calls the inner service at once; one that may wait (the per-key or the
/// ceiling's configuration has a `wait` budget) waits in its response
/// future, holding no slot of its own key's until it gets one, with a clone
/// of the ready inner service (which is why it must be `Clone`); any other is
/// shed at once with [`ServiceSaturated`] in a [`BoxError`].
#[derive(Clone)]
pub struct KeyedConcurrency<S, K, F> {
    pub(super) inner: S,
    pub(super) keyed: KeyedBulkhead<K>,
    pub(super) key_of: F,
}

impl<S, K, F> KeyedConcurrency<S, K, F> {
    /// The keyed bulkhead this service takes its slots from.
    pub fn bulkhead(&self) -> &KeyedBulkhead<K> {
        &self.keyed
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: fmt::Debug, K, F> fmt::Debug for KeyedConcurrency<S, K, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedConcurrency")
            .field("inner", &self.inner)
            .field("keyed", &self.keyed)
            .finish_non_exhaustive()
    }
}

impl<S, K, F, Request> Service<Request> for KeyedConcurrency<S, K, F>
where
    S: Service<Request> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    K: Hash + Eq + Clone + Send + Sync + 'static,
    F: Fn(&Request) -> K,
    Request: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = KeyedFuture<S::Future, S::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let key = (self.key_of)(&request);
        let held = match self.keyed.start(&key) {
            Start::Admitted(permit) => {
                return KeyedFuture::new(Kind::called(self.inner.call(request), permit))
            }
            Start::Shed(shed) => return KeyedFuture::new(Kind::refused(shed)),
            Start::Wait(held) => held,
        };
        let mut ready = take_ready(&mut self.inner);
        let keyed = self.keyed.clone();
        KeyedFuture::new(Kind::Waiting {
            future: Box::pin(async move {
                let permit = keyed.acquire_after(&key, held).await?;
                KeyedFuture::new(Kind::called(ready.call(request), permit)).await
            }),
        })
    }
}

type Waiting<T> = Pin<Box<dyn Future<Output = Result<T, BoxError>> + Send>>;

pin_project! {
    /// What the response future of a keyed service is: the inner call
    /// holding its slots, a call waiting for them (`W`, boxed), or a refusal
    /// (`R`) ready at once.
    #[project = KindProj]
    pub(crate) enum Kind<F, W, R> {
        Called { #[pin] future: F, permit: Option<KeyedPermit> },
        Waiting { future: W },
        Refused { refusal: Option<R> },
    }
}

impl<F, W, R> Kind<F, W, R> {
    /// The inner call, holding `permit`'s slots until it is done.
    pub(crate) fn called(future: F, mut permit: KeyedPermit) -> Self {
        permit.ignore_unless_recorded();
        Self::Called {
            future,
            permit: Some(permit),
        }
    }

    pub(crate) fn refused(refusal: R) -> Self {
        Self::Refused {
            refusal: Some(refusal),
        }
    }

    /// What the future is doing, for `Debug`.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::Called { .. } => "called",
            Self::Waiting { .. } => "waiting",
            Self::Refused { .. } => "shed",
        }
    }
}

pin_project! {
    /// Future for [`KeyedConcurrency`]'s responses: the inner call holding
    /// its slots, a call waiting for them, or a shed call that fails at
    /// once.
    pub struct KeyedFuture<F, T> {
        #[pin]
        kind: Kind<F, Waiting<T>, ServiceSaturated>,
    }
}

impl<F, T> KeyedFuture<F, T> {
    fn new(kind: Kind<F, Waiting<T>, ServiceSaturated>) -> Self {
        Self { kind }
    }
}

impl<F, T, E> Future for KeyedFuture<F, T>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    type Output = Result<T, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Called { future, permit } => {
                let output = ready!(future.poll(cx)).map_err(Into::into);
                if let Some(permit) = permit {
                    permit.record_result(output.as_ref());
                }
                // The slots are free as soon as the call is done.
                *permit = None;
                Poll::Ready(output)
            }
            KindProj::Waiting { future } => future.as_mut().poll(cx),
            KindProj::Refused { refusal } => {
                let shed = refusal
                    .take()
                    .expect("`KeyedFuture` polled after completion");
                Poll::Ready(Err(shed.into()))
            }
        }
    }
}

impl<F, T> fmt::Debug for KeyedFuture<F, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedFuture")
            .field("kind", &self.kind.name())
            .finish()
    }
}
