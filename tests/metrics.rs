//! Each event moves exactly the metric it should, with the right labels,
//! seen through `metrics-util`'s debugging recorder.

mod support;

use support::spawn_acquire;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::MetricKind;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower_inflight::{Bulkhead, Config, Event, ManualClock, ShedReason, Ticket};

/// Builds a bulkhead whose metrics go to a recorder of its own.
fn recorded(config: Config) -> (Bulkhead, Snapshotter) {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let bulkhead = metrics::with_local_recorder(&recorder, || Bulkhead::new(config));
    (bulkhead, snapshotter)
}

/// A metric's kind, name and sorted labels.
type Key = (MetricKind, String, Vec<(String, String)>);
type Values = HashMap<Key, f64>;

/// One snapshot, keyed by (kind, name, labels). Counters and gauges read
/// back as their values; histograms as their number of samples.
fn snapshot(snapshotter: &Snapshotter) -> Values {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let (kind, key) = key.into_parts();
            let mut labels: Vec<(String, String)> = key
                .labels()
                .map(|label| (label.key().to_owned(), label.value().to_owned()))
                .collect();
            labels.sort();
            let value = match value {
                DebugValue::Counter(n) => n as f64,
                DebugValue::Gauge(v) => v.into_inner(),
                DebugValue::Histogram(samples) => samples.len() as f64,
            };
            ((kind, key.name().to_owned(), labels), value)
        })
        .collect()
}

fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut labels: Vec<_> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    labels.sort();
    labels
}

fn value(snapshot: &Values, kind: MetricKind, name: &str, pairs: &[(&str, &str)]) -> f64 {
    *snapshot
        .get(&(kind, name.to_owned(), labels(pairs)))
        .unwrap_or_else(|| panic!("no {kind:?} {name} {pairs:?} in {snapshot:#?}"))
}

fn config(limit: usize) -> Config {
    Config::new(limit, Duration::from_secs(30)).name("db")
}

const DB: &[(&str, &str)] = &[("service", "db")];

/// A recorded bulkhead of `limit` slots, one of them held by a permit that
/// was forgotten and has outlived `reclaim_after`.
fn with_an_expired_leak(limit: usize) -> (Bulkhead, Snapshotter) {
    let clock = ManualClock::new();
    let (bulkhead, snapshotter) = recorded(config(limit).clock(clock.clone()));
    std::mem::forget(bulkhead.try_acquire().unwrap());
    clock.advance(Duration::from_secs(30));
    (bulkhead, snapshotter)
}

#[test]
fn admitted_calls_count_and_the_in_flight_gauge_follows_them() {
    let (bulkhead, snapshotter) = recorded(config(4));
    // The first admission on a thread is sampled for the hold time.
    let first = bulkhead.try_acquire().unwrap();
    let second = bulkhead.try_acquire().unwrap();
    let third = bulkhead.try_acquire().unwrap();
    drop(first);
    let snapshot = snapshot(&snapshotter);
    assert_eq!(
        value(
            &snapshot,
            MetricKind::Counter,
            "tower_inflight_admitted_total",
            DB
        ),
        3.0
    );
    assert_eq!(
        value(&snapshot, MetricKind::Gauge, "tower_inflight_in_flight", DB),
        2.0
    );
    assert_eq!(
        value(&snapshot, MetricKind::Gauge, "tower_inflight_limit", DB),
        4.0
    );
    assert_eq!(
        value(
            &snapshot,
            MetricKind::Histogram,
            "tower_inflight_hold_seconds",
            DB
        ),
        1.0
    );
    drop((second, third));
}

