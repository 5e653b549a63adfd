//! Giving leases back, and renewing the live ones.
//!
//! A dropped permit adds its lease's token to the [`Outbox`], where it stays
//! until a command that carried it is answered. Every lease request carries
//! the releases pending that no other command carries, and the newest few
//! whoever carries them (a command marks what it carries before it is on
//! the connection); a background task sends them when no request comes, and
//! removing a token twice does nothing. Commands on one connection run in
//! the order they were sent, so a caller's next call does not find its own
//! last lease still held, on any thread. And the releases a request leaves
//! to others are many only in a burst, so a burst of requests does not make
//! Redis remove the same tokens over and over.
//!
//! The task owns the outbox, so releases added as the bulkhead goes are
//! still sent while its runtime runs, after each backoff while Redis is
//! away, until the leases they give back have run out; it ends once the
//! bulkhead is gone and nothing is left. The connection is made with the
//! task, in one runtime, and made again with it if that runtime shuts down.

use crate::redis::cluster::Counts;
use crate::redis::connection::Connection;
use crate::redis::script::{RELEASE, RENEW};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Releases not yet answered; past this, the oldest is dropped (and
/// counted) and its lease runs out on its own.
const PENDING: usize = 4_096;
/// The most tokens one command of the task carries.
const BATCH: usize = 256;
/// How many of the newest releases every lease request carries, whether or
/// not another command carries them already.
const NEWEST: usize = 4;
/// How long the task, woken by a release, leaves lease requests to carry
/// it before it sends what is left: the releases of a busy replica ride on
/// its requests, and wake the task once a millisecond at most.
const LINGER: Duration = Duration::from_millis(1);

/// A lease given back, not yet known to be removed.
struct Release {
    token: String,
    /// Known to have been granted: a release that finds nothing is late
    /// (the lease had run out and been reclaimed). Not so for a lease asked
    /// for and abandoned, which may never have been granted.
    granted: bool,
    /// Carried by a command that was never answered: it may have been
    /// removed then, so finding nothing now is not late.
    maybe_removed: bool,
    /// How many commands carry it now, not yet answered: the task and the
    /// requests leave it to them rather than send it once more.
    carriers: u32,
    /// When its lease has surely run out (given back, it is renewed no
    /// more): past this, sending it can free nothing.
    runs_out: Instant,
}

/// What the task needs, outliving the bulkhead.
pub(super) struct Outbox {
    /// The ceiling's settings, the only copy its bulkhead keeps.
    pub(super) ceiling: crate::redis::ClusterCeiling,
    /// The ceiling's one key: its leases, and what fair shares need.
    pub(super) key: String,
    /// This bulkhead's id among the replicas sharing the ceiling: 16 hex
    /// digits, the first 16 characters of each of its tokens.
    pub(super) replica: String,
    /// The lease, in milliseconds of the Redis server's clock.
    pub(super) lease_ms: u64,
    /// Releases not yet answered, oldest first.
    pending: Mutex<VecDeque<Release>>,
    /// Wakes the task: a release added, or the bulkhead gone.
    wake: Notify,
    /// Set by the release that wakes the task, cleared by the task before
    /// it sends: the releases in between wake nobody.
    waking: AtomicBool,
    /// Set when the bulkhead is gone: the task sends what is pending, then
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
    connection: Connection,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Tokens a command carries. Answered, they settle; dropped unanswered (the
/// command failed, timed out or was abandoned), they stay pending, marked as
/// maybe removed.
pub(super) struct Carried<'a> {
    outbox: &'a Outbox,
    tokens: Vec<String>,
}

impl Carried<'_> {
    pub(super) fn tokens(&self) -> impl Iterator<Item = &str> {
        self.tokens.iter().map(String::as_str)
    }

    /// The command was answered: `removed[i]` is 1 if `tokens[i]` was found
    /// and removed. A token carried by other commands too, not found by
    /// this one, waits for their answers (which may come later, though
    /// Redis ran them first): it is late only if no command found it.
    pub(super) fn answered(mut self, removed: &[u8]) {
        if self.tokens.is_empty() {
            return;
        }
        let tokens = std::mem::take(&mut self.tokens);
        let answers: HashMap<&str, bool> = tokens
            .iter()
            .zip(removed)
            .map(|(token, &removed)| (token.as_str(), removed == 1))
            .collect();
        let (mut released, mut late) = (0, 0);
        lock(&self.outbox.pending).retain_mut(|release| {
            match answers.get(release.token.as_str()) {
                None => true,
                Some(true) => {
                    released += 1;
                    false
                }
                Some(false) if release.carriers > 1 => {
                    release.carriers -= 1;
                    true
                }
                Some(false) => {
                    if release.granted && !release.maybe_removed {
                        late += 1;
                    }
                    false
                }
            }
        });
        let counts = &self.outbox.counts;
        counts.released.fetch_add(released, Ordering::Relaxed);
        counts.released_late.fetch_add(late, Ordering::Relaxed);
    }
}

impl Drop for Carried<'_> {
    fn drop(&mut self) {
        if self.tokens.is_empty() {
            return;
        }
        let carried: std::collections::HashSet<&str> =
            self.tokens.iter().map(String::as_str).collect();
        let mut unsent = false;
        for release in lock(&self.outbox.pending).iter_mut() {
            if carried.contains(release.token.as_str()) {
                release.maybe_removed = true;
                release.carriers = release.carriers.saturating_sub(1);
                unsent |= release.carriers == 0;
            }
        }
        if unsent {
            // Left to the task, which skipped them while this carried them.
            self.outbox.wake.notify_one();
        }
    }
}

