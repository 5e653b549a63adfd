//! The tower layer.

use crate::bulkhead::Bulkhead;
use crate::config::{Config, ConfigError};
use crate::service::Concurrency;
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
}

impl<S> Layer<S> for ConcurrencyLayer {
    type Service = Concurrency<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Concurrency::new(inner, self.bulkhead.clone())
    }
}
