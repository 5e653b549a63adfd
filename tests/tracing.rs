//! The `tracing` feature: a debug event per rejection; a warning per
//! reclaimed slot, per invalid weight and when the saturation signal rises.

use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower_inflight::{Bulkhead, Config, ManualClock};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata, Subscriber};

/// Keeps each event's level and fields.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<(Level, String)>>>);

struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!("{}={:?} ", field.name(), value));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push_str(&format!("{}={} ", field.name(), value));
    }
}

impl Subscriber for Recorder {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        self.0
            .lock()
            .unwrap()
            .push((*event.metadata().level(), fields.0));
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[test]
fn a_rejection_is_a_debug_event_naming_service_limit_and_reason() {
    let recorder = Recorder::default();
    let bulkhead = Bulkhead::new(Config::new(1, Duration::from_secs(30)).name("db"));
    let _held = bulkhead.try_acquire().unwrap();
    tracing::subscriber::with_default(recorder.clone(), || {
        assert!(bulkhead.try_acquire().is_err());
    });
    let events = recorder.0.lock().unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    let (level, fields) = &events[0];
    assert_eq!(*level, Level::DEBUG);
    for expected in ["service=db", "limit=1", "reason=limit"] {
        assert!(fields.contains(expected), "{expected} not in {fields}");
    }
}

#[test]
fn a_reclaimed_slot_is_a_warning() {
    let recorder = Recorder::default();
    let clock = ManualClock::new();
    let bulkhead = Bulkhead::new(
        Config::new(1, Duration::from_secs(30))
            .name("db")
            .clock(clock.clone()),
    );
    std::mem::forget(bulkhead.try_acquire().unwrap());
    clock.advance(Duration::from_secs(30));
    tracing::subscriber::with_default(recorder.clone(), || {
        drop(bulkhead.try_acquire().unwrap());
    });
    let events = recorder.0.lock().unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].0, Level::WARN);
    assert!(events[0].1.contains("service=db"), "{}", events[0].1);
}

#[test]
fn admitted_calls_log_nothing() {
    let recorder = Recorder::default();
    let bulkhead = Bulkhead::new(Config::new(1, Duration::from_secs(30)));
    tracing::subscriber::with_default(recorder.clone(), || {
        for _ in 0..10 {
            drop(bulkhead.try_acquire().unwrap());
        }
    });
    assert!(recorder.0.lock().unwrap().is_empty());
}

#[test]
fn an_invalid_weight_is_a_warning() {
    let recorder = Recorder::default();
    let bulkhead = Bulkhead::new(Config::new(2, Duration::from_secs(30)).name("db"));
    tracing::subscriber::with_default(recorder.clone(), || {
        assert!(bulkhead.try_acquire_weighted(3).is_err());
    });
    let events = recorder.0.lock().unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].0, Level::WARN);
    assert!(events[0].1.contains("service=db"), "{}", events[0].1);
}

#[test]
fn the_saturation_signal_going_up_is_a_warning() {
    let recorder = Recorder::default();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let bulkhead = Bulkhead::new(
        Config::new(1, Duration::from_secs(30))
            .name("db")
            .wait(Duration::from_millis(10))
            .saturation_signal(1.0, 2, Duration::from_secs(1)),
    );
    let _held = bulkhead.try_acquire().unwrap();
    tracing::subscriber::with_default(recorder.clone(), || {
        runtime.block_on(async {
            for _ in 0..2 {
                assert!(bulkhead.acquire().await.is_err());
            }
        })
    });
    let events = recorder.0.lock().unwrap();
    let warnings: Vec<_> = events
        .iter()
        .filter(|(level, _)| *level == Level::WARN)
        .collect();
    assert_eq!(warnings.len(), 1, "{events:?}");
    assert!(
        warnings[0].1.contains("saturation signal up"),
        "{}",
        warnings[0].1
    );
}

#[test]
fn an_adaptive_limit_that_moves_is_a_debug_event_with_both_limits() {
    use tower_inflight::adaptive::{Adaptive, Algorithm, Sample};

    /// Asks for a limit of 3 whatever it is told.
    #[derive(Clone, Debug)]
    struct Three;
    impl Algorithm for Three {
        fn update(&mut self, _: &Sample, _: usize) -> usize {
            3
        }
    }

    let recorder = Recorder::default();
    let bulkhead = Bulkhead::new(
        Config::new(10, Duration::from_secs(30))
            .name("db")
            .adaptive(Adaptive::new(Three).initial(8)),
    );
    tracing::subscriber::with_default(recorder.clone(), || {
        // The first call's end is a sample: the limit moves from 8 to 3.
        drop(bulkhead.try_acquire().unwrap());
        // The next asks for 3 again: no move, no event.
        drop(bulkhead.try_acquire().unwrap());
    });
    assert_eq!(bulkhead.limit(), 3);
    let events = recorder.0.lock().unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    let (level, fields) = &events[0];
    assert_eq!(*level, Level::DEBUG);
    for expected in ["service=db", "from=8", "to=3"] {
        assert!(fields.contains(expected), "{expected} not in {fields}");
    }
}