impl Outbox {
    pub(super) fn new(
        ceiling: crate::redis::ClusterCeiling,
        lease_ms: u64,
        counts: Arc<Counts>,
    ) -> Self {
        Self {
            key: ceiling.key(),
            replica: crate::redis::cluster::new_replica_id(),
            lease_ms,
            ceiling,
            pending: Mutex::default(),
            wake: Notify::new(),
            waking: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            live: Mutex::default(),
            running: Mutex::new(None),
            counts,
        }
    }

    /// Queues `token` to be released (`granted`: known to hold a lease, not
    /// only maybe). The next lease asked for carries it, or, if none is, the
    /// release task sends it.
    pub(super) fn give_back(&self, token: String, granted: bool) {
        self.release(Release {
            token,
            granted,
            maybe_removed: false,
            carriers: 0,
            runs_out: Instant::now() + self.runs_out_within(),
        });
    }

    /// How long after it is given back a lease has surely run out: given
    /// back, it is renewed no more, so within a lease, and a command's
    /// timeout for its request (or a renewal) still on its way.
    fn runs_out_within(&self) -> Duration {
        let on_its_way = if self.ceiling.renew { 2 } else { 1 };
        Duration::from_millis(self.lease_ms) + self.ceiling.timeout * on_its_way
    }

    /// Adds `release` and wakes the task; past the bound, the oldest is
    /// dropped (its lease the likeliest to have run out already) and left
    /// to run out.
    fn release(&self, release: Release) {
        if self.ceiling.renew {
            lock(&self.live).remove(&release.token);
        }
        let mut pending = lock(&self.pending);
        let lost = if pending.len() < PENDING {
            pending.push_back(release);
            None
        } else {
            // The oldest no command carries (one carried may be removed
            // yet, and its answer counts it); if all are carried, this one.
            match pending.iter().position(|release| release.carriers == 0) {
                Some(oldest) => {
                    pending.push_back(release);
                    pending.remove(oldest)
                }
                None => Some(release),
            }
        };
        if lost.is_some_and(|lost| lost.granted) {
            self.counts.releases_lost.fetch_add(1, Ordering::Relaxed);
        }
        drop(pending);
        // AcqRel: ordered with the task's clear, which comes before it reads
        // what is pending.
        if !self.waking.swap(true, Ordering::AcqRel) {
            self.wake.notify_one();
        }
    }

