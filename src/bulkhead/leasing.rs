//! A ceiling's step in a caller's admission: after its local slots, a
//! lease (see [`ceiling`](crate::ceiling)).

use crate::bulkhead::Shared;
use crate::ceiling::{Admit, Asking, HeldLease, Leased};
use crate::config::Config;
use crate::error::ShedReason;
use crate::slots::Claim;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use tokio::sync::futures::OwnedNotified;
use tokio::sync::Notify;

/// A bulkhead's ceiling, and the leases its permits hold.
pub(crate) struct Leases {
    ceiling: Arc<dyn Admit>,
    /// The leases of the claims that hold one, by claim (its entry and the
    /// word it wrote, unique among claims): a permit carries no lease of
    /// its own, so that without a ceiling it is no larger. Each goes back
    /// with its claim: a bulkhead with a ceiling looks every claim up as it
    /// goes back.
    held: Mutex<HashMap<(usize, u64), HeldLease>>,
    /// Wakes the callers asking for a lease when the bulkhead is closed or
    /// its waiting callers cancelled.
    turned_away: Arc<Notify>,
    /// How many times the bulkhead's waiting callers were cancelled.
    cancels: AtomicU64,
}

impl Leases {
    /// The ceiling of a bulkhead built from `config`, if it has one.
    pub(crate) fn new(config: &Config) -> Option<Self> {
        let ceiling = config.ceiling.clone()?.install(config);
        Some(Self {
            ceiling,
            held: Mutex::default(),
            turned_away: Arc::default(),
            cancels: AtomicU64::new(0),
        })
    }

    /// The ceiling's answer to a call that may not wait for a round trip.
    pub(crate) fn try_acquire(&self) -> Result<Option<HeldLease>, ShedReason> {
        self.ceiling
            .try_acquire()
            .map_err(|refused| refused.reason())
    }

    /// `claim`'s permit holds `lease`, until the claim goes back.
    pub(crate) fn hold(&self, claim: &Claim, lease: HeldLease) {
        self.lock().insert(key(claim), lease);
    }

    /// Gives back `claim`'s lease.
    pub(crate) fn give_back(&self, claim: &Claim) {
        // Dropped out of the lock: giving it back is the ceiling's code.
        let lease = self.lock().remove(&key(claim));
        drop(lease);
    }

    /// Gives back the leases of claims that `holds` says are gone: freed by
    /// a sweep or a reset, whose permits, leaked, will never give them back.
    pub(crate) fn give_back_freed(&self, holds: impl Fn(usize, u64) -> bool) {
        let mut held = self.lock();
        let gone: Vec<_> = held
            .keys()
            .copied()
            .filter(|&(index, word)| !holds(index, word))
            .collect();
        let freed: Vec<HeldLease> = gone.iter().filter_map(|key| held.remove(key)).collect();
        drop(held);
        // Dropped out of the lock: giving them back is the ceiling's code.
        drop(freed);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(usize, u64), HeldLease>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wakes the callers asking for a lease, to see that they are turned
    /// away: the bulkhead was closed (recorded by its waiters already), or
    /// its waiting callers `cancelled`.
    pub(crate) fn turn_away(&self, cancelled: bool) {
        if cancelled {
            // Relaxed: read by callers that poll it, with no data behind it.
            self.cancels.fetch_add(1, Ordering::Relaxed);
        }
        self.turned_away.notify_waiters();
    }

    /// A wake-up for the next [`turn_away`](Self::turn_away), listening
    /// from now.
    fn listen_for_turn_away(&self) -> Pin<Box<OwnedNotified>> {
        let mut woken = Box::pin(self.turned_away.clone().notified_owned());
        woken.as_mut().enable();
        woken
    }

    fn cancels(&self) -> u64 {
        self.cancels.load(Ordering::Relaxed)
    }

    pub(crate) fn ceiling(&self) -> &dyn Admit {
        &*self.ceiling
    }
}

fn key(claim: &Claim) -> (usize, u64) {
    (claim.index(), claim.word())
}

/// A lease being asked for, by a caller that holds its local slots.
pub(crate) struct Leasing {
    /// The ceiling's count of `cancel_waiting` calls when the lease was
    /// first asked for: a caller asking is waiting too, and is turned away.
    cancels_seen: u64,
    /// In a mutex only to be `Sync` (axum wants its services to be, and a
    /// service may hold this while `poll_ready` waits): it is only ever
    /// reached through `&mut`, with `get_mut`, which takes no lock.
    asking: Mutex<Asking>,
    /// Woken by a close or a cancel, which `turned_away` then sees.
    woken: Pin<Box<OwnedNotified>>,
}

impl Leasing {
    /// The lease a caller that has its local slots must take next, if its
    /// bulkhead has a ceiling; it may ask again until `deadline` while the
    /// ceiling is full.
    pub(crate) fn start(shared: &Shared, deadline: Option<tokio::time::Instant>) -> Option<Self> {
        let leases = shared.leases()?;
        Some(Self {
            // Listening before the count is read: a cancel after the read
            // wakes this caller.
            woken: leases.listen_for_turn_away(),
            cancels_seen: leases.cancels(),
            asking: Mutex::new(leases.ceiling.clone().acquire(deadline)),
        })
    }

    /// Why the caller is turned away before its lease comes, if it is: the
    /// bulkhead was closed, or its waiting callers cancelled. Wakes the
    /// caller when that happens.
    pub(crate) fn turned_away(
        &mut self,
        shared: &Shared,
        cx: &mut Context<'_>,
    ) -> Option<ShedReason> {
        let leases = shared.leases()?;
        // Woken once, by a close or a cancel that may have come before
        // this caller read its count: listen again, for the next one.
        while self.woken.as_mut().poll(cx).is_ready() {
            self.woken = leases.listen_for_turn_away();
        }
        if shared.waiters().is_closed() {
            Some(ShedReason::Closed)
        } else if leases.cancels() != self.cancels_seen {
            Some(ShedReason::Cancelled)
        } else {
            None
        }
    }

    pub(crate) fn poll(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<HeldLease>, ShedReason>> {
        let asking = self
            .asking
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        asking
            .as_mut()
            .poll(cx)
            .map(|leased: Leased| leased.map_err(|refused| refused.reason()))
    }
}
