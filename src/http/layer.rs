//! The HTTP layer.

use super::response::ShedResponder;
use super::service::HttpConcurrency;
use crate::bulkhead::Bulkhead;
use crate::config::{Config, ConfigError};
use crate::error::ServiceSaturated;
use crate::ticket::Ticket;
use bytes::Bytes;
use http::request::Parts;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tower_layer::Layer;

/// Wraps `http::Request` services in an [`HttpConcurrency`] bulkhead.
///
/// Like [`ConcurrencyLayer`](crate::ConcurrencyLayer), every service it wraps
/// shares its one [`Bulkhead`], so the limit holds across the per-connection
/// services a server builds. See the [module docs](super) for what it
/// answers, and when.
///
/// ```
/// use std::time::Duration;
/// use axum::{routing::get, Router};
/// use tower_inflight::{http::HttpConcurrencyLayer, Config};
///
/// let layer = HttpConcurrencyLayer::new(Config::new(32, Duration::from_secs(30)))
///     .retry_after(Duration::from_secs(5))
///     .on_shed(|shed| {
///         let mut response = http::Response::new(bytes::Bytes::from_static(b"{\"error\":\"busy\"}"));
///         *response.status_mut() = shed.http_status();
///         response
///     });
/// let bulkhead = layer.bulkhead();
/// let app: Router = Router::new().route("/", get(|| async { "hello" })).layer(layer);
/// # let _ = (app, bulkhead);
/// ```
#[derive(Clone)]
pub struct HttpConcurrencyLayer {
    bulkhead: Bulkhead,
    settings: Arc<Settings>,
}

/// What the HTTP layer adds to the bulkhead's own configuration.
#[derive(Clone, Default)]
pub(crate) struct Settings {
    pub(crate) max_body: Option<u64>,
    pub(crate) retry_after: Option<Duration>,
    pub(crate) on_shed: Option<ShedResponder>,
    /// Each request's ticket; `None`: every request is a plain one, and
    /// waiting happens in `poll_ready`.
    pub(crate) classify: Option<Classifier>,
}

/// What gives a request its ticket, seeing it before its body is read.
pub(crate) type Classifier = Arc<dyn Fn(&Parts) -> Ticket + Send + Sync>;

impl HttpConcurrencyLayer {
    /// A layer with a new bulkhead built from `config`.
    ///
    /// # Panics
    ///
    /// If the configuration is invalid; the message names the field. Use
    /// [`try_new`](Self::try_new) to get the error instead.
    #[track_caller]
    pub fn new(config: Config) -> Self {
        Self::from_bulkhead(Bulkhead::new(config))
    }

    /// A layer with a new bulkhead built from `config`, or the field of the
    /// configuration that is wrong.
    pub fn try_new(config: Config) -> Result<Self, ConfigError> {
        Bulkhead::try_new(config).map(Self::from_bulkhead)
    }

    /// A layer over an existing bulkhead.
    pub fn from_bulkhead(bulkhead: Bulkhead) -> Self {
        Self {
            bulkhead,
            settings: Arc::default(),
        }
    }

    /// The bulkhead shared by every service this layer wraps.
    pub fn bulkhead(&self) -> Bulkhead {
        self.bulkhead.clone()
    }

    /// Caps each request body at `max_body` bytes: a larger `Content-Length`
    /// is answered `413 Payload Too Large` without taking a slot, and with a
    /// byte budget, a request of unknown length reserves `max_body`. Without
    /// it, the cap is the byte budget ([`Config::max_bytes`]), if any; with
    /// both, the smaller: a body over the whole budget could never be
    /// reserved, so it gets `413`, not a `503` that invites retries.
    pub fn max_body(mut self, max_body: u64) -> Self {
        Arc::make_mut(&mut self.settings).max_body = Some(max_body);
        self
    }

    /// The `Retry-After` of a `503`, in place of the bulkhead's
    /// [`Config::retry_after`]; rounded up to whole seconds, at least one.
    pub fn retry_after(mut self, retry_after: Duration) -> Self {
        Arc::make_mut(&mut self.settings).retry_after = Some(retry_after);
        self
    }

