//! The server under test: one axum handler standing in for a dependency
//! shared by every tenant, behind each variant's layer in turn.

pub(crate) use crate::demo::serve;
use crate::demo::Counted;
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use axum::Extension;
use axum::Router;
use http::request::Parts;
use http::HeaderMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use tower_inflight::http::HttpConcurrencyLayer;
use tower_inflight::keyed::{KeyedBulkhead, KeyedConfig, KeyedHttpConcurrencyLayer};
use tower_inflight::Config;

/// The noisy tenant's name, in its `x-tenant` header.
pub(crate) const NOISY_TENANT: &str = "noisy";

/// Longer than the client's timeout (1 s): a slot is reclaimed only from a
/// call that was truly lost, never from one that is merely slow.
const RECLAIM_AFTER: Duration = Duration::from_secs(30);

/// What the handler stands in for: a dependency that serves `capacity`
/// calls at once in `service` each, and slows down past that.
#[derive(Debug)]
pub(crate) struct Dependency {
    capacity: usize,
    service: Duration,
    /// Each call's service time is drawn from `service × (1 ± jitter)`.
    jitter: f64,
    /// The state of the draws (SplitMix64, stepped atomically).
    draws: AtomicU64,
    /// Calls inside the handler now, and the most seen at once.
    inside: AtomicUsize,
    peak_inside: AtomicUsize,
    /// Requests anywhere in the server now: inside, or parked in a layer.
    in_process: AtomicUsize,
    record: Mutex<Record>,
}

/// What the handler saw, for the report.
#[derive(Debug, Default)]
pub(crate) struct Record {
    /// Each call's tenant, and how long it waited in the layer: from the
    /// outermost middleware to the handler.
    pub(crate) waits: Vec<(String, Duration)>,
    /// What the calls' sleeps asked for, and what they really took, summed:
    /// timers round up, so the stand-in is a little slower than nominal.
    asked: Duration,
    taken: Duration,
}

impl Record {
    /// How long a call of nominal `service` really takes, on the mean.
    pub(crate) fn real_service(&self, service: Duration) -> Option<Duration> {
        (!self.asked.is_zero())
            .then(|| service.mul_f64(self.taken.as_secs_f64() / self.asked.as_secs_f64()))
    }
}

impl Dependency {
    pub(crate) fn new(capacity: usize, service: Duration, jitter: f64) -> Arc<Self> {
        Arc::new(Self {
            capacity,
            service,
            jitter,
            draws: AtomicU64::new(0),
            inside: AtomicUsize::new(0),
            peak_inside: AtomicUsize::new(0),
            in_process: AtomicUsize::new(0),
            record: Mutex::new(Record::default()),
        })
    }

    pub(crate) fn inside(&self) -> usize {
        self.inside.load(Ordering::SeqCst)
    }

    pub(crate) fn peak_inside(&self) -> usize {
        self.peak_inside.load(Ordering::SeqCst)
    }

    pub(crate) fn in_process(&self) -> usize {
        self.in_process.load(Ordering::SeqCst)
    }

    pub(crate) fn take_record(&self) -> Record {
        std::mem::take(&mut *self.record.lock().expect("the record"))
    }

    /// Uniform in [-1, 1).
    fn draw(&self) -> f64 {
        const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut z = self
            .draws
            .fetch_add(GAMMA, Ordering::Relaxed)
            .wrapping_add(GAMMA);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        2.0 * ((z >> 11) as f64 / (1u64 << 53) as f64) - 1.0
    }
}

/// When a request reached the server, stamped by the outermost middleware.
#[derive(Clone, Copy, Debug)]
struct Arrived(Instant);

/// Overload as processor sharing, simplified: the dependency has `capacity`
/// workers; with `n` calls inside (this one included), each gets
/// `capacity / n` of a worker, so a call takes `service × max(1, n / capacity)`.
/// The stretch is fixed when the call enters, from the count inside then:
/// calls that come later do not slow it down, calls that leave do not speed
/// it up. At a steady `n` inside that is exact, and it keeps the
/// dependency's throughput at `capacity / service` however many are let in:
/// past its capacity, letting more in only makes every call slower.
///
/// Each call's time is also drawn evenly from `service × (1 ± jitter)`
/// (`--jitter`): the mean, and so the capacity, stay the same. With
/// `--jitter 0` every call takes the same time; `docs/tenants.md` says what
/// that does to the waits behind a full ceiling.
async fn handler(
    State(dependency): State<Arc<Dependency>>,
    Extension(arrived): Extension<Arrived>,
    headers: HeaderMap,
) -> &'static str {
    let (_inside, now) = Counted::new(&dependency.inside);
    dependency.peak_inside.fetch_max(now, Ordering::SeqCst);
    let waited = arrived.0.elapsed();
    let stretch = (now as f64 / dependency.capacity as f64).max(1.0)
        * (1.0 + dependency.jitter * dependency.draw());
    let asked = dependency.service.mul_f64(stretch);
    let start = Instant::now();
    tokio::time::sleep(asked).await;
    let taken = start.elapsed();
    let tenant = headers
        .get("x-tenant")
        .and_then(|tenant| tenant.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let mut record = dependency.record.lock().expect("the record");
    record.waits.push((tenant, waited));
    record.asked += asked;
    record.taken += taken;
    "ok"
}