#[test]
fn each_rejection_counts_under_its_reason_and_nothing_else() {
    let (bulkhead, snapshotter) = recorded(config(1).max_bytes(100));
    let held = bulkhead.try_acquire().unwrap();
    assert!(bulkhead.try_acquire().is_err());
    assert!(bulkhead.try_acquire().is_err());
    drop(held);
    assert!(bulkhead.try_acquire_bytes(101).is_err());
    let snapshot = snapshot(&snapshotter);
    let rejected = |reason: &str| {
        value(
            &snapshot,
            MetricKind::Counter,
            "tower_inflight_rejected_total",
            &[("service", "db"), ("reason", reason)],
        )
    };
    assert_eq!(rejected("limit"), 2.0);
    assert_eq!(rejected("bytes"), 1.0);
    assert_eq!(rejected("wait_expired"), 0.0);
    assert_eq!(rejected("too_many_waiting"), 0.0);
    assert_eq!(
        value(
            &snapshot,
            MetricKind::Gauge,
            "tower_inflight_bytes_reserved",
            DB
        ),
        0.0
    );
}

#[tokio::test(start_paused = true)]
async fn waits_are_timed_and_expired_and_crowded_waits_count_apart() {
    let (bulkhead, snapshotter) =
        recorded(config(1).wait(Duration::from_millis(50)).max_waiting(1));
    let _held = bulkhead.try_acquire().unwrap();
    let waiter = spawn_acquire(&bulkhead, Ticket::new());
    tokio::task::yield_now().await;
    assert!(bulkhead.acquire().await.is_err()); // max_waiting: shed at once
    assert!(waiter.await.unwrap().is_err()); // the budget runs out
    let snapshot = snapshot(&snapshotter);
    let rejected = |reason: &str| {
        value(
            &snapshot,
            MetricKind::Counter,
            "tower_inflight_rejected_total",
            &[("service", "db"), ("reason", reason)],
        )
    };
    assert_eq!(rejected("too_many_waiting"), 1.0);
    assert_eq!(rejected("wait_expired"), 1.0);
    assert_eq!(
        value(
            &snapshot,
            MetricKind::Histogram,
            "tower_inflight_wait_seconds",
            DB
        ),
        1.0
    );
}

#[test]
fn a_reclaimed_slot_counts_once_and_keeps_the_in_flight_gauge_right() {
    let (bulkhead, snapshotter) = with_an_expired_leak(1);
    let reclaimer = bulkhead.try_acquire().unwrap();
    assert!(reclaimer.was_reclaimed());
    let snapshot = snapshot(&snapshotter);
    assert_eq!(
        value(
            &snapshot,
            MetricKind::Counter,
            "tower_inflight_reclaimed_total",
            DB
        ),
        1.0
    );
    assert_eq!(
        value(
            &snapshot,
            MetricKind::Counter,
            "tower_inflight_admitted_total",
            DB
        ),
        2.0
    );
    assert_eq!(
        value(&snapshot, MetricKind::Gauge, "tower_inflight_in_flight", DB),
        1.0
    );
}

#[test]
fn bytes_reserved_gauge_follows_the_budget() {
    let (bulkhead, snapshotter) = recorded(config(4).max_bytes(1000));
    let mut first = bulkhead.try_acquire_bytes(300).unwrap();
    let _second = bulkhead.try_acquire_bytes(200).unwrap();
    let split = first.split_bytes();
    drop(first);
    assert_eq!(
        value(
            &snapshot(&snapshotter),
            MetricKind::Gauge,
            "tower_inflight_bytes_reserved",
            DB
        ),
        500.0
    );
    drop(split);
    assert_eq!(
        value(
            &snapshot(&snapshotter),
            MetricKind::Gauge,
            "tower_inflight_bytes_reserved",
            DB
        ),
        200.0
    );
}

#[test]
fn an_unnamed_bulkhead_is_labelled_bulkhead() {
    let (bulkhead, snapshotter) = recorded(Config::new(1, Duration::from_secs(30)));
    drop(bulkhead.try_acquire().unwrap());
    let snapshot = snapshot(&snapshotter);
    assert_eq!(
        value(
            &snapshot,
            MetricKind::Counter,
            "tower_inflight_admitted_total",
            &[("service", "bulkhead")]
        ),
        1.0
    );
}

