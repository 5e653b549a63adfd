//! The cluster ceiling's settings, given to a [`Config`], and what makes
//! of them a ceiling for each bulkhead built from it.

use crate::ceiling::{Admit, Install};
use crate::config::ConfigError;
use crate::redis::cluster::Cluster;
use crate::redis::connection::Store;
use crate::Config;
use std::{fmt, sync::Arc, time::Duration};

impl Config {
    /// A ceiling on calls in flight across every replica, kept in Redis, on
    /// top of this bulkhead's own `limit` (feature `redis`; see
    /// [`redis`](crate::redis)). A call takes a local slot first, then a
    /// lease: both or neither. It is the configuration's
    /// [`ceiling`](Config::ceiling), replacing any given before.
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub fn cluster_ceiling(mut self, ceiling: ClusterCeiling) -> Self {
        self.ceiling = Some(Arc::new(ceiling));
        self
    }
}

/// A ceiling on calls in flight across every replica that shares it: leases
/// in one Redis sorted set, on top of each replica's own limit.
///
/// Give it to [`Config::cluster_ceiling`](crate::Config::cluster_ceiling).
/// Every bulkhead built with the same `name` on the same Redis shares one
/// ceiling of `limit` calls, whichever process it lives in.
///
/// ```
/// use std::time::Duration;
/// use tower_inflight::redis::{ClusterCeiling, WhenUnreachable};
/// use tower_inflight::Config;
///
/// let client = redis::Client::open("redis://127.0.0.1:6379/").unwrap();
/// let config = Config::new(8, Duration::from_secs(30)).cluster_ceiling(
///     ClusterCeiling::new(client, "payments", 20)
///         .when_unreachable(WhenUnreachable::LocalLimit(4)),
/// );
/// # let _ = tower_inflight::Bulkhead::new(config);
/// ```
#[derive(Clone)]
pub struct ClusterCeiling {
    /// Where the leases live: a node, a Redis Cluster, or Sentinel's primary.
    pub(super) store: Store,
    pub(crate) name: Arc<str>,
    pub(crate) limit: usize,
    pub(crate) lease: Option<Duration>,
    pub(crate) renew: bool,
    pub(crate) weight: u32,
    pub(crate) timeout: Duration,
    pub(crate) backoff: Duration,
    pub(crate) when_unreachable: WhenUnreachable,
}

/// What a bulkhead does while its cluster ceiling's Redis cannot be reached
/// (a command failed or took longer than
/// [`timeout`](ClusterCeiling::timeout)), and for the calls that may not
/// wait for a round trip at all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum WhenUnreachable {
    /// Admit under the local limit alone (the default): Redis failing never
    /// fails a call, and each replica still holds its own limit.
    #[default]
    FailOpen,
    /// Shed every call with
    /// [`ShedReason::ClusterUnavailable`](crate::ShedReason::ClusterUnavailable).
    FailClosed,
    /// Admit under a smaller local limit: at most this many calls of this
    /// bulkhead hold no lease at once (a share of the ceiling, such as the
    /// ceiling divided by the number of replicas); past it, shed with
    /// [`ShedReason::ClusterUnavailable`](crate::ShedReason::ClusterUnavailable).
    LocalLimit(usize),
}

/// The longest lease a ceiling takes: a year, in milliseconds of the Redis
/// server's clock.
const MAX_LEASE: Duration = Duration::from_secs(365 * 86_400);
/// The longest a command may take before Redis counts as unreachable.
const MAX_TIMEOUT: Duration = Duration::from_secs(60);
/// The largest weight. A waiting replica's place in line is its leases
/// over its weight, less 2^41, where a double's step is 2^-11: one lease
/// more, over a weight of at most 1,000, still moves it by more than a step.
const MAX_WEIGHT: u32 = 1_000;
/// The longest Redis is skipped after a failure.
const MAX_BACKOFF: Duration = Duration::from_secs(3_600);

impl ClusterCeiling {
    /// A ceiling of `limit` calls for every bulkhead named `name` on the
    /// Redis that `client` reaches. The connection is made on the first call
    /// that needs it, and remade in the background when it drops.
    ///
    /// The leases live under the key `tower-inflight:{name}:leases`; the
    /// braces make it a hash tag (see [`cluster`](Self::cluster)).
    pub fn new(client: ::redis::Client, name: impl Into<Arc<str>>, limit: usize) -> Self {
        Self::on(Store::Node(client), name, limit)
    }

