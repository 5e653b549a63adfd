//! A bad configuration given to a `new` that panics is reported at the
//! caller's line, not inside the crate. (One test in its own binary: the
//! panic hook that records the location is process-wide.)

use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower_inflight::keyed::{KeyedBulkhead, KeyedConcurrencyLayer, KeyedConfig};
use tower_inflight::{Bulkhead, ConcurrencyLayer, Config};

/// The file and line of the panic `build` makes.
fn panic_location(build: impl FnOnce()) -> (String, u32) {
    let location = Arc::new(Mutex::new(None));
    let recorded = location.clone();
    let default = panic::take_hook();
    panic::set_hook(Box::new(move |info| {
        let at = info.location().expect("a panic has a location");
        *recorded.lock().unwrap() = Some((at.file().to_owned(), at.line()));
    }));
    let outcome = panic::catch_unwind(AssertUnwindSafe(build));
    panic::set_hook(default);
    assert!(outcome.is_err(), "a bad configuration is refused");
    let location = location.lock().unwrap().take();
    location.expect("the hook saw the panic")
}

#[test]
fn a_bad_configuration_panics_at_the_callers_line() {
    let bad = || Config::new(0, Duration::from_secs(30));
    let keyed_bad = || KeyedConfig::<u32>::new(bad());
    let cases = [
        (
            "Bulkhead::new",
            panic_location(|| drop(Bulkhead::new(bad()))),
        ),
        (
            "ConcurrencyLayer::new",
            panic_location(|| drop(ConcurrencyLayer::new(bad()))),
        ),
        (
            "KeyedBulkhead::new",
            panic_location(|| drop(KeyedBulkhead::new(keyed_bad()))),
        ),
        (
            "KeyedConcurrencyLayer::new",
            panic_location(|| drop(KeyedConcurrencyLayer::new(keyed_bad(), |n: &u32| *n))),
        ),
    ];
    for (new, (file, line)) in cases {
        assert_eq!(
            file,
            file!(),
            "{new} panicked inside the crate, at line {line}"
        );
    }
}
