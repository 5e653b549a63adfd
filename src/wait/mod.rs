//! Waiting for a slot: the line of parked callers and its orders, CoDel's
//! cut of waits while the line stands, and the saturation signal that stops
//! waits that would expire.
//!
//! It hands slots of the slot table to parked callers; it knows nothing of
//! the bulkhead built on it.

mod codel;
mod line;
mod movable;
mod order;
mod saturation;
mod waiters;

pub use order::{Comparator, QueueOrder, WaitingCall};

pub(crate) use codel::{Codel, CodelSettings};
pub(crate) use line::{Line, Place};
pub(crate) use movable::MovablePlace;
pub(crate) use saturation::{SaturationSignal, Thresholds, Verdict, WaitEnd};
pub(crate) use waiters::{Arrival, Left, Node, Waiters};