    /// A ceiling of `limit` calls for every bulkhead named `name` on the
    /// Redis Cluster that `client` reaches.
    ///
    /// The ceiling's one key, `tower-inflight:{name}:leases`, has `name` as
    /// its hash tag, so it lives in one slot on one primary, and each lease
    /// is one script there. The connection is made on the first call that
    /// needs it; it follows `MOVED` and `ASK` redirections (a slot being
    /// migrated, a replica promoted) and refreshes its map of slots, within
    /// each command's [`timeout`](Self::timeout), which replaces the
    /// `client`'s own connection and response timeouts.
    ///
    /// A cluster failover (a primary lost, its replica promoted) can lose
    /// the leases granted last, as a Sentinel failover can: see
    /// [what the ceiling does not promise](crate::redis#what-the-ceiling-does-not-promise).
    ///
    /// ```
    /// use std::time::Duration;
    /// use redis::cluster::ClusterClient;
    /// use tower_inflight::redis::ClusterCeiling;
    /// use tower_inflight::Config;
    ///
    /// let client = ClusterClient::new(vec![
    ///     "redis://10.0.0.1:6379/",
    ///     "redis://10.0.0.2:6379/",
    ///     "redis://10.0.0.3:6379/",
    /// ])
    /// .unwrap();
    /// let config = Config::new(8, Duration::from_secs(30))
    ///     .cluster_ceiling(ClusterCeiling::cluster(client, "payments", 20));
    /// # let _ = tower_inflight::Bulkhead::new(config);
    /// ```
    pub fn cluster(
        client: ::redis::cluster::ClusterClient,
        name: impl Into<Arc<str>>,
        limit: usize,
    ) -> Self {
        Self::on(Store::Cluster(Box::new(client)), name, limit)
    }

    /// A ceiling of `limit` calls for every bulkhead named `name` on the
    /// primary that Redis Sentinel names: `client` holds the sentinels'
    /// addresses and the primary's name, and must be built for
    /// [`SentinelServerType::Master`](::redis::sentinel::SentinelServerType::Master)
    /// (leases are written).
    ///
    /// The first call that needs it asks the sentinels for the primary and
    /// connects to it (checking its role). When a command there fails (the
    /// primary gone, or demoted and answering `READONLY`) or goes
    /// unanswered until its [`timeout`](Self::timeout), the next command
    /// asks the sentinels again: after a failover, the ceiling is back once
    /// the sentinels name the promoted replica and the
    /// [`backoff`](Self::backoff) has passed. Meanwhile calls follow
    /// [`when_unreachable`](Self::when_unreachable).
    ///
    /// Replication is asynchronous: a failover can lose the leases granted
    /// last, and while the calls holding them run, the fleet may admit more
    /// than the ceiling, never more than the sum of the replicas' local
    /// limits (see
    /// [what the ceiling does not promise](crate::redis#what-the-ceiling-does-not-promise)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use redis::sentinel::{SentinelClient, SentinelServerType};
    /// use tower_inflight::redis::ClusterCeiling;
    /// use tower_inflight::Config;
    ///
    /// let sentinels = vec![
    ///     "redis://10.0.0.1:26379/",
    ///     "redis://10.0.0.2:26379/",
    ///     "redis://10.0.0.3:26379/",
    /// ];
    /// let client = SentinelClient::build(
    ///     sentinels,
    ///     String::from("mymaster"),
    ///     None,
    ///     SentinelServerType::Master,
    /// )
    /// .unwrap();
    /// let config = Config::new(8, Duration::from_secs(30))
    ///     .cluster_ceiling(ClusterCeiling::sentinel(client, "payments", 20));
    /// # let _ = tower_inflight::Bulkhead::new(config);
    /// ```
    pub fn sentinel(
        client: ::redis::sentinel::SentinelClient,
        name: impl Into<Arc<str>>,
        limit: usize,
    ) -> Self {
        let client = Arc::new(tokio::sync::Mutex::new(client));
        Self::on(Store::Sentinel(client), name, limit)
    }

    fn on(store: Store, name: impl Into<Arc<str>>, limit: usize) -> Self {
        Self {
            store,
            name: name.into(),
            limit,
            lease: None,
            renew: false,
            weight: 1,
            timeout: Duration::from_millis(100),
            backoff: Duration::from_secs(1),
            when_unreachable: WhenUnreachable::FailOpen,
        }
    }

    /// How long a lease lasts if its holder never releases it (a replica
    /// killed, a network split): the slot comes back to the fleet after this
    /// long. Defaults to the bulkhead's `reclaim_after`.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Renews each lease while its permit lives, every third of a lease, up
    /// to the bulkhead's `reclaim_after`: with a short
    /// [`lease`](Self::lease), a killed replica's slots come back quickly
    /// while long calls keep theirs. Off by default.
    ///
    /// A renewal needs Redis within two thirds of a lease: through a
    /// longer stall or network split, the lease runs out while its call
    /// goes on, and another replica may be granted its place. Take a lease
    /// longer than the longest stall you expect of Redis.
    pub fn renew(mut self, renew: bool) -> Self {
        self.renew = renew;
        self
    }