    /// What a lease request carries: every release pending that no command
    /// carries now, and the newest few whoever carries them. A command that
    /// carries a release may not be on the connection yet (it was marked
    /// first), and the newest are the likeliest to be this caller's own.
    pub(super) fn for_request(&self) -> Carried<'_> {
        Carried {
            outbox: self,
            tokens: self.carry(NEWEST),
        }
    }

    /// The tokens of the releases pending that no command carries, and of
    /// the `newest` whoever carries them, each marked carried once more.
    fn carry(&self, newest: usize) -> Vec<String> {
        let mut pending = lock(&self.pending);
        let from = pending.len().saturating_sub(newest);
        pending
            .iter_mut()
            .enumerate()
            .filter(|(at, release)| release.carriers == 0 || *at >= from)
            .map(|(_, release)| {
                release.carriers += 1;
                release.token.clone()
            })
            .collect()
    }

    /// Every release pending that no command carries now, oldest first, a
    /// batch at a time.
    fn all(&self) -> Vec<Carried<'_>> {
        self.carry(0)
            .chunks(BATCH)
            .map(|tokens| Carried {
                outbox: self,
                tokens: tokens.to_vec(),
            })
            .collect()
    }

    /// Drops the releases whose leases have run out (sending them could
    /// free nothing), counted as lost; whether any are left.
    fn drop_run_out(&self) -> bool {
        let now = Instant::now();
        let mut lost = 0;
        let mut pending = lock(&self.pending);
        pending.retain(|release| {
            let keep = release.carriers > 0 || release.runs_out > now;
            lost += u64::from(!keep && release.granted);
            keep
        });
        self.counts.releases_lost.fetch_add(lost, Ordering::Relaxed);
        !pending.is_empty()
    }

    /// How long the task waits before it tries again after a command
    /// failed: the backoff, and never less than a command's timeout.
    fn retry_delay(&self) -> Duration {
        self.ceiling.backoff.max(self.ceiling.timeout)
    }

    pub(super) fn live(&self, token: String, until: Instant) {
        if self.ceiling.renew {
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
    /// shut down). An error outside a runtime.
    pub(super) fn connection(self: &Arc<Self>) -> Result<Connection, ::redis::RedisError> {
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
        let connection = self.ceiling.store.connect(self.ceiling.timeout)?;
        let task = runtime.spawn(run(self.clone(), connection.clone()));
        *running = Some(Running {
            task,
            connection: connection.clone(),
        });
        Ok(connection)
    }

    /// The bulkhead is gone: the task sends what is pending, then ends. If
    /// it is not running and this is inside a runtime, it is started for
    /// that; outside one, what is pending runs out.
    pub(super) fn close(self: &Arc<Self>) {
        self.closed.store(true, Ordering::Release);
        if !lock(&self.pending).is_empty() {
            let _ = self.connection();
        }
        self.wake.notify_one();
    }

    /// Sends every release pending: `false` if a command failed (they stay
    /// pending).
    async fn send(&self, connection: &mut Connection) -> bool {
        for carried in self.all() {
            let mut release = RELEASE.key(&self.key);
            release.arg(&self.replica).arg(self.ceiling.weight);
            for token in carried.tokens() {
                release.arg(token);
            }
            let answer = tokio::time::timeout(
                self.ceiling.timeout,
                release.invoke_async::<Vec<u8>>(connection),
            );
            match answer.await {
                Ok(Ok(removed)) => carried.answered(&removed),
                _ => {
                    self.counts.errors.fetch_add(1, Ordering::Relaxed);
                    return false;
                }
            }
        }
        true
    }

    /// Moves each live lease's deadline a lease on. A failed renewal is
    /// tried again next period; a lease it misses runs out and is
    /// reclaimed, as a dead replica's is.
    async fn renew_all(&self, connection: &mut Connection) {
        for tokens in self.to_renew().chunks(BATCH) {
            let mut renew = RENEW.key(&self.key);
            renew.arg(self.lease_ms).arg(tokens);
            let renewed =
                tokio::time::timeout(self.ceiling.timeout, renew.invoke_async::<u64>(connection));
            if !matches!(renewed.await, Ok(Ok(_))) {
                self.counts.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn renew_period(&self) -> Option<Duration> {
        self.ceiling
            .renew
            .then(|| Duration::from_millis((self.lease_ms / 3).max(1)))
    }
}

/// Sends the pending releases whenever one is added (after a failure, not
/// again before the backoff), and renews the live leases every third of a
/// lease; ends once the bulkhead is gone and one last try has been made.
async fn run(outbox: Arc<Outbox>, mut connection: Connection) {
    let period = outbox.renew_period();
    let mut next_renewal = period.map(|period| Instant::now() + period);
    let mut retry_at: Option<Instant> = None;
    // Started again in a later runtime: what the last one left is sent now.
    let mut woken = true;
    loop {
        let closed = outbox.closed.load(Ordering::Acquire);
        let now = Instant::now();
        if closed || (woken && retry_at.is_none_or(|at| at <= now)) {
            if !closed {
                tokio::time::sleep(LINGER).await;
            }
            // Cleared before the pending releases are read: one added after
            // the read wakes the task again.
            outbox.waking.store(false, Ordering::SeqCst);
            let sent = outbox.send(&mut connection).await;
            retry_at = (!sent).then(|| Instant::now() + outbox.retry_delay());
            if closed {
                // Gone, with releases unsent: tried again after each
                // backoff, while the leases they give back may still hold.
                let mut sent = sent;
                while !sent && outbox.drop_run_out() {
                    tokio::time::sleep(outbox.retry_delay()).await;
                    sent = outbox.send(&mut connection).await;
                }
                return;
            }
        }
        if let (Some(at), Some(period)) = (next_renewal, period) {
            if Instant::now() >= at {
                outbox.renew_all(&mut connection).await;
                next_renewal = Some(Instant::now() + period);
            }
        }
        let wake_at = [next_renewal, retry_at].into_iter().flatten().min();
        woken = match wake_at {
            Some(at) => tokio::time::timeout_at(at, outbox.wake.notified())
                .await
                .is_ok(),
            None => {
                outbox.wake.notified().await;
                true
            }
        } || retry_at.is_some_and(|at| at <= Instant::now());
    }
}
