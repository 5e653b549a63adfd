//! An open-loop load generator for several tenants: each tenant's requests
//! arrive on a Poisson schedule of its own, each on its own task, so a slow
//! server cannot slow the offered load down (a closed loop, which waits for
//! one response before sending the next, hides overload).

pub(crate) use crate::demo::Status;
use crate::demo::{self, HttpClient, Rng};
use http::Request;
use http_body_util::Empty;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// One tenant's offered load.
#[derive(Clone, Debug)]
pub(crate) struct Tenant {
    /// Sent as the `x-tenant` header.
    pub(crate) name: String,
    pub(crate) rate: f64,
    pub(crate) noisy: bool,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Outcome {
    /// Index into the tenants offered.
    pub(crate) tenant: usize,
    /// When the request was due, in seconds from the start of the run.
    pub(crate) due: f64,
    /// From when it was due (not when it was sent: no coordinated omission)
    /// to the end of its response body.
    pub(crate) latency: Duration,
    pub(crate) status: Status,
}

/// Every tenant's arrivals over `duration`, in order. Tenant `i`'s schedule
/// depends on the seed and `i` alone, so the quiet tenants send the very
/// same requests at the very same times with or without the noisy one.
pub(crate) fn schedule(tenants: &[Tenant], duration: Duration, seed: u64) -> Vec<(f64, usize)> {
    let mut arrivals = Vec::new();
    for (index, tenant) in tenants.iter().enumerate() {
        if tenant.rate <= 0.0 {
            continue;
        }
        let mut rng = Rng::new(seed ^ (index as u64 + 1).wrapping_mul(0xA076_1D64_78BD_642F));
        let mut due = 0.0;
        loop {
            due += rng.exponential_gap(tenant.rate);
            if due >= duration.as_secs_f64() {
                break;
            }
            arrivals.push((due, index));
        }
    }
    arrivals.sort_by(|a, b| a.0.total_cmp(&b.0));
    arrivals
}

/// Sends each request of `arrivals` when it is due and waits for every one
/// of them; a request not answered within `timeout` of being due is given
/// up (its connection dropped, which the server sees).
pub(crate) async fn offer(
    client: &HttpClient,
    addr: SocketAddr,
    tenants: &[Tenant],
    arrivals: &[(f64, usize)],
    timeout: Duration,
) -> Vec<Outcome> {
    let start = Instant::now() + Duration::from_millis(10);
    let mut calls = JoinSet::new();
    for &(due, tenant) in arrivals {
        let at = start + Duration::from_secs_f64(due);
        tokio::time::sleep_until(at).await;
        let client = client.clone();
        let name = tenants[tenant].name.clone();
        calls.spawn(async move {
            let status =
                match tokio::time::timeout_at(at + timeout, call(&client, addr, &name)).await {
                    Ok(status) => status,
                    Err(_) => Status::TimedOut,
                };
            Outcome {
                tenant,
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

async fn call(client: &HttpClient, addr: SocketAddr, tenant: &str) -> Status {
    let request = Request::get(format!("http://{addr}/"))
        .header("x-tenant", tenant)
        .body(Empty::new())
        .expect("a request");
    demo::sent(client, request).await
}
