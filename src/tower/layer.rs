//! The tower layer.

use crate::bulkhead::Bulkhead;
use crate::config::{Config, ConfigError};
use crate::ticket::Ticket;
use crate::tower::{ClassifiedLayer, Concurrency};
use tower_layer::Layer;

/// Wraps services in a [`Concurrency`] bulkhead.
///
/// Every service the layer wraps, and every clone of them, shares the one
/// [`Bulkhead`] the layer holds: that is what makes the limit hold on a server
/// that builds a service per connection.
///
/// ```
/// use std::time::Duration;
/// use tower::ServiceBuilder;
/// use tower_inflight::{Config, ConcurrencyLayer};
///
/// let layer = ConcurrencyLayer::new(Config::new(25, Duration::from_secs(30)).name("payments"));
/// let bulkhead = layer.bulkhead(); // for dashboards: in_flight(), waiting(), ...
/// let service = ServiceBuilder::new()
///     .layer(layer)
///     .service_fn(|request: u32| async move { Ok::<_, std::convert::Infallible>(request) });
/// # let _ = (service, bulkhead);
/// ```
#[derive(Clone, Debug)]
pub struct ConcurrencyLayer {
    bulkhead: Bulkhead,
}

impl ConcurrencyLayer {
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

    /// A layer over an existing bulkhead, for a limit shared by several
    /// services or stacks.
    pub fn from_bulkhead(bulkhead: Bulkhead) -> Self {
        Self { bulkhead }
    }

    /// The bulkhead shared by every service this layer wraps.
    pub fn bulkhead(&self) -> Bulkhead {
        self.bulkhead.clone()
    }

    /// A layer whose calls each carry a [`Ticket`] chosen from the request
    /// by `classify`: a priority for the line of waiting callers (with a
    /// [`QueueOrder`](crate::QueueOrder) that looks at it) and a weight in
    /// slots. Waiting happens in the response future rather than in
    /// `poll_ready`, since the ticket is known only with the request: see
    /// [`Classified`](crate::Classified).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower::{Service, ServiceBuilder, ServiceExt};
    /// use tower_inflight::{ConcurrencyLayer, Config, QueueOrder, Ticket};
    ///
    /// enum Job { Lookup(u32), Report }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let layer = ConcurrencyLayer::new(
    ///     Config::new(8, Duration::from_secs(30))
    ///         .wait(Duration::from_millis(50))
    ///         .queue_order(QueueOrder::PriorityFifo),
    /// )
    /// .classify(|job: &Job| match job {
    ///     Job::Lookup(_) => Ticket::new(),                     // interactive: first in line
    ///     Job::Report => Ticket::new().priority(10).weight(4), // batch: heavy, and it can wait
    /// });
    /// let mut service = ServiceBuilder::new()
    ///     .layer(layer)
    ///     .service_fn(|job: Job| async move {
    ///         Ok::<_, std::convert::Infallible>(matches!(job, Job::Report))
    ///     });
    /// assert!(service.ready().await.unwrap().call(Job::Report).await.unwrap());
    /// # }
    /// ```
    pub fn classify<F, Request>(self, classify: F) -> ClassifiedLayer<F>
    where
        F: Fn(&Request) -> Ticket + Clone,
    {
        ClassifiedLayer::new(self.bulkhead, classify)
    }
}

impl<S> Layer<S> for ConcurrencyLayer {
    type Service = Concurrency<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Concurrency::new(inner, self.bulkhead.clone())
    }
}
