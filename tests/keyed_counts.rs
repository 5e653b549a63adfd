//! Keys and their ceiling count alike: random interleavings of callers
//! that wait and are polled late (or never again), callers that do not,
//! releases, leaked permits, new keys pushing old ones out and clock jumps
//! past `reclaim_after`, through `acquire` and through the layer. After
//! every step the keys together count exactly the admissions the ceiling
//! counts, no key with a call surely within its slot's deadline is evicted,
//! and once everything is dropped nothing is left in flight on either side.
//! Beside them, the cases the sequences found worth a test of their own.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tower_inflight::keyed::{KeyedBulkhead, KeyedConfig, KeyedPermit};
use tower_inflight::{Config, Event, ManualClock, ServiceSaturated, ShedReason};

const LONG: Duration = Duration::from_secs(30);
const RECLAIM: Duration = Duration::from_secs(1);
const CEILING_WAIT: Duration = Duration::from_millis(500);

type Caller = Pin<Box<dyn Future<Output = Result<KeyedPermit, ServiceSaturated>> + Send>>;

fn poll_once(caller: &mut Caller) -> Poll<Result<KeyedPermit, ServiceSaturated>> {
    let waker = futures_util::task::noop_waker();
    caller.as_mut().poll(&mut Context::from_waker(&waker))
}

/// A caller of `key` polled once, and parked.
fn parked(keyed: &KeyedBulkhead<u32>, key: u32) -> Caller {
    let keyed = keyed.clone();
    let mut caller: Caller = Box::pin(async move { keyed.acquire(&key).await });
    assert!(poll_once(&mut caller).is_pending());
    caller
}

/// The permit of `caller`, which must be admitted at this poll.
fn admitted_now(caller: &mut Caller) -> KeyedPermit {
    match poll_once(caller) {
        Poll::Ready(Ok(permit)) => permit,
        other => panic!(
            "not admitted: {:?}",
            other.map(|o| o.map(drop).map_err(|s| s.reason()))
        ),
    }
}

/// A tiny deterministic PRNG (xorshift).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[derive(Default)]
struct Counts {
    admitted: AtomicU64,
    rejected: AtomicU64,
}

fn counting(counts: &Arc<Counts>) -> impl Fn(&Event) + Send + Sync + 'static {
    let counts = counts.clone();
    move |event| match event {
        Event::Admitted => {
            counts.admitted.fetch_add(1, Ordering::SeqCst);
        }
        Event::Rejected { .. } => {
            counts.rejected.fetch_add(1, Ordering::SeqCst);
        }
        _ => {}
    }
}

/// Keys of 2 slots (400 ms to wait for one) under a ceiling of `ceiling_limit`
/// (500 ms), at most 3 keys, on `clock`; each side's events counted.
fn counted(
    clock: &ManualClock,
    per_key: &Arc<Counts>,
    ceiling: &Arc<Counts>,
    ceiling_limit: usize,
) -> KeyedConfig<u32> {
    KeyedConfig::new(
        Config::new(2, RECLAIM)
            .wait(Duration::from_millis(400))
            .clock(clock.clone())
            .on_event(counting(per_key)),
    )
    .ceiling(
        Config::new(ceiling_limit, RECLAIM)
            .wait(CEILING_WAIT)
            .clock(clock.clone())
            .on_event(counting(ceiling)),
    )
    .max_keys(3)
}

fn key_in_flight(keyed: &KeyedBulkhead<u32>) -> usize {
    keyed
        .status(64)
        .busiest
        .iter()
        .map(|key| key.in_flight)
        .sum()
}

