//! A bulkhead's side of its cluster ceiling: asking Redis for leases, and
//! what to do while Redis is away.

use crate::ceiling::{self, Admit, Asking, Ceiling, HeldLease, Leased, Refused};
use crate::observe::{Event, Hook};
use crate::redis::fallback::FallbackPlaces;
use crate::redis::releases::{Carried, Outbox};
use crate::redis::script::ACQUIRE;
use crate::redis::{ClusterCeiling, ClusterStatus, WhenUnreachable};
use crate::{Config, Status};
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;
use tokio::time::Instant;

/// A caller refused by the ceiling, with a `wait` budget left, asks again
/// after a pause that starts here and doubles up to `LONGEST_PAUSE`, each
/// jittered down by up to half, and never past the earliest lease's end.
const FIRST_PAUSE: Duration = Duration::from_millis(1);
const LONGEST_PAUSE: Duration = Duration::from_millis(8);
/// How long a refusal counts a replica as waiting, places kept free for it
/// if it holds fewer leases for its weight than the one asking: until it is
/// granted one, or this window ends (a replica refused for longer is marked
/// again, once a window). Two of its round trips and the longest pause, so
/// that a replica whose callers ask again is still waiting when they do;
/// from 25 ms to 1 s: a replica that stops asking keeps a place free for
/// this long at most.
const WAITING: Duration = Duration::from_millis(25);
const LONGEST_WAITING: Duration = Duration::from_secs(1);

/// A bulkhead's cluster ceiling, with its connection and its counts.
pub(super) struct Cluster {
    /// How long a lease is taken to last, seen from here: the lease, or,
    /// renewed, the bulkhead's `reclaim_after`, after which its local slot
    /// is reclaimed and renewal stops.
    lasts: Duration,
    /// The bulkhead's `reclaim_after`: how long a lease is renewed.
    renew_for: Duration,
    /// The releases queued, the connection, and the task that sends them.
    outbox: Arc<Outbox>,
    /// While Redis is skipped after a failure: until when, in milliseconds
    /// since `epoch` plus one; 0 while Redis answers.
    skip_until: AtomicU64,
    /// Whether Redis was last reported reachable: reports are made under
    /// this lock, each of the state `skip_until` holds then, so that two
    /// threads changing it at once cannot leave the last report saying
    /// the opposite of the state.
    reported_reachable: Mutex<bool>,
    epoch: Instant,
    fallback: Option<Arc<FallbackPlaces>>,
    counts: Arc<Counts>,
    on_event: Option<Hook>,
    #[cfg(feature = "metrics")]
    metrics: metrics::ClusterMetrics,
}

/// What a cluster ceiling has seen, for [`ClusterStatus`].
#[derive(Default)]
pub(super) struct Counts {
    granted: AtomicU64,
    refused: AtomicU64,
    deferred: AtomicU64,
    reclaimed: AtomicU64,
    pub(super) released: AtomicU64,
    pub(super) released_late: AtomicU64,
    pub(super) releases_lost: AtomicU64,
    /// Commands that failed or timed out: asks, releases, renewals.
    pub(super) errors: AtomicU64,
    admitted_without_lease: AtomicU64,
    held_seen: AtomicUsize,
    round_trip_micros: AtomicU64,
}

/// Where a call was admitted beside its local slots, so that its permit
/// gives back to the same place: a lease in Redis, or a place under the
/// fallback limit.
pub(super) enum Lease {
    /// A lease, by token, asked for at `asked`, taken to last `lasts`.
    Redis {
        token: String,
        asked: Instant,
        lasts: Duration,
        outbox: Arc<Outbox>,
    },
    /// A place under `WhenUnreachable::LocalLimit`, by id.
    Fallback {
        id: u64,
        places: Arc<FallbackPlaces>,
    },
}

/// The answer to a lease: one, none needed (admitted while Redis is away,
/// under `FailOpen`), or a refusal.
type Answer = Result<Option<Lease>, Refused>;

