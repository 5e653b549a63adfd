//! The permit: one held slot, given back when dropped.

use crate::bulkhead::Shared;
use crate::slots::Claim;
use crate::sync::Arc;
use std::fmt;

/// One slot of a [`Bulkhead`](crate::Bulkhead), held until the permit is
/// dropped.
///
/// A permit is `Send` and `'static`: move it into a spawned task or a
/// response body so that the slot lives exactly as long as the work it stands
/// for. Dropping it frees the slot at once, or hands it to the longest-waiting
/// caller. A permit that is never dropped (`mem::forget`, a leaked future)
/// holds its slot only until `reclaim_after`; after that, its drop does
/// nothing, so it can never free a slot that has been handed to someone else.
#[must_use = "the slot is released as soon as the permit is dropped"]
pub struct Permit {
    shared: Arc<Shared>,
    claim: Claim,
}

impl Permit {
    pub(crate) fn new(shared: Arc<Shared>, claim: Claim) -> Self {
        Self { shared, claim }
    }

    /// Whether this slot was reclaimed from an earlier holder that kept it
    /// past `reclaim_after` without releasing it: a leak, or a
    /// `reclaim_after` shorter than your slowest legitimate call.
    pub fn was_reclaimed(&self) -> bool {
        self.claim.reclaimed
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.shared.release(&self.claim);
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("slot", &self.claim.index)
            .field("bulkhead", &self.shared.config().name.as_deref())
            .finish()
    }
}