/// Random interleavings of callers that wait (polled late, or never again),
/// callers that do not, releases, leaks, new keys pushing old ones out and
/// clock jumps past `reclaim_after`: the keys together count exactly the
/// admissions the ceiling counts; a key with a call in flight on a slot
/// surely within its deadline is never evicted; and once everything is
/// dropped nothing is left counted in flight on either side.
#[tokio::test(start_paused = true)]
async fn late_polls_and_reclaims_keep_keys_and_ceiling_counting_alike() {
    for seed in 1..=1500u64 {
        let clock = ManualClock::new();
        let (per_key, ceiling) = (Arc::new(Counts::default()), Arc::new(Counts::default()));
        let keyed: KeyedBulkhead<u32> = KeyedBulkhead::new(
            counted(&clock, &per_key, &ceiling, 3)
                .guarantee_per_key(|key: &u32| usize::from(*key == 0)),
        );
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        // Each with its key and the clock (ms) when it was made: its slots
        // are claimed no earlier.
        let mut callers: Vec<(Caller, u32, u64)> = Vec::new();
        let mut permits: Vec<(KeyedPermit, u32, u64)> = Vec::new();
        let mut now_ms = 0u64;
        let mut leaked = false;
        let mut log = Vec::new();
        for _ in 0..100 {
            let op = rng.below(11);
            log.push(op);
            match op {
                0 | 1 => {
                    let key = rng.below(4) as u32;
                    let keyed = keyed.clone();
                    callers.push((
                        Box::pin(async move { keyed.acquire(&key).await }),
                        key,
                        now_ms,
                    ));
                }
                2 | 3 if !callers.is_empty() => {
                    let at = rng.below(callers.len());
                    if let Poll::Ready(outcome) = poll_once(&mut callers[at].0) {
                        let (_, key, made) = callers.swap_remove(at);
                        if let Ok(permit) = outcome {
                            permits.push((permit, key, made));
                        }
                    }
                }
                4 if !callers.is_empty() => {
                    let at = rng.below(callers.len());
                    drop(callers.swap_remove(at));
                }
                5 if !permits.is_empty() => {
                    let at = rng.below(permits.len());
                    drop(permits.swap_remove(at));
                }
                6 => {
                    let jump = [100, 600, 1_200][rng.below(3)];
                    clock.advance(Duration::from_millis(jump));
                    now_ms += jump;
                }
                7 => {
                    let jump = [100, 300, 600][rng.below(3)];
                    tokio::time::advance(Duration::from_millis(jump)).await;
                }
                8 | 9 => {
                    let key = rng.below(5) as u32;
                    if let Ok(permit) = keyed.try_acquire(&key) {
                        permits.push((permit, key, now_ms));
                    }
                }
                10 if !permits.is_empty() && rng.below(4) == 0 => {
                    let at = rng.below(permits.len());
                    std::mem::forget(permits.swap_remove(at).0);
                    leaked = true;
                }
                _ => {}
            }
            let (k, c) = (
                per_key.admitted.load(Ordering::SeqCst),
                ceiling.admitted.load(Ordering::SeqCst),
            );
            assert_eq!(
                k, c,
                "seed {seed}: keys counted {k} admissions, the ceiling {c} (ops {log:?})"
            );
            // Permits surely within their key slot's deadline: their key
            // is held, and counts them.
            let status = keyed.status(64);
            for key in 0..5u32 {
                let fresh = permits
                    .iter()
                    .filter(|(_, of, made)| *of == key && now_ms + 20 < made + 1_000)
                    .count();
                let counted = status
                    .busiest
                    .iter()
                    .find(|status| status.key == key)
                    .map_or(0, |status| status.in_flight);
                assert!(
                    counted >= fresh,
                    "seed {seed}: key {key} has {fresh} calls in flight within their deadline, \
                     its bulkhead counts {counted} (evicted: {}; ops {log:?})",
                    status.evicted
                );
            }
        }
        // Everything resolves: callers polled to the end (their budgets
        // spent), then dropped with the permits.
        tokio::time::advance(Duration::from_secs(2)).await;
        for (mut caller, key, made) in callers.drain(..) {
            for _ in 0..4 {
                if let Poll::Ready(outcome) = poll_once(&mut caller) {
                    if let Ok(permit) = outcome {
                        permits.push((permit, key, made));
                    }
                    break;
                }
            }
        }
        let (k, c) = (
            per_key.admitted.load(Ordering::SeqCst),
            ceiling.admitted.load(Ordering::SeqCst),
        );
        assert_eq!(k, c, "seed {seed}: {k} vs {c} (ops {log:?})");
        drop(permits);
        let ceiling_bulkhead = keyed.ceiling().unwrap();
        assert_eq!(
            ceiling_bulkhead.status().totals.admitted,
            c,
            "seed {seed}: the ceiling's totals disagree with its events"
        );
        if leaked {
            continue;
        }
        assert_eq!(
            (ceiling_bulkhead.in_flight(), ceiling_bulkhead.waiting()),
            (0, 0),
            "seed {seed}: the ceiling counts slots held after every call ended (ops {log:?})"
        );
        assert_eq!(
            key_in_flight(&keyed),
            0,
            "seed {seed}: keys count slots held after every call ended (ops {log:?})"
        );
    }
}