#[test]
fn a_weighted_permit_moves_the_in_flight_gauge_by_its_weight_less_the_slots_it_reclaimed() {
    let (bulkhead, snapshotter) = with_an_expired_leak(3);
    // Takes over the leaked slot (counted as held already) and two free ones.
    let heavy = bulkhead.try_acquire_weighted(3).unwrap();
    assert!(heavy.was_reclaimed());
    let snapshot = snapshot(&snapshotter);
    assert_eq!(
        value(&snapshot, MetricKind::Gauge, "tower_inflight_in_flight", DB),
        3.0
    );
    assert_eq!(
        value(
            &snapshot,
            MetricKind::Counter,
            "tower_inflight_reclaimed_total",
            DB
        ),
        1.0
    );
}

#[test]
fn the_in_flight_gauge_returns_to_zero_after_a_weighted_permit_took_over_a_leaked_slot() {
    let (bulkhead, snapshotter) = with_an_expired_leak(3);
    drop(bulkhead.try_acquire_weighted(3).unwrap());
    let snapshot = snapshot(&snapshotter);
    assert_eq!(
        value(&snapshot, MetricKind::Gauge, "tower_inflight_in_flight", DB),
        0.0
    );
}

#[tokio::test(start_paused = true)]
async fn the_saturation_signal_gauge_is_one_while_the_signal_is_up() {
    let (bulkhead, snapshotter) = recorded(
        config(1)
            .wait(Duration::from_millis(50))
            .saturation_signal(1.0, 2, Duration::from_secs(1)),
    );
    let _held = bulkhead.try_acquire().unwrap();
    for _ in 0..2 {
        assert!(bulkhead.acquire().await.is_err());
    }
    assert!(bulkhead.status().saturation_signal);
    let snapshot = snapshot(&snapshotter);
    assert_eq!(
        value(
            &snapshot,
            MetricKind::Gauge,
            "tower_inflight_saturation_signal",
            DB
        ),
        1.0
    );
}

/// Counts the `Reclaimed` and `Admitted` events a bulkhead reports.
#[derive(Clone, Default)]
struct EventCounts {
    reclaimed: Arc<AtomicUsize>,
    admitted: Arc<AtomicUsize>,
}

impl EventCounts {
    fn hook(&self) -> impl Fn(&Event) + Send + Sync + 'static {
        let counts = self.clone();
        move |event| match event {
            Event::Reclaimed => drop(counts.reclaimed.fetch_add(1, Ordering::SeqCst)),
            Event::Admitted => drop(counts.admitted.fetch_add(1, Ordering::SeqCst)),
            _ => {}
        }
    }

    fn reclaimed(&self) -> usize {
        self.reclaimed.load(Ordering::SeqCst)
    }

    fn admitted(&self) -> usize {
        self.admitted.load(Ordering::SeqCst)
    }
}

/// The gauge, the totals and the events agree with the table. (A snapshot
/// of the debugging recorder drains it: one a test.)
fn assert_counts_agree(
    bulkhead: &Bulkhead,
    snapshotter: &Snapshotter,
    events: &EventCounts,
    reclaimed: usize,
) {
    let snapshot = snapshot(snapshotter);
    let gauge = value(&snapshot, MetricKind::Gauge, "tower_inflight_in_flight", DB);
    assert_eq!(gauge, bulkhead.in_flight() as f64, "in-flight gauge");
    let counted = value(
        &snapshot,
        MetricKind::Counter,
        "tower_inflight_reclaimed_total",
        DB,
    );
    assert_eq!(counted, reclaimed as f64, "reclaimed counter");
    assert_eq!(bulkhead.status().totals.reclaimed, reclaimed as u64);
    assert_eq!(events.reclaimed(), reclaimed, "Reclaimed events");
}

#[tokio::test(start_paused = true)]
async fn a_reclaimed_slot_handed_to_a_caller_that_went_away_is_counted_once() {
    let clock = ManualClock::new();
    let events = EventCounts::default();
    let (bulkhead, snapshotter) = recorded(
        config(1)
            .wait(Duration::from_secs(1))
            .clock(clock.clone())
            .on_event(events.hook()),
    );
    std::mem::forget(bulkhead.try_acquire().unwrap());
    let mut waiter = tokio_test::task::spawn(bulkhead.acquire());
    assert!(waiter.poll().is_pending(), "parked");
    clock.advance(Duration::from_secs(30));
    // An arrival hands the reclaimed slot to the caller at the head...
    assert!(bulkhead.try_acquire().is_err());
    // ...which goes away before it polls again.
    drop(waiter);
    assert_eq!(bulkhead.in_flight(), 0);
    assert_counts_agree(&bulkhead, &snapshotter, &events, 1);
    assert_eq!(bulkhead.status().totals.admitted, 1, "only the leak");
}

