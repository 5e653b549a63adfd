//! Giving leases back, and renewing the live ones.
//!
//! A dropped permit queues its lease's token in the [`Outbox`]. The next
//! lease this replica asks for carries the queue in its script (so that a
//! caller's next call never finds its own last lease still held); when no
//! lease is asked for, a background task sends it. The task owns the outbox,
//! so releases queued as the bulkhead goes are still sent; it ends once the
//! bulkhead is gone and the queue is empty (or cannot be sent). The outbox
//! also holds the connection, made with the task in one runtime and made
//! again with it if that runtime shuts down.

use crate::redis::cluster::Counts;
use crate::redis::script::RENEW;
use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Releases waiting to be sent; past this, a release is dropped (and
/// counted) and its lease runs out on its own.
const QUEUE: usize = 4_096;
/// The most tokens one command carries.
pub(super) const BATCH: usize = 256;

/// A token to remove from the set.
pub(super) struct Release {
    pub(super) token: String,
    /// Known to have been granted: a release that removes nothing is late
    /// (the lease had run out and been reclaimed). Not so for a lease asked
    /// for and abandoned, which may never have been granted.
    pub(super) granted: bool,
    /// Sent before in a command whose answer never came: it may have been
    /// removed then, so finding nothing now is not late.
    pub(super) resent: bool,
}

/// What the task needs, outliving the bulkhead.
pub(super) struct Outbox {
    key: String,
    lease_ms: u64,
    timeout: Duration,
    backoff: Duration,
    renew: bool,
    client: ::redis::Client,
    queue: Mutex<VecDeque<Release>>,
    /// Wakes the task: a release queued, or the bulkhead gone.
    wake: Notify,
    /// Set when the bulkhead is gone: the task sends what is queued, then
    /// ends.
    closed: AtomicBool,
    /// The leases to renew, by token, with when each stops being renewed.
    live: Mutex<HashMap<String, Instant>>,
    /// The task and the connection, made together in one runtime.
    running: Mutex<Option<Running>>,
    pub(super) counts: Arc<Counts>,
}

struct Running {
    task: JoinHandle<()>,
    connection: ConnectionManager,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Releases taken from the queue to be sent in a command: put back, as
/// maybe sent, unless [`sent`](Self::sent) says the command was answered.
/// So a command abandoned midway (its caller's future dropped, a timeout)
/// loses none of them.
pub(super) struct Sending<'a> {
    outbox: &'a Outbox,
    releases: Vec<Release>,
}

impl Sending<'_> {
    pub(super) fn tokens(&self) -> impl Iterator<Item = &str> {
        self.releases.iter().map(|release| release.token.as_str())
    }

    /// The command was answered: `removed` of these leases were found.
    pub(super) fn sent(mut self, removed: u64) {
        let releases = std::mem::take(&mut self.releases);
        let expected = releases
            .iter()
            .filter(|release| release.granted && !release.resent)
            .count() as u64;
        let counts = &self.outbox.counts;
        counts.released.fetch_add(removed, Ordering::Relaxed);
        counts
            .released_late
            .fetch_add(expected.saturating_sub(removed), Ordering::Relaxed);
    }
}

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        for mut release in self.releases.drain(..) {
            release.resent = true;
            self.outbox.queue_back(release);
        }
    }
}

impl Outbox {
    pub(super) fn new(
        ceiling: &crate::redis::ClusterCeiling,
        lease_ms: u64,
        counts: Arc<Counts>,
    ) -> Self {
        Self {
            key: ceiling.key(),
            lease_ms,
            timeout: ceiling.timeout,
            backoff: ceiling.backoff,
            renew: ceiling.renew,
            client: ceiling.client.clone(),
            queue: Mutex::default(),
            wake: Notify::new(),
            closed: AtomicBool::new(false),
            live: Mutex::default(),
            running: Mutex::new(None),
            counts,
        }
    }

    /// Queues `release` and wakes the task; past the queue's bound the
    /// release is dropped, and its lease left to run out.
    pub(super) fn queue(&self, release: Release) {
        if self.renew {
            lock(&self.live).remove(&release.token);
        }
        self.queue_back(release);
        self.wake.notify_one();
    }

