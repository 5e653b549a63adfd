//! The tower middleware: the layer, the service and its response future,
//! the readiness contract they share with the HTTP service, and the
//! classified variant that gives each request a ticket.
//!
//! Built on the bulkhead's handle and permits; never on the slot table.

mod admission;
mod classified;
mod future;
mod layer;
#[cfg(all(test, tower_inflight_loom))]
mod loom_models;
mod readiness;
mod service;

pub use classified::{Classified, ClassifiedFuture, ClassifiedLayer};
pub use future::ResponseFuture;
pub use layer::ConcurrencyLayer;
pub use service::Concurrency;

pub(crate) use admission::{admit, Parked, TicketAdmission};
pub(crate) use readiness::{take_ready, Readiness};
