//! Giving leases back, and renewing the live ones: a queue that the next
//! lease's script empties (so that a caller's next call never finds its own
//! last lease still held), and a background task that empties it when no
//! lease is asked for, and renews.

use crate::redis::cluster::{Cluster, Counts};
use crate::redis::script::RENEW;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
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
}

#[derive(Default)]
pub(super) struct Releases {
    queue: Mutex<Vec<Release>>,
    /// Wakes the task: a release queued, or the bulkhead gone.
    wake: Arc<Notify>,
    /// The leases to renew, by token, with when each stops being renewed.
    live: Mutex<HashMap<String, Instant>>,
    /// The task, started by the first lease asked for in a runtime, and
    /// again if that runtime has gone.
    task: Mutex<Option<JoinHandle<()>>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Releases {
    /// Queues `release`; past the queue's bound it is dropped and its lease
    /// left to run out.
    pub(super) fn queue(&self, release: Release, counts: &Counts) {
        let mut queue = lock(&self.queue);
        if queue.len() < QUEUE {
            queue.push(release);
            drop(queue);
            self.wake.notify_one();
        } else if release.granted {
            counts.releases_lost.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Up to a batch of the releases queued.
    pub(super) fn take(&self) -> Vec<Release> {
        let mut queue = lock(&self.queue);
        let from = queue.len().saturating_sub(BATCH);
        queue.split_off(from)
    }

    /// Puts back releases whose command failed: the next command carries
    /// them. They may have been applied already, so they are no longer
    /// known to remove anything.
    pub(super) fn put_back(&self, releases: Vec<Release>, counts: &Counts) {
        for mut release in releases {
            let granted = std::mem::replace(&mut release.granted, false);
            let mut queue = lock(&self.queue);
            if queue.len() < QUEUE {
                queue.push(release);
            } else if granted {
                counts.releases_lost.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    pub(super) fn live(&self, token: String, until: Instant) {
        lock(&self.live).insert(token, until);
    }

    pub(super) fn not_live(&self, token: &str) {
        lock(&self.live).remove(token);
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

    /// Starts the task if it is not running (never started, or its runtime
    /// has shut down), on the current runtime.
    pub(super) fn ensure_task(&self, cluster: &Arc<Cluster>) {
        let mut task = lock(&self.task);
        if task.as_ref().is_some_and(|task| !task.is_finished()) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        *task = Some(runtime.spawn(run(Arc::downgrade(cluster), self.wake.clone())));
    }

    /// Ends the task: the bulkhead is gone.
    pub(super) fn close(&self) {
        self.wake.notify_one();
    }
}

/// Sends the queued releases whenever one is queued, and renews the live
/// leases every third of a lease; ends with the bulkhead.
async fn run(cluster: Weak<Cluster>, wake: Arc<Notify>) {
    let period = match cluster.upgrade() {
        Some(cluster) => cluster.renew_period(),
        None => return,
    };
    let mut next_renewal = period.map(|period| Instant::now() + period);
    loop {
        match next_renewal {
            Some(at) => {
                let _ = tokio::time::timeout_at(at, wake.notified()).await;
            }
            None => wake.notified().await,
        }
        let Some(cluster) = cluster.upgrade() else {
            return;
        };
        cluster.send_releases().await;
        if let (Some(at), Some(period)) = (next_renewal, period) {
            if Instant::now() >= at {
                cluster.renew().await;
                next_renewal = Some(Instant::now() + period);
            }
        }
    }
}

impl Cluster {
    /// Sends every release queued, a batch to a `ZREM`. A `ZREM` that
    /// removes fewer than it was sent found the rest gone already (run out
    /// and reclaimed): counted late, and it removed nobody else's. A failed
    /// one is put back for the next command.
    async fn send_releases(&self) {
        loop {
            let batch = self.releases.take();
            if batch.is_empty() {
                return;
            }
            let Ok(mut connection) = self.connection() else {
                self.releases.put_back(batch, &self.counts);
                return;
            };
            let mut zrem = ::redis::cmd("ZREM");
            zrem.arg(&self.key);
            for release in &batch {
                zrem.arg(&release.token);
            }
            let removed = tokio::time::timeout(
                self.ceiling.timeout,
                zrem.query_async::<u64>(&mut connection),
            )
            .await;
            match removed {
                Ok(Ok(removed)) => self.counts.released(&batch, removed),
                _ => {
                    self.releases.put_back(batch, &self.counts);
                    return;
                }
            }
        }
    }

    fn renew_period(&self) -> Option<Duration> {
        self.ceiling
            .renew
            .then(|| Duration::from_millis((self.lease_ms / 3).max(1)))
    }

    /// Moves each live lease's deadline a lease on. A failed renewal is
    /// tried again next period; a lease it misses runs out and is
    /// reclaimed, as a dead replica's is.
    async fn renew(&self) {
        let tokens = self.releases.to_renew();
        let Ok(mut connection) = self.connection() else {
            return;
        };
        for tokens in tokens.chunks(BATCH) {
            let mut renew = RENEW.key(&self.key);
            renew.arg(self.lease_ms).arg(tokens);
            let _ = tokio::time::timeout(
                self.ceiling.timeout,
                renew.invoke_async::<u64>(&mut connection),
            )
            .await;
        }
    }
}

impl Counts {
    /// `removed` of `batch` were found and removed.
    pub(super) fn released(&self, batch: &[Release], removed: u64) {
        let granted = batch.iter().filter(|release| release.granted).count() as u64;
        self.released.fetch_add(removed, Ordering::Relaxed);
        self.released_late
            .fetch_add(granted.saturating_sub(removed), Ordering::Relaxed);
    }
}