    /// This replica's weight in sharing the ceiling (1 by default, at most
    /// 1,000). While replicas ask for more than the ceiling, each gets
    /// places in proportion to its weight: one of weight 2 beside two of
    /// weight 1 gets half. A replica that asks for less than its share
    /// leaves the rest to the others. See
    /// [fair shares](crate::redis#fair-shares).
    pub fn weight(mut self, weight: u32) -> Self {
        self.weight = weight;
        self
    }

    /// How long a command to Redis may take before Redis counts as
    /// unreachable for this call (100 ms by default). A lease that may have
    /// been granted after the timeout is released.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// After a failure, how long calls skip Redis and follow
    /// [`when_unreachable`](Self::when_unreachable) instead of each paying
    /// the timeout (1 s by default). Then one call asks Redis again; the
    /// others keep skipping until it has an answer.
    pub fn backoff(mut self, backoff: Duration) -> Self {
        self.backoff = backoff;
        self
    }

    /// What to do while Redis cannot be reached; see [`WhenUnreachable`].
    pub fn when_unreachable(mut self, when: WhenUnreachable) -> Self {
        self.when_unreachable = when;
        self
    }

    /// The ceiling's one key, a sorted set: its leases are the members with
    /// a positive score (their deadlines; `ZCOUNT key (0 +inf` counts them),
    /// beside what fair shares need (see [fair shares](crate::redis#fair-shares)).
    pub fn key(&self) -> String {
        format!("tower-inflight:{{{}}}:leases", self.name)
    }

    /// The lease, once the bulkhead's `reclaim_after` is known.
    pub(crate) fn lease_or(&self, reclaim_after: Duration) -> Duration {
        self.lease.unwrap_or(reclaim_after)
    }

    pub(crate) fn validate(&self, reclaim_after: Duration) -> Result<(), ConfigError> {
        if self.name.is_empty() || self.name.contains(['{', '}']) {
            return Err(ConfigError::new(
                "cluster_ceiling.name",
                format!(
                    "{:?} must be non-empty and free of braces: it becomes the key's hash tag",
                    self.name
                ),
            ));
        }
        if self.limit == 0 {
            return Err(ConfigError::new(
                "cluster_ceiling.limit",
                "must be at least 1: a ceiling of 0 would shed every call",
            ));
        }
        let lease = self.lease_or(reclaim_after);
        if lease < Duration::from_millis(1) || lease > MAX_LEASE {
            return Err(ConfigError::new(
                "cluster_ceiling.lease",
                format!(
                    "{lease:?}{} must be from 1 ms to {MAX_LEASE:?} (a year)",
                    if self.lease.is_none() {
                        " (the bulkhead's reclaim_after, as no lease is set)"
                    } else {
                        ""
                    }
                ),
            ));
        }
        if self.timeout.is_zero() || self.timeout > MAX_TIMEOUT || self.timeout >= lease {
            return Err(ConfigError::new(
                "cluster_ceiling.timeout",
                format!(
                    "{:?} must be longer than zero, at most {MAX_TIMEOUT:?} and shorter than the lease ({lease:?})",
                    self.timeout
                ),
            ));
        }
        if self.weight == 0 || self.weight > MAX_WEIGHT {
            return Err(ConfigError::new(
                "cluster_ceiling.weight",
                format!("{} must be from 1 to {MAX_WEIGHT}", self.weight),
            ));
        }
        if self.backoff > MAX_BACKOFF {
            return Err(ConfigError::new(
                "cluster_ceiling.backoff",
                format!("{:?} is over the maximum of {MAX_BACKOFF:?}", self.backoff),
            ));
        }
        if self.when_unreachable == WhenUnreachable::LocalLimit(0) {
            return Err(ConfigError::new(
                "cluster_ceiling.when_unreachable",
                "LocalLimit(0) would shed every call: use FailClosed",
            ));
        }
        Ok(())
    }
}

/// Each bulkhead gets a ceiling of its own on the shared set of leases:
/// its connection, its counts and its places under `LocalLimit`, sized by
/// its `reclaim_after`.
impl Install for ClusterCeiling {
    fn validate(&self, config: &Config) -> Result<(), ConfigError> {
        ClusterCeiling::validate(self, config.reclaim_after)
    }

    /// The first ask may take a whole `timeout`, whatever the deadline.
    fn first_ask(&self) -> Duration {
        self.timeout
    }

    fn install(self: Arc<Self>, config: &Config) -> Arc<dyn Admit> {
        Arc::new(Cluster::new(ClusterCeiling::clone(&self), config))
    }
}

impl fmt::Debug for ClusterCeiling {
    /// Without the client: its connection details may hold a password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterCeiling")
            .field("name", &self.name)
            .field("limit", &self.limit)
            .field("lease", &self.lease)
            .field("renew", &self.renew)
            .field("weight", &self.weight)
            .field("timeout", &self.timeout)
            .field("backoff", &self.backoff)
            .field("when_unreachable", &self.when_unreachable)
            .finish_non_exhaustive()
    }
}