    fn queue_back(&self, release: Release) {
        let mut queue = lock(&self.queue);
        if queue.len() < QUEUE {
            queue.push_back(release);
        } else if release.granted {
            self.counts.releases_lost.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Up to a batch of the releases queued, oldest first, to be sent.
    pub(super) fn sending(&self) -> Sending<'_> {
        let mut queue = lock(&self.queue);
        let count = queue.len().min(BATCH);
        Sending {
            outbox: self,
            releases: queue.drain(..count).collect(),
        }
    }

    pub(super) fn live(&self, token: String, until: Instant) {
        if self.renew {
            lock(&self.live).insert(token, until);
        }
    }

    /// The live leases' tokens, after dropping those past `reclaim_after`: a
    /// permit held that long has lost its local slot, so its lease runs out
    /// too, and a leaked permit frees both.
    fn to_renew(&self) -> Vec<String> {
        let now = Instant::now();
        let mut live = lock(&self.live);
        live.retain(|_, until| *until > now);
        live.keys().cloned().collect()
    }

    /// The connection, with the task beside it: both made in the current
    /// runtime if they are not running (never made, or their runtime has
    /// shut down). `None` outside a runtime.
    pub(super) fn connection(self: &Arc<Self>) -> Result<ConnectionManager, ::redis::RedisError> {
        let mut running = lock(&self.running);
        if let Some(running) = running
            .as_ref()
            .filter(|running| !running.task.is_finished())
        {
            return Ok(running.connection.clone());
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Err(::redis::RedisError::from((
                ::redis::ErrorKind::Client,
                "the cluster ceiling needs a Tokio runtime",
            )));
        };
        let _entered = runtime.enter();
        let timeout = Some(self.timeout);
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(timeout)
            .set_response_timeout(timeout)
            .set_number_of_retries(1);
        let connection = ConnectionManager::new_lazy_with_config(self.client.clone(), config)?;
        let task = runtime.spawn(run(self.clone(), connection.clone()));
        *running = Some(Running {
            task,
            connection: connection.clone(),
        });
        Ok(connection)
    }

    /// The bulkhead is gone: the task sends what is queued, then ends. If
    /// it is not running and there is a runtime here, it is started for
    /// that.
    pub(super) fn close(self: &Arc<Self>) {
        self.closed.store(true, Ordering::Release);
        if !lock(&self.queue).is_empty() {
            let _ = self.connection();
        }
        self.wake.notify_one();
    }

    /// Sends every release queued, a batch to a `ZREM`: `false` if a
    /// command failed (they are queued again).
    async fn send(&self, connection: &mut ConnectionManager) -> bool {
        loop {
            let sending = self.sending();
            if sending.releases.is_empty() {
                return true;
            }
            let mut zrem = ::redis::cmd("ZREM");
            zrem.arg(&self.key);
            for token in sending.tokens() {
                zrem.arg(token);
            }
            match tokio::time::timeout(self.timeout, zrem.query_async::<u64>(connection)).await {
                Ok(Ok(removed)) => sending.sent(removed),
                _ => {
                    self.counts.errors.fetch_add(1, Ordering::Relaxed);
                    return false;
                }
            }
        }
    }

    /// Moves each live lease's deadline a lease on. A failed renewal is
    /// tried again next period; a lease it misses runs out and is
    /// reclaimed, as a dead replica's is.
    async fn renew_all(&self, connection: &mut ConnectionManager) {
        for tokens in self.to_renew().chunks(BATCH) {
            let mut renew = RENEW.key(&self.key);
            renew.arg(self.lease_ms).arg(tokens);
            let renewed = tokio::time::timeout(self.timeout, renew.invoke_async::<u64>(connection));
            if !matches!(renewed.await, Ok(Ok(_))) {
                self.counts.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn renew_period(&self) -> Option<Duration> {
        self.renew
            .then(|| Duration::from_millis((self.lease_ms / 3).max(1)))
    }
}

/// Sends the queued releases when one is queued (and again after a backoff
/// if sending failed), and renews the live leases every third of a lease;
/// ends once the bulkhead is gone and nothing is left to send.
async fn run(outbox: Arc<Outbox>, mut connection: ConnectionManager) {
    let period = outbox.renew_period();
    let mut next_renewal = period.map(|period| Instant::now() + period);
    let mut retry_at: Option<Instant> = None;
    loop {
        let wake_at = [next_renewal, retry_at].into_iter().flatten().min();
        match wake_at {
            Some(at) => {
                let _ = tokio::time::timeout_at(at, outbox.wake.notified()).await;
            }
            None => outbox.wake.notified().await,
        }
        let closed = outbox.closed.load(Ordering::Acquire);
        let sent = outbox.send(&mut connection).await;
        retry_at = (!sent).then(|| Instant::now() + outbox.backoff.max(outbox.timeout));
        if closed {
            // Gone: one more try at what is queued, then the rest runs out.
            if !sent {
                tokio::time::sleep(outbox.backoff.max(outbox.timeout)).await;
                if !outbox.send(&mut connection).await {
                    let lost = lock(&outbox.queue)
                        .drain(..)
                        .filter(|release| release.granted)
                        .count() as u64;
                    outbox
                        .counts
                        .releases_lost
                        .fetch_add(lost, Ordering::Relaxed);
                }
            }
            return;
        }
        if let (Some(at), Some(period)) = (next_renewal, period) {
            if Instant::now() >= at {
                outbox.renew_all(&mut connection).await;
                next_renewal = Some(Instant::now() + period);
            }
        }
    }
}