impl Cluster {
    pub(super) fn new(ceiling: ClusterCeiling, config: &Config) -> Self {
        let reclaim_after = config.reclaim_after;
        let lease = ceiling.lease_or(reclaim_after);
        let counts = Arc::new(Counts::default());
        // `validate` keeps the lease within a year: no overflow. Rounded
        // up: a lease never ends before it was asked to.
        let lease_ms = lease.as_micros().div_ceil(1_000) as u64;
        let lasts = if ceiling.renew {
            lease.max(reclaim_after)
        } else {
            lease
        };
        let fallback = match ceiling.when_unreachable {
            WhenUnreachable::LocalLimit(limit) => {
                Some(Arc::new(FallbackPlaces::new(limit, reclaim_after)))
            }
            _ => None,
        };
        Self {
            on_event: config.on_event.clone(),
            #[cfg(feature = "metrics")]
            metrics: metrics::ClusterMetrics::register(
                config.name.as_deref().unwrap_or("bulkhead"),
                ceiling.limit,
            ),
            outbox: Arc::new(Outbox::new(ceiling, lease_ms, counts.clone())),
            lasts,
            renew_for: reclaim_after,
            skip_until: AtomicU64::new(0),
            reported_reachable: Mutex::new(true),
            epoch: Instant::now(),
            fallback,
            counts,
        }
    }

    /// A lease for one call, asked for again until `deadline` while the
    /// ceiling is full (once, without a deadline); or, while Redis cannot
    /// be reached, what [`WhenUnreachable`] says.
    ///
    /// The first ask may take the whole `timeout`; later ones end by the
    /// deadline.
    async fn lease(&self, deadline: Option<Instant>) -> Answer {
        let mut pause = FIRST_PAUSE;
        let mut timeout = self.ceiling().timeout;
        loop {
            if !self.may_ask() {
                return self.unreachable();
            }
            // Released if this future is dropped, or the ask times out or
            // fails, after the script may have run: the token is ours, so a
            // release never takes anyone else's lease.
            let asking = Unanswered {
                outbox: &self.outbox,
                token: Some(new_token(&self.outbox.replica)),
            };
            // The releases pending that no command carries, and the newest
            // (this replica's last among them): removed before this request
            // counts.
            let carried = self.outbox.for_request();
            let asked = Instant::now();
            let reply = tokio::time::timeout(timeout, self.ask(asking.token(), &carried)).await;
            let reply = match reply {
                Ok(Ok(reply)) => reply,
                failed => {
                    drop((carried, asking));
                    let error = match failed {
                        Ok(Err(error)) => Some(error),
                        _ => None,
                    };
                    if error.is_none() && timeout < self.ceiling().timeout {
                        // Cut short by the wait budget, not by Redis.
                        return Err(Refused::Full);
                    }
                    self.unreached(error);
                    return self.unreachable();
                }
            };
            self.reached(asked.elapsed(), &reply);
            carried.answered(&reply.released);
            if reply.admitted {
                return Ok(Some(self.granted(asking.granted(), asked)));
            }
            asking.refused();
            self.counts.refused.fetch_add(1, Ordering::Relaxed);
            if reply.kept > 0 {
                self.counts.deferred.fetch_add(1, Ordering::Relaxed);
            }
            let Some(deadline) = deadline else {
                return Err(Refused::Full);
            };
            let hint = Duration::from_millis(reply.earliest_ends_in.max(1));
            let nap = jitter(pause.min(hint));
            let now = Instant::now();
            if now + nap >= deadline {
                return Err(Refused::Full);
            }
            tokio::time::sleep(nap).await;
            pause = (pause * 2).min(LONGEST_PAUSE);
            timeout = self
                .ceiling()
                .timeout
                .min(deadline.saturating_duration_since(Instant::now()));
            if timeout.is_zero() {
                return Err(Refused::Full);
            }
        }
    }

