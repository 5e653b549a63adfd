//! What a keyed bulkhead reports.

use crate::observe::{Status, Totals};

/// A snapshot of a [`KeyedBulkhead`](crate::keyed::KeyedBulkhead), from
/// [`status`](crate::keyed::KeyedBulkhead::status).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct KeyedStatus<K> {
    /// Keys held now.
    pub keys: usize,
    /// Idle keys evicted to make room for new ones, since the start.
    pub evicted: u64,
    /// Calls with a new key shed with
    /// [`ShedReason::TooManyKeys`](crate::ShedReason::TooManyKeys), since
    /// the start.
    pub refused_new_keys: u64,
    /// The ceiling's own status, if there is a ceiling.
    pub ceiling: Option<Status>,
    /// The busiest keys, the most calls in flight (then waiting) first; only
    /// keys with calls in flight or waiting.
    pub busiest: Vec<KeyStatus<K>>,
}

/// One key's part of a [`KeyedStatus`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct KeyStatus<K> {
    /// The key.
    pub key: K,
    /// Its limit.
    pub limit: usize,
    /// Its slots held now: by its calls in flight, and by its callers that
    /// hold their key's slot and wait for the ceiling's.
    pub in_flight: usize,
    /// Its callers waiting for a slot of its own now.
    pub waiting: usize,
    /// Its totals since its bulkhead was made (a key evicted and seen again
    /// starts afresh).
    pub totals: Totals,
}
