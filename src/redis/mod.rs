//! One ceiling for the whole fleet: a cap on calls in flight across every
//! replica, kept in Redis (feature `redis`).
//!
//! A bulkhead caps its own process. Four replicas with a `limit` of 25 let
//! 100 calls at the dependency, and an autoscaler that adds replicas in an
//! incident adds load to the dependency that is struggling. A
//! [`ClusterCeiling`] given to [`Config::cluster_ceiling`](crate::Config::cluster_ceiling)
//! caps them together.
//!
//! It is one implementation of [`Ceiling`](crate::ceiling::Ceiling): the
//! bulkhead's side (the local slot first, both or neither, the `wait`
//! budget as a deadline, `close` and `cancel_waiting` turning away the
//! callers asking, a lapsed lease shedding its call) is the same on any
//! store. What is Redis's own is here: the script, the pending releases,
//! renewal, [`WhenUnreachable`], and [`ClusterStatus`] in
//! [`Status::cluster`](crate::Status::cluster).
//!
//! # How a call is admitted
//!
//! 1. The local bulkhead first: a full process sheds (or waits) as ever,
//!    without a round trip.
//! 2. Then a lease: one script on Redis drops the leases that have run out,
//!    and adds this call's if fewer than the ceiling are held and no
//!    replica waiting with fewer leases for its weight needs the place
//!    (see [fair shares](#fair-shares)). A refused
//!    lease gives the local slot back (both or neither), and the call is
//!    shed with [`ShedReason::ClusterLimit`](crate::ShedReason::ClusterLimit),
//!    or, with a `wait` budget, asks again within it, holding its local slot
//!    meanwhile (so a replica never has more callers asking Redis than its
//!    own limit).
//! 3. The permit holds both. Dropping it adds the lease's release to the
//!    replica's pending releases and frees the local slot. Every lease
//!    request carries the pending releases no other command carries, and
//!    the newest few (so a caller's next call does not find its own last
//!    lease held, but in a burst), and a background task sends them when no
//!    request comes.
//!
//! A service polled ready holds its slot and lease until its `call`: if the
//! lease may have run out by then, the call is shed and both go back.
//!
//! Leases live in one sorted set per ceiling name: member a token per permit
//! (the bulkhead's random id, then a random part), score the lease's
//! deadline on the Redis server's clock (so client clocks never matter).
//! Below zero, the same key keeps what fair shares need. A lease whose holder never releases it (a replica
//! killed, a network split) runs out after [`ClusterCeiling::lease`] and is
//! reclaimed by the next caller that asks. A release removes only its own
//! token: a late one never frees anyone else's lease.
//!
//! # Fair shares
//!
//! Replicas asking for more than the ceiling share it, each in proportion
//! to its [`weight`](ClusterCeiling::weight) (1 by default), and a replica
//! that asks for less leaves the rest to the others. Each bulkhead has a
//! random id, the first 16 characters of its tokens; beside the leases, the
//! ceiling's one key counts the leases each replica holds, and marks the
//! replicas refused since their last grant, in line by their leases for
//! their weights, each for a short window (25 ms, or two of its round trips
//! and 8 ms, up to 1 s). A free place is kept for each waiting replica
//! ahead of the one asking: with fewer leases for its weight, or as few and
//! before it in an order of the replicas shuffled every 100 ms. So a place
//! freed by a replica over its share goes to a replica under its own on its
//! next ask, a replica that starts late (or comes back after an outage) is
//! first in line, and where the ceiling does not divide evenly the extra
//! places go round. A place is kept only for a replica refused within its
//! window: one that stops asking keeps a place idle for that long at most.
//!
//! It is all in the one key and its one script: a lease is still granted
//! only while fewer than the ceiling are held, a release removes only its
//! own token, a request sent again (a redirection) takes nothing twice, and
//! a refusal writes only the first time in a window. The script reads the
//! waiting replicas in line up to the one asking, 32 at most: none while
//! nobody waits, and none while each replica holds its share.
//!
//! # When Redis is slow or away
//!
//! Each command has a [`timeout`](ClusterCeiling::timeout). A call whose
//! command fails or times out follows [`WhenUnreachable`]: admit under the
//! local limit alone (the default), shed with
//! [`ShedReason::ClusterUnavailable`](crate::ShedReason::ClusterUnavailable), or admit
//! under a smaller local limit. Then, for [`backoff`](ClusterCeiling::backoff),
//! calls skip Redis and do the same without paying the timeout; after it, one
//! call asks again. A permit always releases to where it was granted.
//!
//! Leases are asked for with Tokio's timers and a task of the bulkhead's
//! own: a bulkhead with a ceiling needs a Tokio runtime (with its time
//! driver) wherever it takes permits through `acquire` or a layer; the
//! connection and the task live in the runtime that first asks Redis (made
//! again in another if it shuts down), so keep it running. Redis 5 or
//! later: a single node or a primary with replicas
//! ([`ClusterCeiling::new`]), a Redis Cluster ([`ClusterCeiling::cluster`]:
//! the ceiling's one key has its name as hash tag, so it lives in one
//! slot), or the primary Sentinel names ([`ClusterCeiling::sentinel`],
//! found again after a failover).
//!
//! The calls that may never wait for a round trip
//! ([`Bulkhead::try_acquire`](crate::Bulkhead::try_acquire) and its kin)
//! cannot ask Redis, so they are answered as if it were away, except that
//! only `FailOpen` admits them: the places under `LocalLimit` are for while
//! Redis is away.
//!
//! # What the ceiling does not promise
//!
//! It is a ceiling, not a lock:
//! - A Redis failover with asynchronous replication (Sentinel's, or a Redis
//!   Cluster's) can lose recent leases, and a deleted key loses them all:
//!   until they would have ended, the fleet can admit more than the
//!   ceiling, never more than the sum of the replicas' local limits.
//! - A holder that pauses (a long GC, a stopped VM) past its lease loses it
//!   to the next caller, and is not fenced: when it resumes, both run.
//! - While Redis is unreachable, the ceiling is what [`WhenUnreachable`] says.

mod ceiling;
mod cluster;
mod connection;
mod fallback;
mod releases;
mod script;
mod status;

pub use ceiling::{ClusterCeiling, WhenUnreachable};
pub use status::ClusterStatus;
