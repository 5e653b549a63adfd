//! The bulkhead: the handle users hold, the state its clones share (the
//! claim path and its bookkeeping), the permits that hold slots, the future
//! of a caller that waits, and the clock that dates claims.
//!
//! It is built on the slot table (`slots`), the line of waiting callers
//! (`wait`) and the observer (`observe`). The tower and HTTP layers are
//! built on it, and never reach past it to the slots.

mod acquire;
mod clock;
mod drain;
mod handle;
mod leasing;
mod permit;
mod shared;

pub use acquire::Acquire;
// Public with feature `test-util`; the crate's own tests use it anyway.
#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
pub use clock::ManualClock;
pub use handle::{Bulkhead, DrainTimedOut};
pub use permit::{BorrowedPermit, ByteReservation, Permit};

pub(crate) use clock::{max_reclaim_after, Clock};
pub(crate) use leasing::{Leases, Leasing};
pub(crate) use permit::Granted;
pub(crate) use shared::{History, Shared, Started};
