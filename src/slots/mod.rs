//! The slots: one admission count, the truth of how many are held, and a
//! dated ledger of who holds them since when.
//!
//! - **The count** (see `admission`) is one atomic word holding the slots
//!   held and the limit in force. A claim of `w` slots adds `w` to it by one
//!   compare-and-exchange, if that keeps it within the limit: all or
//!   nothing, as in tokio's semaphore. A shed reads it and goes. The limit
//!   can move while calls are in flight: lowering it evicts no one.
//! - **The ledger** (see `ledger`) has twice as many entries as the largest
//!   limit. A claim the count has admitted writes its deadline and a
//!   generation into a free entry, found by a short probe from where its
//!   thread starts: at most half the entries are ever held, so a probe
//!   finds one in a step or two at any limit. Release compares-and-exchanges
//!   the exact word it wrote back to free, and only then gives its count
//!   back, so a late release after a reclaim frees nothing of anyone else's.
//! - **Reclaim** sweeps the ledger for entries past their deadline, and
//!   gives back their count. It runs only when the count says full and the
//!   earliest deadline the last sweep saw has come: known in one load,
//!   since with one `reclaim_after` the claims made after a sweep expire
//!   after every claim it saw.
//!
//! The invariant: the count is at least the weight of the entries held, so
//! every admitted claim finds a free entry, and a count given back is
//! always one that was taken.
//!
//! With a byte budget, each entry also records the bytes its holder reserved
//! (see `bytes`), so that a reclaim gives them back too.

mod admission;
mod bytes;
mod claim;
mod ledger;
mod table;

pub(crate) use bytes::{ByteBudget, MAX_BYTES};
pub(crate) use claim::Claim;
pub(crate) use ledger::MAX_DEADLINE;
pub(crate) use table::{SlotTable, MAX_SLOTS};
