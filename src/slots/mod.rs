//! The slot table: one atomic word a slot, the whole of the fast path, and
//! the byte budget beside it.
//!
//! It knows nothing of waiting, of tower or of HTTP: it claims, releases and
//! reclaims slots, and records the bytes each holder reserved.

mod budget;
mod bytes;
mod claim;
mod free_map;
mod lanes;
mod table;
mod weighted;

pub(crate) use budget::{ByteBudget, Epoch, Share, MAX_BYTES};
pub(crate) use claim::Claim;
pub(crate) use table::{SlotTable, MAX_DEADLINE, MAX_SLOTS};