#[test]
fn a_slot_whose_bytes_were_swept_is_reclaimed_by_its_next_holder_and_counted_once() {
    let clock = ManualClock::new();
    let events = EventCounts::default();
    let (bulkhead, snapshotter) = recorded(
        config(2)
            .max_bytes(1000)
            .clock(clock.clone())
            .on_event(events.hook()),
    );
    // Leaked from another thread, so that its slot is not where this
    // thread's claims start: the next claim lands on the free slot.
    let leaker = bulkhead.clone();
    std::thread::spawn(move || std::mem::forget(leaker.try_acquire_bytes(800).unwrap()))
        .join()
        .unwrap();
    clock.advance(Duration::from_secs(30));
    // The budget is spent by the leak: its bytes are swept up for this call.
    let first = bulkhead.try_acquire_bytes(800).unwrap();
    let second = bulkhead.try_acquire().unwrap();
    assert_eq!(bulkhead.in_flight(), 2);
    assert!(first.was_reclaimed() || second.was_reclaimed());
    assert_counts_agree(&bulkhead, &snapshotter, &events, 1);
    drop((first, second));
    assert_eq!(bulkhead.bytes_reserved(), 0);
    assert_eq!(events.reclaimed(), 1);
}

#[tokio::test]
async fn a_call_refused_for_its_bytes_is_never_counted_as_admitted() {
    let events = EventCounts::default();
    let (bulkhead, snapshotter) = recorded(config(4).max_bytes(1000).on_event(events.hook()));
    let _held = bulkhead.try_acquire_bytes(800).unwrap();
    let shed = bulkhead.try_acquire_bytes(800).unwrap_err();
    assert_eq!(shed.reason(), ShedReason::Bytes);
    let shed = bulkhead.acquire_bytes(800).await.unwrap_err();
    assert_eq!(shed.reason(), ShedReason::Bytes);

    let status = bulkhead.status();
    assert_eq!(status.totals.admitted, 1);
    assert_eq!(status.totals.rejected_bytes, 2);
    assert_eq!(events.admitted(), 1, "Admitted events");
    let snapshot = snapshot(&snapshotter);
    let admitted = value(
        &snapshot,
        MetricKind::Counter,
        "tower_inflight_admitted_total",
        DB,
    );
    assert_eq!(admitted, 1.0);
    let gauge = value(&snapshot, MetricKind::Gauge, "tower_inflight_in_flight", DB);
    assert_eq!((gauge, bulkhead.in_flight()), (1.0, 1));
}

/// A service parked in `poll_ready`, handed a slot, then left for longer
/// than `reclaim_after`: the slot is reclaimed from under it.
fn ready_with_a_handed_slot(
    bulkhead: &Bulkhead,
) -> tower_inflight::Concurrency<
    impl tower::Service<u32, Response = u32, Error = std::convert::Infallible> + Clone,
> {
    use tower::Service;
    let held = bulkhead.try_acquire().unwrap();
    let mut service = tower_inflight::Concurrency::new(
        tower::service_fn(|x: u32| async move { Ok::<_, std::convert::Infallible>(x) }),
        bulkhead.clone(),
    );
    let mut task = tokio_test::task::spawn(());
    assert!(task.enter(|cx, _| service.poll_ready(cx)).is_pending());
    drop(held); // handed to the parked service
    assert!(task.enter(|cx, _| service.poll_ready(cx)).is_ready());
    service
}

