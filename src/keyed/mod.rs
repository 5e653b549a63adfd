//! Bulkheads per key: one tenant, route or host cannot take every slot.
//!
//! One bulkhead protects the dependency, not the callers from each other: a
//! single tenant's burst takes every slot and everyone else is shed. A
//! [`KeyedBulkhead`] keeps a bulkhead per key, made on the key's first call
//! from one [`Config`](crate::Config) (with, if you like, a limit of its own
//! per key), and optionally a ceiling for all keys together: a call takes its
//! key's slot, then one of the ceiling's, both or neither.
//!
//! - **Every promise of a bulkhead holds per key**: leaked slots reclaimed
//!   after `reclaim_after`, late releases that free nothing, no cooldown,
//!   saturation never an error.
//! - **Bounded memory, whatever the keys**: at most `max_keys` keys are
//!   held. A new key evicts one with nothing in flight and nobody waiting
//!   (roughly the least recently used); a key with slots held is never
//!   evicted; with none idle, the new key's call is shed with
//!   [`ShedReason::TooManyKeys`](crate::ShedReason::TooManyKeys), and
//!   nothing is allocated for it.
//! - **Waiting**: a caller waits for its key's slot (the per-key `wait`),
//!   then, holding it, for the ceiling's (the ceiling's `wait`). So a key
//!   has at most its own limit of callers in the ceiling's line, however
//!   many it sends: a key with a thousand callers and a key with one are
//!   served in turn when their limits are 1, and in proportion to their
//!   limits otherwise.
//! - **Metrics**: none per key (their number is unbounded); the ceiling, a
//!   plain bulkhead, reports as any bulkhead does. Per-key figures are in
//!   [`KeyedBulkhead::status`], for the busiest keys.
//!
//! Not yet: guaranteed shares of the ceiling with borrowing, and deficit
//! round robin across the keys waiting for the ceiling.
//!
//! [`KeyedConcurrencyLayer`] puts a keyed bulkhead in a tower stack, with a
//! function that picks the key from the request.

mod bulkhead;
mod keys;
mod layer;
mod status;

pub use bulkhead::{KeyedBulkhead, KeyedConfig, KeyedPermit};
pub use layer::{KeyedConcurrency, KeyedConcurrencyLayer, KeyedFuture};
pub use status::{KeyStatus, KeyedStatus};