    /// The answer for a call that cannot ask Redis while it is away.
    fn unreachable(&self) -> Answer {
        match self.ceiling().when_unreachable {
            WhenUnreachable::FailOpen => {
                self.admitted_without_lease();
                Ok(None)
            }
            WhenUnreachable::FailClosed => Err(Refused::Unavailable),
            WhenUnreachable::LocalLimit(_) => {
                let Some(places) = &self.fallback else {
                    return Err(Refused::Unavailable);
                };
                let id = places.take().ok_or(Refused::Unavailable)?;
                self.admitted_without_lease();
                Ok(Some(Lease::Fallback {
                    id,
                    places: places.clone(),
                }))
            }
        }
    }

    /// The ceiling's settings.
    fn ceiling(&self) -> &ClusterCeiling {
        &self.outbox.ceiling
    }

    /// A call was admitted without a lease: Redis was away, or the call may
    /// not wait for a round trip.
    fn admitted_without_lease(&self) {
        self.counts
            .admitted_without_lease
            .fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        self.metrics.admitted_without_lease.increment(1);
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
        self.ceiling().backoff.as_millis() as u64
    }

    /// Milliseconds since `epoch`, plus one (0 means "not skipping").
    fn millis(&self) -> u64 {
        (self.epoch.elapsed().as_millis() as u64).saturating_add(1)
    }

    /// Reports Redis answering again, or failing, once per change: called
    /// after each change of `skip_until` between 0 and not, it reports the
    /// state it finds, if that is not the one reported last.
    fn report_reachable(&self) {
        // A hook that panicked under it left `reported` right: it is set first.
        let mut reported = self
            .reported_reachable
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let reachable = self.skip_until.load(Ordering::Relaxed) == 0;
        if *reported == reachable {
            return;
        }
        *reported = reachable;
        #[cfg(feature = "metrics")]
        self.metrics.reachable.set(f64::from(u8::from(reachable)));
        if let Some(hook) = &self.on_event {
            (hook.0)(&Event::ClusterReachable { reachable });
        }
    }

    fn reached(&self, round_trip: Duration, reply: &Reply) {
        if self.skip_until.swap(0, Ordering::Relaxed) != 0 {
            self.report_reachable();
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
            self.report_reachable();
        }
        #[cfg(feature = "tracing")]
        match error {
            Some(error) => tracing::warn!(
                target: "tower_inflight",
                ceiling = %self.ceiling().name,
                %error,
                "cluster ceiling: Redis failed; skipping it for the backoff"
            ),
            None => tracing::warn!(
                target: "tower_inflight",
                ceiling = %self.ceiling().name,
                "cluster ceiling: Redis timed out; skipping it for the backoff"
            ),
        }
        #[cfg(not(feature = "tracing"))]
        let _ = error;
    }

    /// One script: the leases in `releasing` removed, the expired ones
    /// dropped, and `token`'s lease added if there is room.
    async fn ask(
        &self,
        token: &str,
        releasing: &Carried<'_>,
    ) -> Result<Reply, ::redis::RedisError> {
        let mut connection = self.outbox.connection()?;
        let mut script = ACQUIRE.key(&self.outbox.key);
        script
            .arg(self.ceiling().limit)
            .arg(self.outbox.lease_ms)
            .arg(token)
            .arg(&self.outbox.replica)
            .arg(self.ceiling().weight)
            .arg(self.waiting_window().as_millis() as u64);
        for token in releasing.tokens() {
            script.arg(token);
        }
        let reply: (u8, usize, u64, u64, Vec<u8>, u64) =
            script.invoke_async(&mut connection).await?;
        Ok(Reply {
            admitted: reply.0 == 1,
            held: reply.1,
            reclaimed: reply.2,
            earliest_ends_in: reply.3,
            released: reply.4,
            kept: reply.5,
        })
    }

    /// How long a refusal counts this replica as waiting: see [`WAITING`].
    fn waiting_window(&self) -> Duration {
        let round_trip =
            Duration::from_micros(self.counts.round_trip_micros.load(Ordering::Relaxed));
        (round_trip * 2 + LONGEST_PAUSE).clamp(WAITING, LONGEST_WAITING)
    }

