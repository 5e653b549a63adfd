//! The HTTP layer over a keyed bulkhead: a key picked from the request's
//! head, `503` with `Retry-After` for a shed request, the slots held until
//! the response body ends.

use crate::http::body::InFlight;
use crate::http::response::refusal;
use crate::http::ResponseBody;
use crate::keyed::bulkhead::Start;
use crate::keyed::layer::{Kind, KindProj};
use crate::keyed::{KeyedBulkhead, KeyedConcurrency, KeyedConcurrencyLayer, KeyedConfig};
use crate::tower::take_ready;
use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};
use http_body_util::Limited;
use pin_project_lite::pin_project;
use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tower_layer::Layer;
use tower_service::Service;

/// Wraps HTTP services in a [`KeyedHttpConcurrency`]: each request takes a
/// slot of the key `key_of` picks from its head (a header, the route, the
/// client's address from axum's `ConnectInfo` in the extensions) and one of
/// the ceiling's, held until its response body ends; a request shed gets
/// `503 Service Unavailable` with `Retry-After`.
///
/// ```
/// use std::time::Duration;
/// use axum::{routing::get, Router};
/// use tower_inflight::keyed::{KeyedConfig, KeyedHttpConcurrencyLayer};
/// use tower_inflight::Config;
///
/// // Each tenant: 8 requests at once; all tenants together: 64.
/// let tenants = KeyedHttpConcurrencyLayer::new(
///     KeyedConfig::new(Config::new(8, Duration::from_secs(30)).wait(Duration::from_millis(20)))
///         .ceiling(Config::new(64, Duration::from_secs(30)).wait(Duration::from_millis(20))),
///     |head| {
///         head.headers
///             .get("x-tenant")
///             .and_then(|tenant| tenant.to_str().ok())
///             .unwrap_or("anonymous")
///             .to_owned()
///     },
/// );
/// let app: Router = Router::new().route("/", get(|| async { "ok" })).layer(tenants);
/// # let _ = app;
/// ```
#[derive(Clone)]
pub struct KeyedHttpConcurrencyLayer<K, F>(KeyedConcurrencyLayer<K, F>);

impl<K: Hash + Eq + Clone, F: Fn(&Parts) -> K> KeyedHttpConcurrencyLayer<K, F> {
    /// A layer with a new keyed bulkhead built from `config`.
    ///
    /// # Panics
    ///
    /// If the configuration is invalid; the message names the field. Build
    /// the bulkhead with [`KeyedBulkhead::try_new`] and use
    /// [`from_bulkhead`](Self::from_bulkhead) to get the error instead.
    #[track_caller]
    pub fn new(config: KeyedConfig<K>, key_of: F) -> Self {
        Self(KeyedConcurrencyLayer::new(config, key_of))
    }

    /// A layer over an existing keyed bulkhead.
    pub fn from_bulkhead(keyed: KeyedBulkhead<K>, key_of: F) -> Self {
        Self(KeyedConcurrencyLayer::from_bulkhead(keyed, key_of))
    }

    /// The keyed bulkhead shared by every service this layer wraps.
    pub fn bulkhead(&self) -> KeyedBulkhead<K> {
        self.0.bulkhead()
    }
}

impl<K, F> fmt::Debug for KeyedHttpConcurrencyLayer<K, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedHttpConcurrencyLayer")
            .field("keyed", &self.0.keyed)
            .finish_non_exhaustive()
    }
}

impl<S, K, F: Clone> Layer<S> for KeyedHttpConcurrencyLayer<K, F> {
    type Service = KeyedHttpConcurrency<S, K, F>;

    fn layer(&self, inner: S) -> Self::Service {
        KeyedHttpConcurrency(self.0.layer(inner))
    }
}

/// Caps the HTTP requests in flight per key, and optionally for all keys
/// together; built by [`KeyedHttpConcurrencyLayer`].
///
/// `poll_ready` is the inner service's readiness alone: the key comes with
/// the request. A request whose key has room is called at once; one that
/// may wait (a `wait` budget in the per-key or the ceiling's configuration)
/// waits in its response future with a clone of the ready inner service
/// (which is why it must be `Clone`); a request shed is answered
/// `503 Service Unavailable` with `Retry-After` (the configuration's
/// `retry_after`, in whole seconds). Its slots are held until the response
/// body has been produced to its end, or dropped.
///
/// The inner service sees the request body wrapped in
/// [`http_body_util::Limited`], as behind
/// [`HttpConcurrency`](crate::http::HttpConcurrency), so that one inner
/// service takes either layer; no limit is set on it here.
#[derive(Clone)]
pub struct KeyedHttpConcurrency<S, K, F>(KeyedConcurrency<S, K, F>);

