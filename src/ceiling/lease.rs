//! What a call holds of a ceiling while it runs.

/// A call's place under a [`Ceiling`](crate::ceiling::Ceiling), held by its
/// permit beside its local slots. Dropping it gives the place back: a
/// permit's drop drops its lease first, then frees its slots, so that a
/// local caller handed the slots asks for its own lease after this one is
/// given back.
///
/// `Option<L>` is a lease too: `None` for a call admitted holding nothing
/// of the ceiling (its store away, and its policy to admit anyway).
pub trait Lease: Send + Sync + 'static {
    /// Whether the lease may have run out by now, and another caller taken
    /// its place. Asked of a lease granted to a service polled ready, just
    /// before its call: a lapsed one sheds the call with
    /// [`ShedReason::ClusterLimit`](crate::ShedReason::ClusterLimit), and
    /// the lease and the slots go back. `false` by default: a lease that
    /// holds until it is given back.
    fn lapsed(&self) -> bool {
        false
    }
}

impl<L: Lease> Lease for Option<L> {
    fn lapsed(&self) -> bool {
        self.as_ref().is_some_and(L::lapsed)
    }
}