#[tokio::test(start_paused = true)]
async fn a_handed_slot_reclaimed_before_its_call_keeps_the_gauge_right() {
    let clock = ManualClock::new();
    let (bulkhead, snapshotter) =
        recorded(config(1).wait(Duration::from_secs(1)).clock(clock.clone()));
    let service = ready_with_a_handed_slot(&bulkhead);
    clock.advance(Duration::from_secs(31));
    let reclaimer = bulkhead.try_acquire().unwrap();
    assert!(reclaimer.was_reclaimed());
    drop(service); // gives back a slot that is no longer its own
    let snapshot = snapshot(&snapshotter);
    let gauge = value(&snapshot, MetricKind::Gauge, "tower_inflight_in_flight", DB);
    assert_eq!((gauge, bulkhead.in_flight()), (1.0, 1));
    drop(reclaimer);
    assert_eq!(bulkhead.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn the_admitted_total_never_goes_back_when_a_handed_slot_is_given_back() {
    let (bulkhead, _snapshotter) = recorded(config(1).wait(Duration::from_secs(1)));
    let service = ready_with_a_handed_slot(&bulkhead);
    let before = bulkhead.status().totals.admitted;
    drop(service);
    let after = bulkhead.status().totals.admitted;
    assert_eq!(
        (before, after),
        (1, 1),
        "only the first holder was admitted"
    );
}

/// A keyed bulkhead reports no series per key, but for the keys its
/// configuration names, each as a bulkhead of its own, and no more than 64
/// of those whatever the keys.
#[test]
fn a_keyed_bulkhead_reports_only_the_keys_it_names_and_a_bounded_number() {
    use tower_inflight::keyed::{KeyedBulkhead, KeyedConfig};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let keyed = KeyedBulkhead::new(
            KeyedConfig::new(Config::new(2, Duration::from_secs(30)).name("tenants"))
                .metrics_per_key(|key: &u32| (*key < 100).then(|| format!("t{key}")))
                .max_keys(1_000),
        );
        let held = keyed.try_acquire(&7).unwrap();
        drop(keyed.try_acquire(&500).unwrap());
        let values = snapshot(&snapshotter);
        assert_eq!(
            values[&(
                MetricKind::Gauge,
                "tower_inflight_in_flight".to_owned(),
                labels(&[("service", "tenants/t7")])
            )],
            1.0
        );
        let services: std::collections::HashSet<String> = values
            .keys()
            .flat_map(|(_, _, labels)| labels.iter())
            .filter(|(name, _)| name == "service")
            .map(|(_, value)| value.clone())
            .collect();
        assert_eq!(services.into_iter().collect::<Vec<_>>(), ["tenants/t7"]);
        // Past 64 labels, new keys report nothing.
        for key in 0..100 {
            drop(keyed.try_acquire(&key).unwrap());
        }
        let services: std::collections::HashSet<String> = snapshot(&snapshotter)
            .keys()
            .flat_map(|(_, _, labels)| labels.iter())
            .filter(|(name, _)| name == "service")
            .map(|(_, value)| value.clone())
            .collect();
        assert_eq!(services.len(), 64);
        drop(held);
    });
}

/// An adaptive limit's moves show in the limit gauge, and its baseline
/// latency in a gauge of its own.
#[test]
fn an_adaptive_limit_moves_its_gauge_and_reports_its_baseline() {
    use tower_inflight::adaptive::{Adaptive, Outcome, Vegas};
    let clock = ManualClock::new();
    let (bulkhead, snapshotter) = recorded(
        config(100)
            .clock(clock.clone())
            .adaptive(Adaptive::new(Vegas::default())),
    );
    let gauge = |name| value(&snapshot(&snapshotter), MetricKind::Gauge, name, DB);
    assert_eq!(gauge("tower_inflight_limit"), 20.0);
    let held: Vec<_> = (0..20).map(|_| bulkhead.try_acquire().unwrap()).collect();
    clock.advance(Duration::from_millis(10));
    for mut permit in held {
        permit.record(Outcome::Success);
    }
    assert!(bulkhead.limit() > 20);
    // One snapshot: the debugging recorder's snapshot takes what it reads.
    let after = snapshot(&snapshotter);
    let gauge = |name| value(&after, MetricKind::Gauge, name, DB);
    assert_eq!(gauge("tower_inflight_limit"), bulkhead.limit() as f64);
    assert_eq!(gauge("tower_inflight_baseline_latency_seconds"), 0.010);
}
