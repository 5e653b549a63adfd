//! What a bulkhead tells about itself: the observer every event passes
//! through, the events handed to a hook, the status snapshot and its
//! per-minute windows, the refusal counters, and (feature `metrics`) the
//! metrics.
//!
//! It depends on nothing but the error and configuration types: the
//! bulkhead calls it, never the other way round.

mod event;
#[cfg(feature = "metrics")]
mod metrics;
mod observer;
mod refusals;
mod status;

pub use event::Event;
pub use status::{Status, Totals, Window};

pub(crate) use event::Hook;
#[cfg(feature = "metrics")]
pub(crate) use metrics::Metrics;
pub(crate) use observer::Observer;
pub(crate) use refusals::Refusals;
pub(crate) use status::Rollups;
