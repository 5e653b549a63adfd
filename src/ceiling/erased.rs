//! A ceiling of any type, as a [`Config`] holds it and a bulkhead asks it.
//!
//! A configuration holds an [`Install`]; each bulkhead built from it
//! installs it once, and asks the [`Admit`] it gets. A user's
//! [`Ceiling`] is both, and every bulkhead shares it. A ceiling of the
//! crate's own may make one [`Admit`] per bulkhead, from that bulkhead's
//! configuration, and report in its status.

use crate::ceiling::{Ceiling, Lease, Refused};
use crate::config::{Config, ConfigError};
use crate::Status;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// A lease, whatever its ceiling.
pub(crate) type HeldLease = Box<dyn Lease>;

/// What a ceiling answers a call: a lease, none needed (`None`: a call
/// admitted holding nothing of the ceiling), or a refusal.
pub(crate) type Leased = Result<Option<HeldLease>, Refused>;

/// A lease being asked for.
pub(crate) type Asking = Pin<Box<dyn Future<Output = Leased> + Send>>;

/// A ceiling as a [`Config`] holds it.
pub(crate) trait Install: fmt::Debug + Send + Sync + 'static {
    /// Checks the ceiling against the rest of `config`.
    fn validate(&self, _config: &Config) -> Result<(), ConfigError> {
        Ok(())
    }

    /// How long a first ask may take past its deadline: a keyed
    /// bulkhead's caller holds its key's slot that much longer.
    fn first_ask(&self) -> Duration {
        Duration::ZERO
    }

    /// The ceiling a bulkhead built from `config` asks.
    fn install(self: Arc<Self>, config: &Config) -> Arc<dyn Admit>;
}

/// A ceiling as a bulkhead asks it (see [`Ceiling`]).
pub(crate) trait Admit: Send + Sync + 'static {
    fn acquire(self: Arc<Self>, deadline: Option<Instant>) -> Asking;

    fn try_acquire(&self) -> Leased;

    /// [`Bulkhead::reset`](crate::Bulkhead::reset): forget what is held.
    fn reset(&self) {}

    /// Adds the ceiling's part to its bulkhead's status.
    fn describe(&self, _status: &mut Status) {}
}

/// A user's ceiling, shared by every bulkhead built from its configuration.
pub(crate) struct Given<C>(pub(crate) C);

impl<C: Ceiling> Install for Given<C> {
    fn install(self: Arc<Self>, _config: &Config) -> Arc<dyn Admit> {
        self
    }
}

impl<C: Ceiling> Admit for Given<C> {
    fn acquire(self: Arc<Self>, deadline: Option<Instant>) -> Asking {
        Box::pin(async move { held(self.0.acquire(deadline).await) })
    }

    fn try_acquire(&self) -> Leased {
        held(self.0.try_acquire())
    }
}

fn held<L: Lease>(leased: Result<L, Refused>) -> Leased {
    leased.map(|lease| Some(Box::new(lease) as HeldLease))
}

impl<C> fmt::Debug for Given<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Ceiling")
            .field(&std::any::type_name::<C>())
            .finish()
    }
}
