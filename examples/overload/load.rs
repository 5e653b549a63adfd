//! An open-loop load generator: requests arrive on a schedule, each on its
//! own task, so a slow server cannot slow the offered load down (a closed
//! loop, which waits for one response before sending the next, hides overload).

pub(crate) use crate::demo::Status;
use crate::demo::{self, HttpClient, Rng};
use http::Request;
use http_body_util::Empty;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Arrivals {
    /// Exponential gaps: how independent clients arrive.
    Poisson,
    /// Even gaps, as the table in the bulkhead's original write-up used.
    Paced,
}

impl Arrivals {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Arrivals::Poisson => "poisson",
            Arrivals::Paced => "paced",
        }
    }
}

impl Arrivals {
    /// The gap to the next arrival at `rate` a second.
    pub(crate) fn gap(self, rng: &mut Rng, rate: f64) -> f64 {
        match self {
            Arrivals::Poisson => rng.exponential_gap(rate),
            Arrivals::Paced => 1.0 / rate,
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Outcome {
    /// When the request was due, in seconds from the start of the run.
    pub(crate) due: f64,
    /// From when it was due (not when it was sent: no coordinated omission)
    /// to the end of its response body.
    pub(crate) latency: Duration,
    pub(crate) status: Status,
}

impl Outcome {
    pub(crate) fn finished(&self) -> f64 {
        self.due + self.latency.as_secs_f64()
    }
}

/// Offers `rate` requests a second for `duration` and waits for every one
/// of them (up to `timeout` each).
pub(crate) async fn offer(
    client: &HttpClient,
    addr: SocketAddr,
    rate: f64,
    duration: Duration,
    arrivals: Arrivals,
    rng: &mut Rng,
    timeout: Duration,
) -> Vec<Outcome> {
    let start = Instant::now() + Duration::from_millis(10);
    let mut calls = JoinSet::new();
    let mut due = 0.0;
    loop {
        due += arrivals.gap(rng, rate);
        if due >= duration.as_secs_f64() {
            break;
        }
        let at = start + Duration::from_secs_f64(due);
        tokio::time::sleep_until(at).await;
        let client = client.clone();
        calls.spawn(async move {
            let status = match tokio::time::timeout_at(at + timeout, call(&client, addr)).await {
                Ok(status) => status,
                Err(_) => Status::TimedOut,
            };
            Outcome {
                due,
                latency: at.elapsed(),
                status,
            }
        });
    }
    let mut outcomes = Vec::with_capacity(calls.len());
    while let Some(outcome) = calls.join_next().await {
        outcomes.push(outcome.expect("a request task"));
    }
    outcomes
}

async fn call(client: &HttpClient, addr: SocketAddr) -> Status {
    let request = Request::get(format!("http://{addr}/"))
        .body(Empty::new())
        .expect("a request");
    demo::sent(client, request).await
}