impl<S, K, F> KeyedHttpConcurrency<S, K, F> {
    /// The keyed bulkhead this service takes its slots from.
    pub fn bulkhead(&self) -> &KeyedBulkhead<K> {
        self.0.bulkhead()
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        self.0.get_ref()
    }
}

impl<S: fmt::Debug, K, F> fmt::Debug for KeyedHttpConcurrency<S, K, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedHttpConcurrency")
            .field("inner", &self.0.inner)
            .field("keyed", &self.0.keyed)
            .finish_non_exhaustive()
    }
}

impl<S, K, F, ReqBody, ResBody> Service<Request<ReqBody>> for KeyedHttpConcurrency<S, K, F>
where
    S: Service<Request<Limited<ReqBody>>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    K: Hash + Eq + Clone + Send + Sync + 'static,
    F: Fn(&Parts) -> K,
    ReqBody: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = KeyedHttpFuture<S::Future, ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let service = &mut self.0;
        let (parts, body) = request.into_parts();
        let key = (service.key_of)(&parts);
        // The body type `HttpConcurrency` hands on, so that an inner
        // service takes either layer; a keyed bulkhead reserves no bytes,
        // so it is not limited.
        let request = Request::from_parts(parts, Limited::new(body, usize::MAX));
        let held = match service.keyed.start(&key) {
            Start::Admitted(permit) => {
                return KeyedHttpFuture::new(Kind::called(service.inner.call(request), permit))
            }
            Start::Shed(shed) => return KeyedHttpFuture::new(Kind::refused(refusal(&shed))),
            Start::Wait(held) => held,
        };
        let (mut ready, keyed) = (take_ready(&mut service.inner), service.keyed.clone());
        KeyedHttpFuture::new(Kind::Waiting {
            future: Box::pin(async move {
                match keyed.acquire_after(&key, held).await {
                    Ok(permit) => {
                        KeyedHttpFuture::new(Kind::called(ready.call(request), permit)).await
                    }
                    Err(shed) => Ok(refusal(&shed).map(ResponseBody::refusal)),
                }
            }),
        })
    }
}

type Waiting<B, E> = Pin<Box<dyn Future<Output = Result<Response<ResponseBody<B>>, E>> + Send>>;

pin_project! {
    /// Future for [`KeyedHttpConcurrency`]'s responses: the inner call,
    /// whose response body takes over the slots, a request waiting for
    /// them, or a refusal ready at once.
    pub struct KeyedHttpFuture<F, B, E> {
        #[pin]
        kind: Kind<F, Waiting<B, E>, Response<Bytes>>,
    }
}

impl<F, B, E> KeyedHttpFuture<F, B, E> {
    fn new(kind: Kind<F, Waiting<B, E>, Response<Bytes>>) -> Self {
        Self { kind }
    }
}

impl<F, B, E> Future for KeyedHttpFuture<F, B, E>
where
    F: Future<Output = Result<Response<B>, E>>,
    // So that an adaptive limit can tell a timeout's error.
    E: 'static,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Called { future, permit } => {
                let output = ready!(future.poll(cx));
                // On success the body carries the slots on; on error they
                // are freed here.
                let mut permit = permit.take();
                if let Some(permit) = &mut permit {
                    match &output {
                        Ok(response) => permit.record(crate::http::outcome_of(response)),
                        Err(error) => permit.record_error(error),
                    }
                }
                Poll::Ready(output.map(|response| {
                    response.map(|body| ResponseBody::streaming(body, permit.map(InFlight::Keyed)))
                }))
            }
            KindProj::Waiting { future } => future.as_mut().poll(cx),
            KindProj::Refused { refusal: response } => {
                let response = response
                    .take()
                    .expect("`KeyedHttpFuture` polled after completion");
                Poll::Ready(Ok(response.map(ResponseBody::refusal)))
            }
        }
    }
}

impl<F, B, E> fmt::Debug for KeyedHttpFuture<F, B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedHttpFuture")
            .field("kind", &self.kind.name())
            .finish()
    }
}