    fn granted(&self, token: String, asked: Instant) -> Lease {
        self.counts.granted.fetch_add(1, Ordering::Relaxed);
        if self.ceiling().renew {
            self.outbox.live(token.clone(), asked + self.renew_for);
        }
        Lease::Redis {
            token,
            asked,
            lasts: self.lasts,
            outbox: self.outbox.clone(),
        }
    }

    fn status(&self) -> ClusterStatus {
        let counts = &self.counts;
        let read = |count: &AtomicU64| count.load(Ordering::Relaxed);
        let round_trip = read(&counts.round_trip_micros);
        ClusterStatus {
            limit: self.ceiling().limit,
            leases_held: counts.held_seen.load(Ordering::Relaxed),
            reachable: self.skip_until.load(Ordering::Relaxed) == 0,
            round_trip: (round_trip != 0).then(|| Duration::from_micros(round_trip)),
            leases_granted: read(&counts.granted),
            leases_refused: read(&counts.refused),
            leases_deferred: read(&counts.deferred),
            leases_reclaimed: read(&counts.reclaimed),
            leases_released: read(&counts.released),
            releases_late: read(&counts.released_late),
            releases_lost: read(&counts.releases_lost),
            errors: read(&counts.errors),
            admitted_without_lease: read(&counts.admitted_without_lease),
            fallback_held: self.fallback.as_deref().map_or(0, FallbackPlaces::held),
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.outbox.close();
    }
}

impl Ceiling for Cluster {
    type Lease = Option<Lease>;

    async fn acquire(&self, deadline: Option<Instant>) -> Answer {
        self.lease(deadline).await
    }

    /// A call that may not wait for a round trip cannot ask Redis: it is
    /// answered as if Redis were away, except that the places under
    /// `LocalLimit` are a share of the ceiling for while Redis is away,
    /// not a way round it while it answers, so only `FailOpen` admits it.
    fn try_acquire(&self) -> Answer {
        match self.ceiling().when_unreachable {
            WhenUnreachable::FailOpen => {
                self.admitted_without_lease();
                Ok(None)
            }
            _ => Err(Refused::Unavailable),
        }
    }
}

/// How a bulkhead asks its Redis ceiling: as any [`Ceiling`], with a
/// status of its own, and places under `LocalLimit` that a reset forgets.
impl Admit for Cluster {
    fn acquire(self: Arc<Self>, deadline: Option<Instant>) -> Asking {
        Box::pin(async move { held(Ceiling::acquire(&*self, deadline).await) })
    }

    fn try_acquire(&self) -> Leased {
        held(Ceiling::try_acquire(self))
    }

    fn reset(&self) {
        if let Some(fallback) = &self.fallback {
            fallback.clear();
        }
    }

    fn describe(&self, status: &mut Status) {
        status.cluster = Some(self.status());
    }
}

/// Boxed for its bulkhead to hold, if there is a lease at all.
fn held(answer: Answer) -> Leased {
    answer.map(|lease| lease.map(|lease| Box::new(lease) as HeldLease))
}

impl ceiling::Lease for Lease {
    fn lapsed(&self) -> bool {
        match self {
            Lease::Redis { asked, lasts, .. } => asked.elapsed() >= *lasts,
            // Taken back after `reclaim_after`, as its local slot is.
            Lease::Fallback { id, places } => !places.holds(*id),
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        match self {
            Lease::Redis { token, outbox, .. } => outbox.give_back(std::mem::take(token), true),
            Lease::Fallback { id, places } => places.give_back(*id),
        }
    }
}

/// A lease asked for and not yet answered: released if the answer never
/// comes (the future dropped, the command timed out or failed).
struct Unanswered<'a> {
    outbox: &'a Outbox,
    token: Option<String>,
}

impl Unanswered<'_> {
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

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if let Some(token) = self.token.take() {
            self.outbox.give_back(token, false);
        }
    }
}

