//! The per-priority waiting gauge. It is registered the first time a
//! priority waits, through the global recorder, so this test crate installs
//! one (the other metrics tests use a local recorder per bulkhead).

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use std::time::Duration;
use tower_inflight::{Bulkhead, Config, QueueOrder};

#[tokio::test(start_paused = true)]
async fn the_waiting_gauge_of_each_priority_follows_its_callers() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().unwrap();
    // A snapshot takes the values it reports (gauges read back as 0 after),
    // so each check reads both priorities from one snapshot.
    let gauges = || -> Vec<(String, f64)> {
        let mut gauges: Vec<_> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter_map(|(key, _, _, value)| {
                let key = key.key();
                if key.name() != "tower_inflight_waiting_by_priority"
                    || !key
                        .labels()
                        .any(|l| l.key() == "service" && l.value() == "db")
                {
                    return None;
                }
                let priority = key.labels().find(|l| l.key() == "priority")?;
                match value {
                    DebugValue::Gauge(value) => {
                        Some((priority.value().to_owned(), value.into_inner()))
                    }
                    _ => None,
                }
            })
            .collect();
        gauges.sort_by(|a, b| a.0.cmp(&b.0));
        gauges
    };

    let bulkhead = Bulkhead::new(
        Config::new(1, Duration::from_secs(30))
            .name("db")
            .wait(Duration::from_secs(10))
            .queue_order(QueueOrder::PriorityFifo),
    );
    let held = bulkhead.try_acquire().unwrap();
    let mut callers = Vec::new();
    for priority in [0, 7, 7] {
        let bulkhead = bulkhead.clone();
        callers.push(tokio::spawn(async move {
            let permit = bulkhead.acquire_with_priority(priority).await.unwrap();
            tokio::time::sleep(Duration::from_millis(1)).await;
            drop(permit);
        }));
        tokio::task::yield_now().await;
    }
    assert_eq!(gauges(), [("0".into(), 1.0), ("7".into(), 2.0)]);
    // One of the two callers of priority 7 gives up.
    callers.pop().unwrap().abort();
    tokio::task::yield_now().await;
    let after_abort = gauges();
    assert_eq!(after_abort.iter().find(|(p, _)| p == "7").unwrap().1, 1.0);
    drop(held);
    for caller in callers {
        caller.await.unwrap();
    }
    assert!(bulkhead.status().waiting_by_priority.is_empty());
}
