//! The atomics and locks the crate uses, from `std` normally and from `loom`
//! under `cfg(tower_inflight_loom)`, so the same slot-table code runs in
//! loom's models. (Not `cfg(loom)`, which would switch tokio to loom too.)

#[cfg(not(tower_inflight_loom))]
pub(crate) use std::sync::{
    atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering},
    Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard,
};

#[cfg(tower_inflight_loom)]
pub(crate) use loom::sync::{
    atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering},
    Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard,
};

/// Locks `mutex`, ignoring poison: every critical section in this crate
/// leaves its data consistent before anything in it can panic, so a poisoned
/// lock carries no broken invariant, and a request path must never panic.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    #[cfg(not(tower_inflight_loom))]
    {
        mutex
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
    #[cfg(tower_inflight_loom)]
    {
        mutex.lock().unwrap()
    }
}

/// Locks `rw_lock` to read, ignoring poison (see [`lock`]).
pub(crate) fn read<T>(rw_lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    #[cfg(not(tower_inflight_loom))]
    {
        rw_lock
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
    #[cfg(tower_inflight_loom)]
    {
        rw_lock.read().unwrap()
    }
}

/// Locks `rw_lock` to write, ignoring poison (see [`lock`]).
pub(crate) fn write<T>(rw_lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    #[cfg(not(tower_inflight_loom))]
    {
        rw_lock
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
    #[cfg(tower_inflight_loom)]
    {
        rw_lock.write().unwrap()
    }
}

/// Nothing, except under loom: there, a `SeqCst` fence.
///
/// The waiter queue relies on `SeqCst` accesses for a store-buffering
/// pattern (a releaser's compare-and-exchange then load of the parked count,
/// against a waiter's increment of that count then load of the slots; see
/// the slot table's "Memory ordering"). Loom models `SeqCst` fences but not
/// `SeqCst` accesses, which it treats as `AcqRel`; a `SeqCst` fence between
/// the two accesses on each side gives the same guarantee in the C++ model,
/// so the models check the algorithm in that form.
#[inline(always)]
pub(crate) fn loom_seqcst_fence() {
    #[cfg(tower_inflight_loom)]
    loom::sync::atomic::fence(Ordering::SeqCst);
}

/// A hash of the calling thread, from where its stack is: threads' stacks
/// lie megabytes apart, so the address of a local, in units of 2 MiB (the
/// default size of a spawned thread's stack), tells threads apart without a
/// thread-local lookup. Fibonacci hashing: the top bits of the product
/// spread neighbours out. A thread whose stack crosses such a boundary
/// hashes anew, which every user of it tolerates.
#[inline(always)]
pub(crate) fn thread_hash() -> u64 {
    let local = 0_u8;
    let stack = (std::ptr::addr_of!(local) as usize >> 21) as u64;
    stack.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}