async fn count_in_process(
    State(dependency): State<Arc<Dependency>>,
    mut request: Request,
    next: Next,
) -> Response {
    let (_in_process, _) = Counted::new(&dependency.in_process);
    request.extensions_mut().insert(Arrived(Instant::now()));
    next.run(request).await
}

/// The tenant a request is for: its `x-tenant` header. A real service
/// would take it from an authenticated token, not trust a header.
fn tenant(head: &Parts) -> String {
    head.headers
        .get("x-tenant")
        .and_then(|tenant| tenant.to_str().ok())
        .unwrap_or("anonymous")
        .to_owned()
}

/// The layers compared; each serves the same handler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Variant {
    /// A bulkhead per tenant (limit C: a tenant may borrow all idle
    /// capacity), a ceiling of C for all together, each tenant guaranteed
    /// its fair share of the ceiling.
    Keyed,
    /// One bulkhead of C for everyone.
    Shared,
    /// A bulkhead of C per tenant and nothing for all together.
    PerTenantNoCeiling,
    /// `Keyed`, offered the quiet tenants' load alone: their baseline.
    QuietAlone,
}

impl Variant {
    pub(crate) const ALL: [Variant; 4] = [
        Variant::Keyed,
        Variant::Shared,
        Variant::PerTenantNoCeiling,
        Variant::QuietAlone,
    ];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Variant::Keyed => "keyed",
            Variant::Shared => "shared",
            Variant::PerTenantNoCeiling => "per_tenant_no_ceiling",
            Variant::QuietAlone => "quiet_alone",
        }
    }

    /// Whether the noisy tenant sends anything.
    pub(crate) fn with_noisy(self) -> bool {
        self != Variant::QuietAlone
    }

    /// The app: the handler behind this variant's layer, behind a counter
    /// of requests in the process; and the keyed bulkhead, if it has one,
    /// for a look at its status while the load runs.
    pub(crate) fn app(
        self,
        setup: &Setup,
        dependency: Arc<Dependency>,
    ) -> (Router, Option<KeyedBulkhead<String>>) {
        let route = Router::new().route("/", get(handler));
        let (limited, keyed) = match self {
            Variant::Keyed | Variant::QuietAlone => {
                let (guarantee, limit, noisy_limit) =
                    (setup.guarantee, setup.capacity, setup.noisy_limit);
                let config = KeyedConfig::new(setup.per_key())
                    .ceiling(
                        Config::new(setup.capacity, RECLAIM_AFTER)
                            .wait(setup.wait)
                            .name("tenants"),
                    )
                    .guarantee_per_key(move |_: &String| guarantee)
                    // C for everyone, unless `--noisy-limit` says otherwise:
                    // a way to see what a lower cap on the borrower costs.
                    .limit_per_key(move |tenant: &String| {
                        if tenant == NOISY_TENANT {
                            noisy_limit
                        } else {
                            limit
                        }
                    });
                let layer = KeyedHttpConcurrencyLayer::new(config, tenant as fn(&Parts) -> String);
                let keyed = layer.bulkhead();
                (route.layer(layer), Some(keyed))
            }
            Variant::Shared => {
                let config = Config::new(setup.capacity, RECLAIM_AFTER)
                    .wait(setup.wait)
                    .name("dependency");
                (route.layer(HttpConcurrencyLayer::new(config)), None)
            }
            Variant::PerTenantNoCeiling => {
                let layer = KeyedHttpConcurrencyLayer::new(
                    KeyedConfig::new(setup.per_key()),
                    tenant as fn(&Parts) -> String,
                );
                let keyed = layer.bulkhead();
                (route.layer(layer), Some(keyed))
            }
        };
        let app = limited
            .layer(middleware::from_fn_with_state(
                dependency.clone(),
                count_in_process,
            ))
            .with_state(dependency);
        (app, keyed)
    }
}

/// What every variant is built from.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Setup {
    /// C: the dependency's calls at once, every limit and the ceiling.
    pub(crate) capacity: usize,
    /// Each tenant's guaranteed share of the ceiling.
    pub(crate) guarantee: usize,
    /// The noisy tenant's own limit under `Keyed` (C by default).
    pub(crate) noisy_limit: usize,
    /// Every wait budget: for a tenant's slot, for the ceiling's, for the
    /// shared bulkhead's.
    pub(crate) wait: Duration,
}

impl Setup {
    /// Each tenant's bulkhead: a limit of C, so that a tenant alone may use
    /// all of the dependency; the ceiling (if any) is what shares it.
    fn per_key(&self) -> Config {
        Config::new(self.capacity, RECLAIM_AFTER)
            .wait(self.wait)
            .name("tenant")
    }
}
