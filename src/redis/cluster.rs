//! A bulkhead's side of its cluster ceiling: asking Redis for leases,
//! giving them back, renewing them, and what to do while Redis is away.

use crate::error::ShedReason;
use crate::observe::{Event, Hook};
use crate::redis::script::{ACQUIRE, RENEW};
use crate::redis::{ClusterCeiling, ClusterStatus, WhenUnreachable};
use crate::Config;
use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Releases waiting to be sent; past this, a release is dropped (and
/// counted) and its lease runs out on its own.
const RELEASE_QUEUE: usize = 4_096;
/// The most tokens one `ZREM` carries.
const RELEASE_BATCH: usize = 256;
/// A caller refused by the ceiling, with a `wait` budget left, asks again
/// after a pause that starts here and doubles up to `LONGEST_PAUSE`, each
/// jittered down by up to half, and never past the earliest lease's end.
const FIRST_PAUSE: Duration = Duration::from_millis(1);
const LONGEST_PAUSE: Duration = Duration::from_millis(8);

/// A bulkhead's cluster ceiling, with its connection and its counts.
pub(crate) struct Cluster {
    ceiling: ClusterCeiling,
    key: String,
    lease_ms: u64,
    /// How long a renewed lease may live: the bulkhead's `reclaim_after`,
    /// after which its local slot is reclaimed too.
    renew_for: Duration,
    /// Made on first use, inside a runtime: the manager spawns its tasks.
    connection: OnceLock<ConnectionManager>,
    releases: OnceLock<mpsc::Sender<Release>>,
    /// The leases to renew, by token, with when each stops being renewed.
    live: Arc<Mutex<HashMap<String, Instant>>>,
    /// While Redis is skipped after a failure: until when, in milliseconds
    /// since `epoch` plus one; 0 while Redis answers.
    skip_until: AtomicU64,
    epoch: Instant,
    /// Calls admitted under `WhenUnreachable::LocalLimit`, holding no lease.
    fallback_held: AtomicUsize,
    counts: Arc<Counts>,
    on_event: Option<Hook>,
    #[cfg(feature = "metrics")]
    metrics: metrics::ClusterMetrics,
}

/// What a cluster ceiling has seen, for [`ClusterStatus`].
#[derive(Default)]
struct Counts {
    granted: AtomicU64,
    refused: AtomicU64,
    reclaimed: AtomicU64,
    released: AtomicU64,
    released_late: AtomicU64,
    releases_lost: AtomicU64,
    errors: AtomicU64,
    admitted_without_lease: AtomicU64,
    held_seen: AtomicUsize,
    round_trip_micros: AtomicU64,
}

/// Where a call was admitted, so that its permit gives back to the same
/// place: a lease in Redis, or a place under the fallback limit.
pub(crate) struct Lease {
    cluster: Arc<Cluster>,
    token: Option<String>,
}

/// The answer to a lease: one, none needed (admitted while Redis is away,
/// under `FailOpen`), or a shed.
pub(crate) type Leased = Result<Option<Lease>, ShedReason>;

impl Cluster {
    pub(crate) fn new(ceiling: ClusterCeiling, config: &Config) -> Self {
        let reclaim_after = config.reclaim_after;
        let lease = ceiling.lease_or(reclaim_after);
        Self {
            on_event: config.on_event.clone(),
            #[cfg(feature = "metrics")]
            metrics: metrics::ClusterMetrics::register(
                config.name.as_deref().unwrap_or("bulkhead"),
                ceiling.limit,
            ),
            key: ceiling.key(),
            // `validate` keeps the lease within a year: no overflow.
            lease_ms: lease.as_millis() as u64,
            renew_for: reclaim_after,
            ceiling,
            connection: OnceLock::new(),
            releases: OnceLock::new(),
            live: Arc::default(),
            skip_until: AtomicU64::new(0),
            epoch: Instant::now(),
            fallback_held: AtomicUsize::new(0),
            counts: Arc::default(),
        }
    }

    /// A lease for one call, asked for again within `deadline` while the
    /// ceiling is full (once, without a deadline); or, while Redis cannot
    /// be reached, what [`WhenUnreachable`] says.
    pub(crate) async fn lease(self: Arc<Self>, deadline: Option<Instant>) -> Leased {
        let mut pause = FIRST_PAUSE;
        loop {
            if !self.may_ask() {
                return self.unreachable();
            }
            self.start_background();
            let token = new_token();
            // Released if this future is dropped, or times out, after the
            // script may have run: the token is ours, so a release never
            // takes anyone else's lease.
            let asking = Asking {
                cluster: &self,
                token: Some(token),
            };
            let asked = Instant::now();
            let reply = tokio::time::timeout(self.ceiling.timeout, self.ask(asking.token()))
                .await
                .map_err(|_| None)
                .and_then(|reply| reply.map_err(Some));
            let reply = match reply {
                Ok(reply) => reply,
                Err(error) => {
                    // The script may have run before the failure was seen.
                    drop(asking);
                    self.unreached(error);
                    return self.unreachable();
                }
            };
            self.reached(asked.elapsed(), &reply);
            if reply.admitted {
                let token = asking.granted();
                return Ok(Some(self.granted(token)));
            }
            asking.refused();
            self.counts.refused.fetch_add(1, Ordering::Relaxed);
            let Some(deadline) = deadline else {
                return Err(ShedReason::ClusterLimit);
            };
            let hint = Duration::from_millis(reply.earliest_ends_in.max(1));
            let nap = jitter(pause.min(hint));
            if Instant::now() + nap >= deadline {
                return Err(ShedReason::ClusterLimit);
            }
            tokio::time::sleep(nap).await;
            pause = (pause * 2).min(LONGEST_PAUSE);
        }
    }

    /// The answer for a call that cannot ask Redis: it is away, or the call
    /// may not wait for a round trip.
    pub(crate) fn unreachable(self: &Arc<Self>) -> Leased {
        match self.ceiling.when_unreachable {
            WhenUnreachable::FailOpen => {
                self.admitted_without_lease();
                Ok(None)
            }
            WhenUnreachable::FailClosed => Err(ShedReason::ClusterUnavailable),
            WhenUnreachable::LocalLimit(limit) => {
                // Relaxed: the count is the whole of the state it guards.
                let taken =
                    self.fallback_held
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                            (held < limit).then_some(held + 1)
                        });
                if taken.is_err() {
                    return Err(ShedReason::ClusterUnavailable);
                }
                self.admitted_without_lease();
                Ok(Some(Lease {
                    cluster: self.clone(),
                    token: None,
                }))
            }
        }
    }

    /// For a call that may not wait for a round trip: admitted (under the
    /// local limit alone) only under `FailOpen`.
    pub(crate) fn without_round_trip(&self) -> Result<(), ShedReason> {
        match self.ceiling.when_unreachable {
            WhenUnreachable::FailOpen => {
                self.admitted_without_lease();
                Ok(())
            }
            _ => Err(ShedReason::ClusterUnavailable),
        }
    }

    /// Whether to ask Redis now: always while it answers; after a failure,
    /// not until the backoff has passed, and then only the one call that
    /// moves the window on (the others keep skipping until it has its
    /// answer).
    fn may_ask(&self) -> bool {
        // Relaxed: a stale read only makes one more or one fewer call ask.
        let until = self.skip_until.load(Ordering::Relaxed);
        if until == 0 {
            return true;
        }
        let now = self.millis();
        if now < until {
            return false;
        }
        let next = now.saturating_add(self.backoff_ms()).max(1);
        self.skip_until
            .compare_exchange(until, next, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    fn backoff_ms(&self) -> u64 {
        // `validate` keeps it within an hour.
        self.ceiling.backoff.as_millis() as u64
    }

    /// Milliseconds since `epoch`, plus one (0 means "not skipping").
    fn millis(&self) -> u64 {
        (self.epoch.elapsed().as_millis() as u64).saturating_add(1)
    }

    fn admitted_without_lease(&self) {
        self.counts
            .admitted_without_lease
            .fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        self.metrics.admitted_without_lease.increment(1);
    }

    /// Reports Redis answering again, or failing, once per change.
    fn reachable(&self, reachable: bool) {
        #[cfg(feature = "metrics")]
        self.metrics.reachable.set(f64::from(u8::from(reachable)));
        if let Some(hook) = &self.on_event {
            (hook.0)(&Event::ClusterReachable { reachable });
        }
    }

    fn reached(&self, round_trip: Duration, reply: &Reply) {
        if self.skip_until.swap(0, Ordering::Relaxed) != 0 {
            self.reachable(true);
        }
        #[cfg(feature = "metrics")]
        {
            let metrics = &self.metrics;
            metrics.round_trip_seconds.record(round_trip.as_secs_f64());
            metrics.leases_held.set(reply.held as f64);
            metrics.reclaimed.increment(reply.reclaimed);
        }
        let counts = &self.counts;
        counts
            .round_trip_micros
            .store(round_trip.as_micros() as u64, Ordering::Relaxed);
        counts.held_seen.store(reply.held, Ordering::Relaxed);
        counts
            .reclaimed
            .fetch_add(reply.reclaimed, Ordering::Relaxed);
    }

    /// A command failed (`Some`) or timed out (`None`): skip Redis for the
    /// backoff.
    fn unreached(&self, error: Option<::redis::RedisError>) {
        self.counts.errors.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        self.metrics.errors.increment(1);
        let next = self.millis().saturating_add(self.backoff_ms()).max(1);
        if self.skip_until.swap(next, Ordering::Relaxed) == 0 {
            self.reachable(false);
        }
        #[cfg(feature = "tracing")]
        match error {
            Some(error) => tracing::warn!(
                target: "tower_inflight",
                ceiling = %self.ceiling.name,
                %error,
                "cluster ceiling: Redis failed; skipping it for the backoff"
            ),
            None => tracing::warn!(
                target: "tower_inflight",
                ceiling = %self.ceiling.name,
                "cluster ceiling: Redis timed out; skipping it for the backoff"
            ),
        }
        #[cfg(not(feature = "tracing"))]
        let _ = error;
    }

    fn connection(&self) -> Result<ConnectionManager, ::redis::RedisError> {
        if let Some(connection) = self.connection.get() {
            return Ok(connection.clone());
        }
        let timeout = Some(self.ceiling.timeout);
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(timeout)
            .set_response_timeout(timeout)
            .set_number_of_retries(1);
        let made = ConnectionManager::new_lazy_with_config(self.ceiling.client.clone(), config)?;
        Ok(self.connection.get_or_init(|| made).clone())
    }

    async fn ask(&self, token: &str) -> Result<Reply, ::redis::RedisError> {
        let mut connection = self.connection()?;
        let reply: (u8, usize, u64, u64) = ACQUIRE
            .key(&self.key)
            .arg(self.ceiling.limit)
            .arg(self.lease_ms)
            .arg(token)
            .invoke_async(&mut connection)
            .await?;
        Ok(Reply {
            admitted: reply.0 == 1,
            held: reply.1,
            reclaimed: reply.2,
            earliest_ends_in: reply.3,
        })
    }

    fn granted(self: &Arc<Self>, token: String) -> Lease {
        self.counts.granted.fetch_add(1, Ordering::Relaxed);
        if self.ceiling.renew {
            let until = Instant::now() + self.renew_for;
            self.live
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .insert(token.clone(), until);
        }
        Lease {
            cluster: self.clone(),
            token: Some(token),
        }
    }

    /// The release task, and the renewal task if asked for: started by the
    /// first call to ask for a lease, inside its runtime.
    fn start_background(&self) {
        if self.releases.get().is_some() {
            return;
        }
        let Ok(connection) = self.connection() else {
            return;
        };
        let (sender, receiver) = mpsc::channel(RELEASE_QUEUE);
        if self.releases.set(sender).is_err() {
            return; // another lease started them
        }
        tokio::spawn(release_all(
            connection.clone(),
            self.key.clone(),
            self.ceiling.timeout,
            receiver,
            self.counts.clone(),
        ));
        if self.ceiling.renew {
            tokio::spawn(renew_all(
                connection,
                self.key.clone(),
                self.lease_ms,
                self.ceiling.timeout,
                Arc::downgrade(&self.live),
            ));
        }
    }

    /// Sends `token` to be released (`granted`: known to hold a lease, not
    /// only maybe); if the queue is full (Redis slow or away), the lease is
    /// left to run out.
    fn release(&self, token: String, granted: bool) {
        if self.ceiling.renew {
            self.live
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .remove(&token);
        }
        let sent = self
            .releases
            .get()
            .is_some_and(|releases| releases.try_send(Release { token, granted }).is_ok());
        if !sent && granted {
            self.counts.releases_lost.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn status(&self) -> ClusterStatus {
        let counts = &self.counts;
        let read = |count: &AtomicU64| count.load(Ordering::Relaxed);
        let round_trip = read(&counts.round_trip_micros);
        ClusterStatus {
            limit: self.ceiling.limit,
            leases_held: counts.held_seen.load(Ordering::Relaxed),
            reachable: self.skip_until.load(Ordering::Relaxed) == 0,
            round_trip: (round_trip != 0).then(|| Duration::from_micros(round_trip)),
            leases_granted: read(&counts.granted),
            leases_refused: read(&counts.refused),
            leases_reclaimed: read(&counts.reclaimed),
            leases_released: read(&counts.released),
            releases_late: read(&counts.released_late),
            releases_lost: read(&counts.releases_lost),
            errors: read(&counts.errors),
            admitted_without_lease: read(&counts.admitted_without_lease),
            fallback_held: self.fallback_held.load(Ordering::Relaxed),
        }
    }
}

/// A lease asked for and not yet answered: released if the answer never
/// comes (the future dropped, the command timed out or failed).
struct Asking<'a> {
    cluster: &'a Cluster,
    token: Option<String>,
}

impl Asking<'_> {
    fn token(&self) -> &str {
        self.token.as_deref().unwrap_or_default()
    }

    fn granted(mut self) -> String {
        self.token.take().unwrap_or_default()
    }

    fn refused(mut self) {
        self.token = None;
    }
}

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        if let Some(token) = self.token.take() {
            self.cluster.release(token, false);
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        match self.token.take() {
            Some(token) => self.cluster.release(token, true),
            None => {
                // Relaxed: as where it was taken.
                self.cluster.fallback_held.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
}

/// A token to remove from the set.
struct Release {
    token: String,
    /// Known to have been granted: a release that removes nothing is late
    /// (the lease had run out and been reclaimed). Not so for a lease asked
    /// for and abandoned, which may never have been granted.
    granted: bool,
}

struct Reply {
    admitted: bool,
    held: usize,
    reclaimed: u64,
    earliest_ends_in: u64,
}

/// Gives leases back, many to a `ZREM`. A `ZREM` that removes fewer than it
/// was sent found the rest reclaimed already: counted late, and it removed
/// nobody else's.
async fn release_all(
    mut connection: ConnectionManager,
    key: String,
    timeout: Duration,
    mut releases: mpsc::Receiver<Release>,
    counts: Arc<Counts>,
) {
    let mut batch = Vec::with_capacity(RELEASE_BATCH);
    while releases.recv_many(&mut batch, RELEASE_BATCH).await > 0 {
        let granted = batch.iter().filter(|release| release.granted).count() as u64;
        let mut zrem = ::redis::cmd("ZREM");
        zrem.arg(&key);
        for release in &batch {
            zrem.arg(&release.token);
        }
        let removed = tokio::time::timeout(timeout, zrem.query_async::<u64>(&mut connection)).await;
        match removed {
            Ok(Ok(removed)) => {
                counts.released.fetch_add(removed, Ordering::Relaxed);
                counts
                    .released_late
                    .fetch_add(granted.saturating_sub(removed), Ordering::Relaxed);
            }
            // Left to run out.
            _ => {
                counts.releases_lost.fetch_add(granted, Ordering::Relaxed);
            }
        }
        batch.clear();
    }
}

/// Renews the live leases every third of a lease, each until its
/// `reclaim_after` has passed; ends with the bulkhead.
async fn renew_all(
    mut connection: ConnectionManager,
    key: String,
    lease_ms: u64,
    timeout: Duration,
    live: Weak<Mutex<HashMap<String, Instant>>>,
) {
    let period = Duration::from_millis((lease_ms / 3).max(1));
    loop {
        tokio::time::sleep(period).await;
        let Some(live) = live.upgrade() else { return };
        let tokens: Vec<String> = {
            let now = Instant::now();
            let mut live = live.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            // A permit held past `reclaim_after` has lost its local slot:
            // its lease runs out too, so a leaked permit frees both.
            live.retain(|_, until| *until > now);
            live.keys().cloned().collect()
        };
        drop(live);
        for tokens in tokens.chunks(RELEASE_BATCH) {
            let mut renew = RENEW.key(&key);
            renew.arg(lease_ms).arg(tokens);
            // A failed renewal is tried again next period; a lease it
            // misses runs out and is reclaimed, as for a dead replica.
            let _ = tokio::time::timeout(timeout, renew.invoke_async::<u64>(&mut connection)).await;
        }
    }
}

/// A token no other permit, in any process, will hold: 128 bits from a
/// randomly keyed hasher over a per-process count.
fn new_token() -> String {
    let n = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
    let keys = token_keys();
    let high = keys.hash_one((n, std::process::id(), 0u8));
    let low = keys.hash_one((n, 1u8));
    format!("{high:016x}{low:016x}")
}

static NEXT_TOKEN: AtomicU64 = AtomicU64::new(0);

fn token_keys() -> &'static RandomState {
    static KEYS: OnceLock<RandomState> = OnceLock::new();
    KEYS.get_or_init(RandomState::new)
}

/// `pause` less a random part of up to half, so that callers refused
/// together do not ask again together.
fn jitter(pause: Duration) -> Duration {
    let n = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
    let random = token_keys().hash_one((n, 2u8));
    let micros = pause.as_micros() as u64;
    Duration::from_micros(micros - random % (micros / 2 + 1))
}

#[cfg(feature = "metrics")]
mod metrics {
    //! The cluster ceiling's metrics, beside the bulkhead's (same `service`
    //! label): registered once, when the bulkhead is built.

    use metrics::{counter, gauge, histogram, Counter, Gauge, Histogram};

    const LIMIT: &str = "tower_inflight_cluster_limit";
    const LEASES_HELD: &str = "tower_inflight_cluster_leases_held";
    const ROUND_TRIP_SECONDS: &str = "tower_inflight_cluster_round_trip_seconds";
    const ERRORS: &str = "tower_inflight_cluster_errors_total";
    const REACHABLE: &str = "tower_inflight_cluster_reachable";
    const RECLAIMED: &str = "tower_inflight_cluster_reclaimed_total";
    const ADMITTED_WITHOUT_LEASE: &str = "tower_inflight_cluster_admitted_without_lease_total";

    pub(super) struct ClusterMetrics {
        pub(super) leases_held: Gauge,
        pub(super) round_trip_seconds: Histogram,
        pub(super) errors: Counter,
        pub(super) reachable: Gauge,
        pub(super) reclaimed: Counter,
        pub(super) admitted_without_lease: Counter,
    }

    impl ClusterMetrics {
        pub(super) fn register(service: &str, limit: usize) -> Self {
            let service = service.to_owned();
            gauge!(LIMIT, "service" => service.clone()).set(limit as f64);
            let reachable = gauge!(REACHABLE, "service" => service.clone());
            reachable.set(1.0);
            Self {
                leases_held: gauge!(LEASES_HELD, "service" => service.clone()),
                round_trip_seconds: histogram!(ROUND_TRIP_SECONDS, "service" => service.clone()),
                errors: counter!(ERRORS, "service" => service.clone()),
                reachable,
                reclaimed: counter!(RECLAIMED, "service" => service.clone()),
                admitted_without_lease: counter!(ADMITTED_WITHOUT_LEASE, "service" => service),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_do_not_repeat() {
        let tokens: std::collections::HashSet<String> = (0..10_000).map(|_| new_token()).collect();
        assert_eq!(tokens.len(), 10_000);
        assert!(tokens.iter().all(|token| token.len() == 32));
    }

    #[test]
    fn jitter_stays_within_half_of_the_pause() {
        for _ in 0..1_000 {
            let nap = jitter(Duration::from_millis(8));
            assert!(
                nap <= Duration::from_millis(8) && nap >= Duration::from_millis(4),
                "{nap:?}"
            );
        }
        assert_eq!(jitter(Duration::ZERO), Duration::ZERO);
    }
}
