//! What every handler and middleware shares, built once at start by [`crate::startup`].

use std::sync::Arc;
use std::time::Duration;

use rebate_engine::QueryEngine;
use rebate_redis_tier::RedisTier;
use rebate_sources::LoadLimiter;
use rebate_store::CatalogRepository;

use crate::consistency::ConsistencyObserver;
use crate::event_bus::EventBus;
use crate::hot_keys::HotKeys;
use crate::http::edge::EdgeLimits;
use crate::http::middleware::RequestObserver;
use crate::lifecycle::Lifecycle;
use crate::metrics::Metrics;
use crate::protection::Protection;
use crate::server::ConnectionStats;
use crate::slow::SlowLog;
use crate::upstreams::UpstreamClients;

/// What every handler shares: one `Arc`, so the per-request clones axum makes of the state (one
/// per `State` extractor) cost one reference count, not one per field. Derefs to [`AppShared`].
#[derive(Debug, Clone)]
pub struct AppState(Arc<AppShared>);

impl AppState {
    pub fn new(shared: AppShared) -> Self {
        Self(Arc::new(shared))
    }
}

impl std::ops::Deref for AppState {
    type Target = AppShared;

    fn deref(&self) -> &AppShared {
        &self.0
    }
}

/// The fields of [`AppState`].
#[derive(Debug)]
pub struct AppShared {
    pub engine: QueryEngine,
    pub store: Arc<dyn CatalogRepository>,
    /// The shared L2 tier, when Redis is enabled.
    pub tier: Option<Arc<RedisTier>>,
    pub load_limiter: Arc<LoadLimiter>,
    /// Breakers, bulkheads, quotas, the load shedder and the per-client limiter.
    pub protection: Arc<Protection>,
    /// The last slow, failed or degraded requests, by trace id (the admin API reads it).
    pub slow_log: Arc<SlowLog>,
    /// The API's trace layer: what it records into the slow log, and how many log lines.
    pub observer: Arc<RequestObserver>,
    /// Where operators' change events are published and received.
    pub events: EventBus,
    /// The highest live-rules version announced on the event bus (0: none since start), from
    /// this instance's event handler: the rules reader wakes on it instead of its next poll.
    pub rules_announcements: tokio::sync::watch::Receiver<u64>,
    pub limits: Arc<HttpLimits>,
    /// Live rule sets: the version this instance runs, and every change to them.
    pub rules: Arc<crate::rules::manager::Rules>,
    /// The Prometheus registry: the API middleware records into it, `/metrics` encodes it.
    pub metrics: Arc<Metrics>,
    /// Starting, serving or draining: readiness is false outside serving.
    pub lifecycle: Arc<Lifecycle>,
    /// The API listener's connection counts and refusals.
    pub connections: Arc<ConnectionStats>,
    /// Checks that what this instance would serve (kept rendering, L1, L2) agrees with the
    /// store, after applied events and for sampled keys (`crate::consistency`).
    pub consistency: Arc<ConsistencyObserver>,
    /// The last pings of the store and Redis, for the status page.
    pub recent_pings: Arc<crate::pings::RecentPings>,
    /// The coupon and extras API clients, for their batch counters.
    pub upstreams: UpstreamClients,
    /// The hot items learned from traffic; `None` when `hot_keys.enabled` is off.
    pub hot_keys: Option<Arc<HotKeys>>,
    /// Operators' warm jobs: where they are queued, and this instance's consumer's counters.
    pub warm_jobs: Arc<crate::warm_jobs::WarmJobs>,
    /// Change capture from the binlog, when `change_capture.enabled`.
    pub change_capture: Option<Arc<crate::change_capture::ChangeCapture>>,
}

/// The request limits handlers and middleware enforce, resolved once from the settings.
#[derive(Debug, Clone)]
pub struct HttpLimits {
    /// The request deadline and the other live values read outside the guards (`crate::rules`).
    pub live: Arc<crate::rules::apply::LiveKnobs>,
    pub request_timeout: Duration,
    pub body_limit_bytes: usize,
    pub max_batch_items: usize,
    /// `POST /admin/v1/warm-jobs`'s own body limit (`warm_jobs.body_limit_bytes`).
    pub warm_job_body_limit_bytes: usize,
    /// The head and body bounds checked before a request is admitted.
    pub edge: Arc<EdgeLimits>,
    pub admin_request_timeout: Duration,
    /// Cross-origin access for H5 pages (`None`: no CORS headers).
    pub cors: Option<crate::http::cors::Cors>,
    /// Compression of large answers (`None`: off).
    pub compression: Option<crate::http::encoding::Compression>,
}