struct Reply {
    admitted: bool,
    held: usize,
    reclaimed: u64,
    earliest_ends_in: u64,
    /// For each release carried: 1 if it was found and removed.
    released: Vec<u8>,
    /// Refused with places free: how many, kept for replicas ahead.
    kept: u64,
}

/// An id for a bulkhead among the replicas sharing its ceiling: 64 bits
/// from a randomly keyed hasher over a per-process count and the process.
pub(super) fn new_replica_id() -> String {
    let n = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
    let id = token_keys().hash_one((n, std::process::id(), 0u8));
    format!("{id:016x}")
}

/// A token no other permit, in any process, will hold: its replica's id
/// (so that the script knows whose lease it is), then 64 bits from a
/// randomly keyed hasher over a per-process count.
fn new_token(replica: &str) -> String {
    let n = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
    let low = token_keys().hash_one((n, 1u8));
    format!("{replica}{low:016x}")
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
    fn tokens_do_not_repeat_and_name_their_replica() {
        let replica = new_replica_id();
        assert_eq!(replica.len(), 16);
        assert_ne!(replica, new_replica_id());
        let tokens: std::collections::HashSet<String> =
            (0..10_000).map(|_| new_token(&replica)).collect();
        assert_eq!(tokens.len(), 10_000);
        assert!(tokens
            .iter()
            .all(|token| token.len() == 32 && token.starts_with(&replica)));
    }

    /// Redis fails, answers, and fails again while the first report is
    /// still in the hook: the reports that follow look at the state as it
    /// is then, so the last one says what the ceiling's status says.
    #[test]
    fn the_last_reachability_report_is_the_state_the_ceiling_is_in() {
        use std::sync::mpsc;
        let (entered, in_hook) = mpsc::channel();
        let (go_on, released) = mpsc::channel::<()>();
        let released = Mutex::new(released);
        let reports = Arc::new(Mutex::new(Vec::<bool>::new()));
        let seen = reports.clone();
        let config = Config::new(1, Duration::from_secs(30)).on_event(move |event| {
            let Event::ClusterReachable { reachable } = *event else {
                return;
            };
            if reachable {
                // Made to land last if it is made at all: after the second
                // failure's report, which a report of the answer made
                // outside of any order would race.
                let waited = std::time::Instant::now();
                while seen.lock().unwrap().iter().filter(|up| !**up).count() < 2
                    && waited.elapsed() < Duration::from_secs(5)
                {
                    std::thread::yield_now();
                }
            }
            let first = {
                let mut seen = seen.lock().unwrap();
                seen.push(reachable);
                seen.len() == 1
            };
            if first {
                entered.send(()).unwrap();
                released.lock().unwrap().recv().unwrap();
            }
        });
        let client = ::redis::Client::open("redis://127.0.0.1:1").unwrap();
        let cluster = Cluster::new(ClusterCeiling::new(client, "reach", 1), &config);
        let reply = Reply {
            admitted: true,
            held: 0,
            reclaimed: 0,
            earliest_ends_in: 0,
            released: Vec::new(),
            kept: 0,
        };
        std::thread::scope(|scope| {
            let failed = scope.spawn(|| cluster.unreached(None));
            in_hook.recv().unwrap();
            // Answered, then failed again, while `false` is being reported.
            let answered = scope.spawn(|| cluster.reached(Duration::ZERO, &reply));
            while cluster.skip_until.load(Ordering::Relaxed) != 0 {
                std::thread::yield_now();
            }
            let failed_again = scope.spawn(|| cluster.unreached(None));
            while cluster.skip_until.load(Ordering::Relaxed) == 0 {
                std::thread::yield_now();
            }
            go_on.send(()).unwrap();
            for thread in [failed, answered, failed_again] {
                thread.join().unwrap();
            }
        });
        let reports = reports.lock().unwrap().clone();
        assert_eq!(reports.last(), Some(&false), "{reports:?}");
        assert_ne!(
            cluster.skip_until.load(Ordering::Relaxed),
            0,
            "Redis failed last"
        );
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