/// A caller woken late with both its key's slot and the ceiling's lapsed:
/// its key's slot is claimed afresh, then the ceiling's cannot be (the
/// ceiling's lapsed slot went to the next in its line): shed by the
/// ceiling, the key's fresh slot given back uncounted, and both gauges
/// even.
#[tokio::test(start_paused = true)]
async fn a_fresh_key_slot_given_back_when_the_ceiling_cannot_renew_leaves_both_even() {
    let clock = ManualClock::new();
    let (per_key, ceiling_counts) = (Arc::new(Counts::default()), Arc::new(Counts::default()));
    let keyed: KeyedBulkhead<u32> = KeyedBulkhead::new(
        KeyedConfig::new(
            Config::new(2, RECLAIM)
                .clock(clock.clone())
                .on_event(counting(&per_key)),
        )
        .ceiling(
            Config::new(1, RECLAIM)
                .wait(CEILING_WAIT)
                .clock(clock.clone())
                .on_event(counting(&ceiling_counts)),
        ),
    );
    let ceiling = keyed.ceiling().unwrap().clone();
    let held = ceiling.try_acquire().unwrap();
    let mut first = parked(&keyed, 1);
    let mut second = parked(&keyed, 2);
    assert_eq!(ceiling.waiting(), 2);
    // The ceiling's slot is handed to `first`, whose task runs late.
    drop(held);
    clock.advance(RECLAIM * 2);
    let outcome = match poll_once(&mut first) {
        Poll::Ready(outcome) => outcome,
        Poll::Pending => panic!("first was handed its slot"),
    };
    // Its lapsed ceiling slot went on to `second`: `first` cannot renew.
    assert_eq!(
        outcome.as_ref().map(drop).map_err(ServiceSaturated::reason),
        Err(ShedReason::LimitReached)
    );
    drop(outcome);
    let second = admitted_now(&mut second);
    assert_eq!(ceiling.in_flight(), 1);
    assert_eq!(key_in_flight(&keyed), 1, "key 1's fresh slot went back");
    assert_eq!(
        per_key.admitted.load(Ordering::SeqCst),
        ceiling_counts.admitted.load(Ordering::SeqCst) - 1 // `held`, taken directly
    );
    drop(second);
    assert_eq!((ceiling.in_flight(), key_in_flight(&keyed)), (0, 0));
}

