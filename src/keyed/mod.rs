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
//!   evicted (a slot held by a leaked permit counts until it could be
//!   reclaimed); with none idle, the new key's call is shed with
//!   [`ShedReason::TooManyKeys`](crate::ShedReason::TooManyKeys), and
//!   nothing is allocated for it. A new key looks at no more than 128 keys
//!   for one to evict, no key twice, going on from where the last search
//!   stopped (a caller that raced others to make the same key, or a key of
//!   the same hash, may look a second time), so a flood of new keys costs a
//!   bounded amount each: with 128 keys or more busy at once, a new key may
//!   be shed while an idle key lies further on, where the next search looks.
//!   For about a millisecond after a new key is shed so (having looked at
//!   128 busy keys, with more held), a new key looks at 8: while every key
//!   is busy, each new key of a flood costs a sixteenth of a full search,
//!   and the short searches still go round every key, so an idle key is
//!   found by a later one. A search looks under the maps' read locks, and
//!   takes a write lock only to evict the idle key it found: a flood of new
//!   keys while every key is busy holds up no call of an existing key. So
//!   two first calls of one new key that look for room at the same instant
//!   may each evict an idle key for it; the second gives its place back, and
//!   the counts stay exact. (A first call that comes while the key is being
//!   made takes no place.)
//! - **Calls of different keys on different cores rarely meet**: the keys
//!   are spread over several maps, each behind its own lock (up to one map
//!   for every 64 keys of `max_keys`, and up to four for each core).
//!   `max_keys` bounds them all together, and an idle key in any map makes
//!   room for a new key of another: the searches go over the maps in turn.
//!   The key evicted is idle and not used since a search last found it idle
//!   (a second chance): roughly the least recently used.
//! - **Waiting, in turns**: a caller waits for its key's slot (the per-key
//!   `wait`), then, holding it, for the ceiling's (the ceiling's `wait`). In
//!   the ceiling's line the keys waiting take turns, weighted
//!   ([`KeyedConfig::weight_per_key`]) as in fair queuing: a key with a
//!   thousand callers waiting and a key with one are served alternately, a
//!   key of weight 2 is served twice for once, and a key that comes late
//!   starts where the turns are, neither ahead of the keys that waited nor
//!   behind a busy key's backlog.
//! - **Guaranteed shares, with borrowing**: a key may be promised a share of
//!   the ceiling ([`KeyedConfig::guarantee_per_key`]). While others are
//!   idle, a busy key uses more than its share (up to its own limit); a
//!   caller that comes to the ceiling's line while its key is below its
//!   share gets the next slot freed, ahead of everyone (nothing running is
//!   preempted).
//! - **Metrics**: none per key by default (their number is unbounded); the
//!   ceiling, a plain bulkhead, reports as any bulkhead does. The keys
//!   [`KeyedConfig::metrics_per_key`] names report as bulkheads of their own,
//!   64 labels at most. Per-key figures are in [`KeyedBulkhead::status`], for
//!   the busiest keys.
//!
//! [`KeyedConcurrencyLayer`] puts a keyed bulkhead in a tower stack, with a
//! function that picks the key from the request; with feature `http`,
//! `KeyedHttpConcurrencyLayer` does it for HTTP services (the key picked
//! from the request's head, `503` with `Retry-After` for a request shed,
//! the slots held until the response body ends).

mod bulkhead;
#[cfg(feature = "http")]
mod http;
mod key;
mod keys;
mod layer;
#[cfg(all(test, tower_inflight_loom))]
mod loom_models;
mod shards;
mod status;
mod turns;

pub use bulkhead::{KeyedBulkhead, KeyedConfig, KeyedPermit};
#[cfg(feature = "http")]
pub use http::{KeyedHttpConcurrency, KeyedHttpConcurrencyLayer, KeyedHttpFuture};
pub use layer::{KeyedConcurrency, KeyedConcurrencyLayer, KeyedFuture};
pub use status::{KeyStatus, KeyedStatus};
