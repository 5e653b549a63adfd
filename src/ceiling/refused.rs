//! Why a ceiling gave no lease.

use crate::ShedReason;

/// Why a [`Ceiling`](crate::ceiling::Ceiling) gave a call no lease. The
/// call gives its local slots back and is shed with the matching
/// [`ShedReason`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Refused {
    /// The ceiling is full (and stayed full until the deadline, if the
    /// call had one): [`ShedReason::ClusterLimit`].
    Full,
    /// The ceiling could not be asked (its store is away, or the call may
    /// not wait for a round trip), and its policy is to shed:
    /// [`ShedReason::ClusterUnavailable`].
    Unavailable,
}

impl Refused {
    pub(crate) fn reason(self) -> ShedReason {
        match self {
            Refused::Full => ShedReason::ClusterLimit,
            Refused::Unavailable => ShedReason::ClusterUnavailable,
        }
    }
}