/// Cancellation at the ceiling's await with the ceiling's slot already
/// handed over: both slots go back, the next in line gets the ceiling's,
/// and the turn is given back.
#[tokio::test(start_paused = true)]
async fn a_caller_dropped_after_its_ceiling_slot_was_handed_over_gives_both_back() {
    let keyed: KeyedBulkhead<u32> = KeyedBulkhead::new(
        KeyedConfig::new(Config::new(1, LONG)).ceiling(Config::new(1, LONG).wait(CEILING_WAIT)),
    );
    let ceiling = keyed.ceiling().unwrap().clone();
    let held = keyed.try_acquire(&9).unwrap();
    let first = parked(&keyed, 1);
    let mut second = parked(&keyed, 2);
    drop(held);
    drop(first);
    let second = admitted_now(&mut second);
    assert_eq!(ceiling.in_flight(), 1);
    assert_eq!(key_in_flight(&keyed), 1);
    assert!(keyed.try_acquire(&1).is_err(), "the ceiling is full");
    drop(second);
    assert!(keyed.try_acquire(&1).is_ok());
}

/// The ceiling's status counts its waiting callers by priority -1 (below
/// share) and 0 (in turn), however far the virtual time has gone, and
/// below-share callers are served first, then turns.
#[tokio::test(start_paused = true)]
async fn the_ceiling_counts_waiting_callers_as_minus_one_and_zero_and_serves_shares_first() {
    let keyed: KeyedBulkhead<u32> = KeyedBulkhead::new(
        KeyedConfig::new(Config::new(8, LONG).wait(CEILING_WAIT))
            .ceiling(Config::new(1, LONG).wait(CEILING_WAIT))
            .guarantee_per_key(|key: &u32| usize::from(*key == 7)),
    );
    let ceiling = keyed.ceiling().unwrap().clone();
    // Some history: the virtual time moves on.
    for _ in 0..50 {
        let held = keyed.try_acquire(&1).unwrap();
        let mut waiting: Vec<Option<Caller>> = (0..3)
            .map(|_| {
                let keyed = keyed.clone();
                Some(Box::pin(async move { keyed.acquire(&1).await }) as Caller)
            })
            .collect();
        for caller in waiting.iter_mut().flatten() {
            assert!(poll_once(caller).is_pending());
        }
        drop(held);
        for _ in 0..3 {
            for slot in &mut waiting {
                if let Some(caller) = slot {
                    if let Poll::Ready(outcome) = poll_once(caller) {
                        drop(outcome.unwrap());
                        *slot = None;
                    }
                }
            }
        }
        assert!(waiting.iter().all(Option::is_none));
        waiting.clear();
    }
    let held = keyed.try_acquire(&9).unwrap();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut callers = Vec::new();
    for key in [1u32, 2, 7, 3, 4] {
        let keyed = keyed.clone();
        let order = order.clone();
        let mut caller: Pin<Box<dyn Future<Output = ()> + Send>> = Box::pin(async move {
            let permit = keyed.acquire(&key).await.unwrap();
            order.lock().unwrap().push(key);
            drop(permit);
        });
        let waker = futures_util::task::noop_waker();
        assert!(caller
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_pending());
        callers.push(Some(caller));
    }
    let by_priority = ceiling.status().waiting_by_priority;
    assert_eq!(
        by_priority.into_iter().collect::<Vec<_>>(),
        vec![(-1, 1), (0, 4)]
    );
    drop(held);
    let waker = futures_util::task::noop_waker();
    for _ in 0..7 {
        for slot in &mut callers {
            if let Some(caller) = slot {
                if caller
                    .as_mut()
                    .poll(&mut Context::from_waker(&waker))
                    .is_ready()
                {
                    *slot = None;
                }
            }
        }
    }
    // Key 7 below its share first; then the new keys at the virtual time,
    // in the order they came; key 1, served just before, last.
    assert_eq!(*order.lock().unwrap(), vec![7, 2, 3, 4, 1]);
    assert!(ceiling.status().waiting_by_priority.is_empty());
}

mod layer {
    use super::*;
    use tokio::sync::oneshot;
    use tower::{service_fn, BoxError, Service, ServiceBuilder};
    use tower_inflight::keyed::KeyedConcurrencyLayer;

    type Request = (u32, oneshot::Receiver<()>);
    type Response = Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>>;