    /// Builds the response to a shed request instead of the default `503`
    /// with `Retry-After` and a line of text.
    pub fn on_shed<F>(mut self, respond: F) -> Self
    where
        F: Fn(&ServiceSaturated) -> http::Response<Bytes> + Send + Sync + 'static,
    {
        Arc::make_mut(&mut self.settings).on_shed = Some(Arc::new(respond));
        self
    }

    /// Gives each request a [`Ticket`] (a priority in the line of waiting
    /// callers, and a weight in slots) from its method, URI, headers and
    /// extensions, before its body is read.
    ///
    /// With a classifier, the service waits in its response future rather
    /// than in `poll_ready`, since the ticket is known only with the
    /// request; see [`Classified`](crate::Classified) for what that means.
    ///
    /// ```
    /// use std::time::Duration;
    /// use axum::{routing::get, Router};
    /// use tower_inflight::{http::HttpConcurrencyLayer, Config, QueueOrder, Ticket};
    ///
    /// let layer = HttpConcurrencyLayer::new(
    ///     Config::new(32, Duration::from_secs(30))
    ///         .wait(Duration::from_millis(100))
    ///         .queue_order(QueueOrder::PriorityFifo),
    /// )
    /// .classify(|parts| {
    ///     if parts.uri.path().starts_with("/reports") {
    ///         Ticket::new().priority(10).weight(4) // heavy, and it can wait
    ///     } else {
    ///         Ticket::new()
    ///     }
    /// });
    /// let app: Router = Router::new()
    ///     .route("/", get(|| async { "hello" }))
    ///     .route("/reports/daily", get(|| async { "report" }))
    ///     .layer(layer);
    /// # let _ = app;
    /// ```
    pub fn classify<F>(mut self, classify: F) -> Self
    where
        F: Fn(&Parts) -> Ticket + Send + Sync + 'static,
    {
        Arc::make_mut(&mut self.settings).classify = Some(Arc::new(classify));
        self
    }

    /// Takes each request's [`Ticket`] from its extensions, where a
    /// middleware in front of this layer put it (after authentication, say),
    /// or the default ticket if there is none. A classifier of its own, as
    /// [`classify`](Self::classify) describes.
    ///
    /// ```
    /// use std::time::Duration;
    /// use axum::{extract::Request, middleware::{self, Next}, routing::get, Router};
    /// use tower_inflight::{http::HttpConcurrencyLayer, Config, QueueOrder, Ticket};
    ///
    /// async fn tag_batch_clients(mut request: Request, next: Next) -> axum::response::Response {
    ///     if request.headers().contains_key("x-batch") {
    ///         request.extensions_mut().insert(Ticket::new().priority(10));
    ///     }
    ///     next.run(request).await
    /// }
    ///
    /// let bulkhead = HttpConcurrencyLayer::new(
    ///     Config::new(32, Duration::from_secs(30))
    ///         .wait(Duration::from_millis(100))
    ///         .queue_order(QueueOrder::PriorityFifo),
    /// )
    /// .ticket_from_extensions();
    /// let app: Router = Router::new()
    ///     .route("/", get(|| async { "hello" }))
    ///     .layer(bulkhead)
    ///     .layer(middleware::from_fn(tag_batch_clients)); // runs first
    /// # let _ = app;
    /// ```
    pub fn ticket_from_extensions(self) -> Self {
        self.classify(|parts| {
            parts
                .extensions
                .get::<Ticket>()
                .copied()
                .unwrap_or_default()
        })
    }
}

impl<S> Layer<S> for HttpConcurrencyLayer {
    type Service = HttpConcurrency<S>;

    fn layer(&self, inner: S) -> Self::Service {
        HttpConcurrency::new(inner, self.bulkhead.clone(), self.settings.clone())
    }
}

impl fmt::Debug for HttpConcurrencyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpConcurrencyLayer")
            .field("bulkhead", &self.bulkhead)
            .field("settings", &self.settings)
            .finish()
    }
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
            .field("max_body", &self.max_body)
            .field("retry_after", &self.retry_after)
            .field("on_shed", &self.on_shed.is_some())
            .field("classify", &self.classify.is_some())
            .finish()
    }
}
