//! The bulkhead allocates nothing per call in steady state: not to admit a
//! call, not to release it, not to shed it.
//!
//! A counting global allocator counts each thread's allocations apart, so the
//! test harness's own threads do not blur what a test's loop allocates.

// A global allocator is an `unsafe impl`; the library itself forbids `unsafe`.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::convert::Infallible;
use std::future::{ready, Future};
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tower::{service_fn, Layer, Service};
use tower_inflight::{Bulkhead, ConcurrencyLayer, Config};

struct CountingAllocator;

thread_local! {
    // `const` and free of `Drop`: reading it never allocates, which a
    // counter inside the allocator depends on.
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
    /// Bytes allocated and not freed, by this thread.
    static BYTES: Cell<isize> = const { Cell::new(0) };
}

fn count_one() {
    ALLOCATIONS.with(|count| count.set(count.get() + 1));
}

fn count_bytes(bytes: isize) {
    BYTES.with(|count| count.set(count.get() + bytes));
}

// SAFETY: every call forwards to the system allocator unchanged; the
// counter is the only addition.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_one();
        count_bytes(layout.size() as isize);
        System.alloc(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count_bytes(-(layout.size() as isize));
        System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_one();
        count_bytes(new_size as isize - layout.size() as isize);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

fn allocations_during(mut work: impl FnMut()) -> usize {
    work(); // warm up: thread-locals, lazily built statics
    let before = ALLOCATIONS.with(Cell::get);
    for _ in 0..1_000 {
        work();
    }
    ALLOCATIONS.with(Cell::get) - before
}

fn poll_once<F: Future>(future: F) -> Poll<F::Output> {
    let mut future = pin!(future);
    future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
}

fn config() -> Config {
    Config::new(4, Duration::from_secs(30)).name("alloc")
}

#[test]
fn admitting_and_releasing_a_permit_allocates_nothing() {
    let bulkhead = Bulkhead::new(config());
    let count = allocations_during(|| drop(bulkhead.try_acquire().unwrap()));
    assert_eq!(count, 0);
}

#[test]
fn shedding_from_a_full_bulkhead_allocates_nothing() {
    let bulkhead = Bulkhead::new(config());
    let _held: Vec<_> = (0..4).map(|_| bulkhead.try_acquire().unwrap()).collect();
    let count = allocations_during(|| assert!(bulkhead.try_acquire().is_err()));
    assert_eq!(count, 0);
}

#[test]
fn a_call_through_the_layer_allocates_nothing() {
    let layer = ConcurrencyLayer::new(config());
    let mut service = layer.layer(service_fn(|x: u64| ready(Ok::<_, Infallible>(x))));
    let count = allocations_during(|| {
        assert!(matches!(
            poll_once(std::future::poll_fn(|cx| service.poll_ready(cx))),
            Poll::Ready(Ok(()))
        ));
        assert!(matches!(poll_once(service.call(7)), Poll::Ready(Ok(7))));
    });
    assert_eq!(count, 0);
    assert_eq!(layer.bulkhead().in_flight(), 0);
}

#[test]
fn an_acquire_that_does_not_wait_allocates_nothing() {
    let bulkhead = Bulkhead::new(config().wait(Duration::from_millis(10)));
    let count = allocations_during(|| {
        assert!(matches!(poll_once(bulkhead.acquire()), Poll::Ready(Ok(_))));
    });
    assert_eq!(count, 0);
}

#[test]
fn a_shed_call_through_the_layer_allocates_only_its_boxed_error() {
    let layer = ConcurrencyLayer::new(config());
    let bulkhead = layer.bulkhead();
    let _held: Vec<_> = (0..4).map(|_| bulkhead.try_acquire().unwrap()).collect();
    let mut service = layer.layer(service_fn(|x: u64| ready(Ok::<_, Infallible>(x))));
    let count = allocations_during(|| {
        assert!(matches!(
            poll_once(std::future::poll_fn(|cx| service.poll_ready(cx))),
            Poll::Ready(Ok(()))
        ));
        assert!(matches!(poll_once(service.call(7)), Poll::Ready(Err(_))));
    });
    // `Concurrency`'s error type is `BoxError`: boxing `ServiceSaturated`
    // is one allocation, and nothing else allocates.
    assert_eq!(count, 1_000);
}

#[test]
fn a_classified_call_and_a_borrowed_or_weighted_permit_allocate_nothing() {
    let layer = ConcurrencyLayer::new(config()).classify(|_: &u64| tower_inflight::Ticket::new());
    let bulkhead = layer.bulkhead();
    let mut service =
        tower::Layer::layer(&layer, service_fn(|x: u64| ready(Ok::<_, Infallible>(x))));
    let count = allocations_during(|| {
        assert!(matches!(
            poll_once(std::future::poll_fn(|cx| service.poll_ready(cx))),
            Poll::Ready(Ok(()))
        ));
        assert!(matches!(poll_once(service.call(7)), Poll::Ready(Ok(7))));
        drop(bulkhead.try_acquire_borrowed().unwrap());
        drop(bulkhead.try_acquire_weighted(1).unwrap());
    });
    assert_eq!(count, 0);
    assert_eq!(bulkhead.in_flight(), 0);
}

/// Bytes of heap a bulkhead of `limit` slots keeps.
fn heap_of(limit: usize) -> isize {
    let before = BYTES.with(Cell::get);
    let bulkhead = Bulkhead::new(Config::new(limit, Duration::from_secs(30)));
    let kept = BYTES.with(Cell::get) - before;
    drop(bulkhead);
    kept
}

#[test]
fn each_slot_takes_at_most_16_bytes_at_any_limit() {
    // From a limit of 64 up, what a bulkhead keeps beside its slots no
    // longer grows with the limit (a small one has fewer refusal lanes).
    let fixed = heap_of(64);
    for limit in [1024, 65_536, 1 << 20] {
        let bytes = (heap_of(limit) - fixed) as f64 / (limit - 64) as f64;
        assert!(bytes <= 16.0, "{bytes:.2} bytes a slot at limit {limit}");
    }
}

/// A bulkhead of a few slots keeps one refusal lane, boxes the settings
/// it does not have and allocates its waiting line when a caller first
/// waits: under 1 KiB of heap at limit 4, its configuration and history of
/// minutes included (under 2 KiB with the metrics' handles, every feature
/// on). A key's bulkhead, which shares its configuration and keeps no
/// history, is bounded in `src/bulkhead/shared.rs`.
#[test]
fn a_bulkhead_of_four_slots_keeps_under_one_kib() {
    let bytes = heap_of(4);
    let most = if cfg!(feature = "metrics") {
        2048
    } else {
        1024
    };
    assert!(bytes < most, "{bytes} bytes at limit 4");
    assert!(bytes < heap_of(16), "{bytes} bytes at limit 4");
}

/// A key held already costs its calls no allocation, admitted or shed, by
/// its own limit or by the ceiling's.
#[test]
fn a_call_of_a_key_held_already_allocates_nothing_admitted_or_shed() {
    use tower_inflight::keyed::{KeyedBulkhead, KeyedConfig};
    let keyed = KeyedBulkhead::new(
        KeyedConfig::new(config())
            .ceiling(Config::new(6, Duration::from_secs(30)).name("alloc-ceiling")),
    );
    let admitted = allocations_during(|| drop(keyed.try_acquire(&1u64).unwrap()));
    assert_eq!(admitted, 0);
    let _full: Vec<_> = (0..4).map(|_| keyed.try_acquire(&1u64).unwrap()).collect();
    let shed_by_key = allocations_during(|| assert!(keyed.try_acquire(&1u64).is_err()));
    assert_eq!(shed_by_key, 0);
    let _rest: Vec<_> = (0..2).map(|_| keyed.try_acquire(&2u64).unwrap()).collect();
    let shed_by_ceiling = allocations_during(|| assert!(keyed.try_acquire(&2u64).is_err()));
    assert_eq!(shed_by_ceiling, 0);
}