    /// The layer's path (`start`, then the ceiling waited for in the
    /// response future, which may be polled late or never): the same
    /// counts as for `acquire`.
    #[tokio::test(start_paused = true)]
    async fn layer_calls_polled_late_keep_keys_and_ceiling_counting_alike() {
        for seed in 1..=800u64 {
            let clock = ManualClock::new();
            let (per_key, ceiling) = (Arc::new(Counts::default()), Arc::new(Counts::default()));
            let layer = KeyedConcurrencyLayer::new(
                counted(&clock, &per_key, &ceiling, 2),
                |request: &Request| request.0,
            );
            let keyed = layer.bulkhead();
            let mut service = ServiceBuilder::new().layer(layer).service(service_fn(
                |(_, done): Request| async move {
                    let _ = done.await;
                    Ok::<_, BoxError>(())
                },
            ));
            let mut rng = Rng(seed.wrapping_mul(0xD1B5_4A32_D192_ED03) | 1);
            let mut calls: Vec<(Response, Option<oneshot::Sender<()>>)> = Vec::new();
            let mut held: Vec<KeyedPermit> = Vec::new();
            let mut log = Vec::new();
            let waker = futures_util::task::noop_waker();
            for _ in 0..80 {
                let op = rng.below(9);
                log.push(op);
                match op {
                    0 | 1 => {
                        let (tx, rx) = oneshot::channel();
                        let key = rng.below(4) as u32;
                        let response: Response = Box::pin(service.call((key, rx)));
                        calls.push((response, Some(tx)));
                    }
                    2 | 3 if !calls.is_empty() => {
                        let at = rng.below(calls.len());
                        if calls[at]
                            .0
                            .as_mut()
                            .poll(&mut Context::from_waker(&waker))
                            .is_ready()
                        {
                            drop(calls.swap_remove(at));
                        }
                    }
                    4 if !calls.is_empty() => {
                        // Cancelled, or its inner call let finish.
                        let at = rng.below(calls.len());
                        if rng.below(2) == 0 {
                            drop(calls.swap_remove(at));
                        } else {
                            calls[at].1.take();
                        }
                    }
                    5 => {
                        let jump = [100, 600, 1_200][rng.below(3)];
                        clock.advance(Duration::from_millis(jump));
                    }
                    6 => {
                        let jump = [100, 300, 600][rng.below(3)];
                        tokio::time::advance(Duration::from_millis(jump)).await;
                    }
                    7 => {
                        if let Ok(permit) = keyed.try_acquire(&(rng.below(5) as u32)) {
                            held.push(permit);
                        }
                    }
                    8 if !held.is_empty() => {
                        let at = rng.below(held.len());
                        drop(held.swap_remove(at));
                    }
                    _ => {}
                }
                let (k, c) = (
                    per_key.admitted.load(Ordering::SeqCst),
                    ceiling.admitted.load(Ordering::SeqCst),
                );
                assert_eq!(k, c, "seed {seed}: keys {k}, ceiling {c} (ops {log:?})");
            }
            tokio::time::advance(Duration::from_secs(2)).await;
            for (mut call, done) in calls.drain(..) {
                drop(done);
                for _ in 0..4 {
                    if call
                        .as_mut()
                        .poll(&mut Context::from_waker(&waker))
                        .is_ready()
                    {
                        break;
                    }
                }
            }
            drop(held);
            let (k, c) = (
                per_key.admitted.load(Ordering::SeqCst),
                ceiling.admitted.load(Ordering::SeqCst),
            );
            assert_eq!(k, c, "seed {seed}: keys {k}, ceiling {c} (ops {log:?})");
            let ceiling = keyed.ceiling().unwrap();
            assert_eq!(
                (ceiling.in_flight(), ceiling.waiting()),
                (0, 0),
                "seed {seed} (ops {log:?})"
            );
            assert_eq!(key_in_flight(&keyed), 0, "seed {seed} (ops {log:?})");
        }
    }
}
