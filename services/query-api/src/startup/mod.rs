//! Building and running the service: wiring only, in steps named after what they build.
//!
//! - `store`: the catalogue store and the Redis L2 tier;
//! - `engine`: the part caches over their guarded sources, and the query engine;
//! - `simulator`: the embedded upstream simulator (feature `simulator`);
//! - here: the guards, background tasks, the event bus, the listeners and the
//!   shared state, then serving and draining.

mod engine;
mod simulator;
mod store;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rebate_cache::{Clock, SystemClock};
use rebate_engine::QueryEngine;
use rebate_events::Subscription;
use rebate_guard::FleetTokens;
use rebate_redis_tier::RedisTier;
use rebate_resilience::{MonotonicTicker, Ticker};
use rebate_sources::LoadLimiter;
use rebate_store::CatalogRepository;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use simulator::RunningSimulator;
pub use store::seed;

use crate::background;
use crate::config::Settings;
use crate::config::resilience::{FleetSettings, LimitScope};
use crate::consistency::ConsistencyObserver;
use crate::event_bus::EventBus;
use crate::fleet::Fleet;
use crate::hot_keys::HotKeys;
use crate::http::admin_auth::{AdminAuth, AuthFailures, ThrottleConfig};
use crate::http::edge::EdgeLimits;
use crate::http::middleware::{LineBudget, RequestObserver};
use crate::invalidation::{InvalidationConfig, Invalidator};
use crate::lifecycle::{Lifecycle, Phase};
use crate::listen_queue::{AcceptWait, ListenQueue};
use crate::metrics::{Metrics, StateCollector};
use crate::protection::{DependencyTimeouts, Protection};
use crate::rules::apply::{BusAnnouncer, LiveKnobs, ServiceTarget};
use crate::rules::manager::Rules;
use crate::server::{ConnectionLimits, ConnectionStats};
use crate::slow::SlowLog;
use crate::state::{AppShared, AppState, HttpLimits};
use crate::warm_jobs::{WarmJobConfig, WarmJobs};

/// How long a starting instance waits for the store's live rules before it serves on the
/// config file's values.
const RULES_AT_START: Duration = Duration::from_secs(5);

/// A built service bound to its listener, not yet serving.
#[derive(Debug)]
pub struct Application {
    listener: TcpListener,
    admin_listener: TcpListener,
    /// The admin token, and the failures of peers that offered wrong ones.
    admin_auth: AdminAuth,
    state: AppState,
    simulator: Option<RunningSimulator>,
    shutdown: CancellationToken,
    /// Bloom rebuilds, warm-up and invalidation follow-ups; stopped with the same token as the
    /// server.
    tasks: TaskTracker,
    /// Keeps this instance's handler on the in-process bus for as long as it serves.
    _events_subscription: Option<Subscription>,
    drain: Duration,
    api_limits: ConnectionLimits,
    admin_limits: ConnectionLimits,
}

impl Application {
    /// Builds the service on the system clock.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        Self::build_with_clock(settings, Arc::new(SystemClock)).await
    }

    /// Builds the service with an injected clock (tests move it instead of sleeping).
    pub async fn build_with_clock(
        settings: Settings,
        clock: Arc<dyn Clock>,
    ) -> anyhow::Result<Self> {
        Self::build_with_clocks(settings, clock, Arc::new(MonotonicTicker::new())).await
    }

    /// Builds the service with an injected wall clock (cache freshness) and monotonic ticker
    /// (breakers, quotas, shedding, log-line budget), so tests move time instead of sleeping.
    pub async fn build_with_clocks(
        settings: Settings,
        clock: Arc<dyn Clock>,
        ticker: Arc<dyn Ticker>,
    ) -> anyhow::Result<Self> {
        let shutdown = CancellationToken::new();
        let (store, rule_store) = store::open_store(&settings).await?;
        let tier = store::connect_tier(&settings).await?;
        let simulator = simulator::start(&settings, &shutdown).await?;
        let (coupons_url, extras_url) = match &simulator {
            Some(simulator) => (simulator.base_url(), simulator.base_url()),
            None => (
                settings.upstreams.coupons_url.clone(),
                settings.upstreams.extras_url.clone(),
            ),
        };
        // Built first so that every dependency guard reports its calls to it; the collector of
        // state counters is added once that state exists.
        let mut metrics = Metrics::new();
        let fleet = join_fleet(&settings, tier.as_ref(), &clock, &ticker).await;
        let protection = build_protection(
            &settings,
            Arc::clone(&ticker),
            &metrics,
            fleet.clone().map(|fleet| fleet as Arc<dyn FleetTokens>),
        );
        let load_limiter = LoadLimiter::new(settings.store.max_concurrent_loads);
        let (engine, upstream_clients) = engine::build(
            &settings,
            engine::Sources {
                store: &store,
                tier: tier.as_ref(),
                load_limiter: &load_limiter,
                coupons_url: &coupons_url,
                extras_url: &extras_url,
            },
            &protection,
            Arc::clone(&clock),
        )?;

        let hot_keys = if settings.hot_keys.enabled {
            let hot_keys = HotKeys::new(&settings.hot_keys, tier.as_ref(), &settings.instance_id())
                .context("hot_keys")?;
            Some(Arc::new(hot_keys))
        } else {
            None
        };
        let listener = crate::server::bind(settings.http.listen, settings.http.listen_backlog)
            .with_context(|| format!("binding http.listen {}", settings.http.listen))?;
        let connections = Arc::new(ConnectionStats::default());
        let tasks = TaskTracker::new();
        let knobs = Arc::new(LiveKnobs::new(&settings));
        spawn_background(
            &settings,
            &knobs,
            &engine,
            &store,
            &protection,
            hot_keys.as_ref(),
            settings
                .resilience
                .shedding
                .accept_queue
                .then(|| accept_wait(&listener, &connections))
                .flatten(),
            &tasks,
            &shutdown,
        )?;
        let warm_jobs = Arc::new(WarmJobs::new(
            WarmJobConfig::from_settings(&settings),
            tier.clone(),
            &settings.instance_id(),
        ));
        if settings.warm_jobs.consume {
            tasks.spawn(Arc::clone(&warm_jobs).consume(
                engine.clone(),
                Arc::clone(&protection),
                shutdown.clone(),
            ));
        }
        if let Some(fleet) = fleet {
            let every = settings.resilience.fleet.heartbeat();
            tasks.spawn(crate::fleet::keep_beating(
                fleet,
                every,
                every * FleetSettings::MISSED_BEATS,
                shutdown.clone(),
            ));
        }
        let consistency = ConsistencyObserver::new(
            settings.events.observer_settings(),
            engine.clone(),
            Arc::clone(&store),
            tasks.clone(),
            shutdown.clone(),
        );
        consistency.start_drift_sampler(hot_keys.clone());
        let invalidator = Invalidator::new(
            engine.clone(),
            Arc::clone(&protection),
            Some(Arc::clone(&consistency)),
            InvalidationConfig {
                fence_for: Duration::from_secs(settings.events.fence_secs),
                rewarm_deadline: settings.request_deadline(),
            },
            tasks.clone(),
            shutdown.clone(),
        );
        let rules_announcements = invalidator.rules_announcements();
        let (events, events_subscription) =
            EventBus::start(&settings.events, invalidator, shutdown.child_token())?;
        let rules = Arc::new(Rules::new(
            Arc::new(settings.clone()),
            settings.instance_id(),
            rule_store,
            Arc::clone(&clock),
            Arc::new(ServiceTarget {
                engine: engine.clone(),
                protection: Arc::clone(&protection),
                knobs: Arc::clone(&knobs),
                answers: metrics.answer_counters(),
                warm_jobs: Arc::clone(&warm_jobs),
            }),
            Some(Arc::new(BusAnnouncer(events.clone()))),
            metrics.request_window(),
        ));
        metrics.collect_rules(Arc::clone(&rules));
        // The active version before this instance reports ready; a store that does not answer
        // in time leaves the file's values in force until the first poll that reads it.
        match tokio::time::timeout(RULES_AT_START, rules.reconcile()).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                tracing::warn!(%error, "live rules unreadable at start; the config file's values are in force until the store answers");
            }
            Err(_) => tracing::warn!(
                timeout_ms = RULES_AT_START.as_millis() as u64,
                "live rules not read at start in time; the config file's values are in force until the store answers"
            ),
        }
        tasks.spawn(Arc::clone(&rules).run(Some(rules_announcements.clone()), shutdown.clone()));
        let change_capture = start_change_capture(
            &settings,
            tier.as_deref(),
            &events,
            &engine,
            &tasks,
            &shutdown,
        )?;
        if let Some(capture) = &change_capture {
            metrics.collect_change_capture(Arc::clone(capture));
        }
        metrics.collect_from(StateCollector::new(
            engine.clone(),
            Arc::clone(&protection),
            events.clone(),
            Arc::clone(&consistency),
            upstream_clients.clone(),
            Arc::clone(&connections),
            Arc::clone(&warm_jobs),
        ));

        let admin_auth_failures =
            AuthFailures::new(ThrottleConfig::from_settings(&settings.admin.auth_throttle));
        metrics.collect_admin_auth(Arc::clone(&admin_auth_failures));
        let metrics = Arc::new(metrics);
        let admin_listener = TcpListener::bind(settings.admin.listen)
            .await
            .with_context(|| format!("binding admin.listen {}", settings.admin.listen))?;
        let admin_auth = AdminAuth::new(
            crate::admin_token::load_or_create(&settings)?,
            admin_auth_failures,
        );
        let slow_log = Arc::new(SlowLog::new(settings.observability.slow_log_size));
        let state = AppState::new(AppShared {
            consistency,
            engine,
            store,
            tier,
            load_limiter,
            protection,
            observer: Arc::new(request_observer(&settings, &metrics, &slow_log, ticker)),
            slow_log,
            events,
            rules_announcements,
            limits: Arc::new(http_limits(&settings, &knobs)),
            rules,
            metrics,
            lifecycle: Arc::new(Lifecycle::default()),
            connections,
            upstreams: upstream_clients,
            hot_keys,
            recent_pings: Arc::default(),
            warm_jobs,
            change_capture,
        });
        Ok(Self {
            listener,
            admin_listener,
            admin_auth,
            state,
            simulator,
            shutdown,
            tasks,
            _events_subscription: events_subscription,
            drain: settings.shutdown_drain(),
            api_limits: settings.api_connection_limits(),
            admin_limits: settings.admin_connection_limits(),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has a local address")
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_listener
            .local_addr()
            .expect("a bound listener has a local address")
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// The embedded upstream simulator, when `upstreams.simulate` is on.
    pub fn simulator(&self) -> Option<&RunningSimulator> {
        self.simulator.as_ref()
    }

    /// Cancelling this token stops the service (and its background tasks) gracefully.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Serves until the shutdown token is cancelled, then lets in-flight requests finish for at
    /// most the configured drain time. The admin listener serves through the drain (readiness
    /// answers `draining` there) and stops after it.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let address = self.local_addr();
        let admin_address = self.admin_addr();
        let lifecycle = Arc::clone(&self.state.lifecycle);
        let admin_router = crate::http::admin_router(self.state.clone(), self.admin_auth);
        let connections = Arc::clone(&self.state.connections);
        let router = crate::http::router(self.state);
        let shutdown = self.shutdown.clone();
        let admin_shutdown = CancellationToken::new();
        let admin = tokio::spawn(crate::server::serve(
            self.admin_listener,
            admin_router,
            self.admin_limits,
            Arc::new(ConnectionStats::default()),
            admin_shutdown.clone(),
            Duration::from_secs(1),
        ));
        tracing::info!(address = %admin_address, "admin listener ready");
        let server = tokio::spawn(crate::server::serve(
            self.listener,
            router,
            self.api_limits,
            connections,
            shutdown.clone(),
            self.drain,
        ));
        lifecycle.enter(Phase::Serving);
        tracing::info!(%address, "rebate query service listening");

        shutdown.cancelled().await;
        lifecycle.enter(Phase::Draining);
        tracing::info!(
            drain_ms = self.drain.as_millis() as u64,
            "shutting down, draining requests"
        );
        server.await.context("server task failed")?;
        admin_shutdown.cancel();
        if tokio::time::timeout(Duration::from_secs(5), admin)
            .await
            .is_err()
        {
            tracing::warn!("admin listener did not stop within 5 s");
        }
        self.tasks.close();
        if tokio::time::timeout(Duration::from_secs(5), self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!("background tasks did not stop within 5 s");
        }
        if let Some(simulator) = self.simulator {
            simulator.stopped().await;
        }
        tracing::info!("stopped");
        Ok(())
    }
}

/// Breakers, bulkheads, quotas, the shedder and the per-client limiter, every guard reporting its
/// calls to `metrics`.
/// This instance's part in the fleet's shared state, when quotas or the per-client limit are
/// fleet-wide: recorded in the registry once before the guards are built, so that its share is
/// cut for the fleet it joins.
async fn join_fleet(
    settings: &Settings,
    tier: Option<&Arc<RedisTier>>,
    clock: &Arc<dyn Clock>,
    ticker: &Arc<dyn Ticker>,
) -> Option<Arc<Fleet>> {
    let resilience = &settings.resilience;
    let fleet_settings = &resilience.fleet;
    let wanted = fleet_settings.quotas || resilience.client_limit.scope == LimitScope::Fleet;
    let tier = tier.filter(|_| wanted)?;
    let fleet = Arc::new(Fleet::new(
        Arc::clone(tier),
        &settings.instance_id(),
        Arc::clone(clock),
        Arc::clone(ticker),
    ));
    fleet
        .beat(fleet_settings.heartbeat() * FleetSettings::MISSED_BEATS)
        .await;
    Some(fleet)
}

fn build_protection(
    settings: &Settings,
    ticker: Arc<dyn Ticker>,
    metrics: &Metrics,
    fleet: Option<Arc<dyn FleetTokens>>,
) -> Arc<Protection> {
    Arc::new(Protection::new(
        &settings.resilience,
        DependencyTimeouts::of(settings),
        ticker,
        Some(metrics.call_observer()),
        fleet,
    ))
}

/// The API listener's accept queue for the shedder's probe, where it can be read (Linux).
fn accept_wait(listener: &TcpListener, connections: &Arc<ConnectionStats>) -> Option<AcceptWait> {
    match ListenQueue::open(listener) {
        Ok(queue) => Some(AcceptWait::new(queue, Arc::clone(connections))),
        Err(error) => {
            tracing::warn!(
                %error,
                "cannot read the listener's accept queue; the shedder measures the runtime's queue only"
            );
            None
        }
    }
}

/// Bloom rebuilds, the queue-delay probe, the hot keys' upkeep and warm-up, stopped with `shutdown`.
#[expect(
    clippy::too_many_arguments,
    reason = "wiring: each argument is one part the background tasks share"
)]
fn spawn_background(
    settings: &Settings,
    knobs: &Arc<LiveKnobs>,
    engine: &QueryEngine,
    store: &Arc<dyn CatalogRepository>,
    protection: &Arc<Protection>,
    hot_keys: Option<&Arc<HotKeys>>,
    accept_wait: Option<AcceptWait>,
    tasks: &TaskTracker,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    if let Some(hot_keys) = hot_keys {
        tasks.spawn(crate::hot_keys::maintain(
            Arc::clone(hot_keys),
            shutdown.clone(),
        ));
    }
    if let Some(filter) = engine.item_filter() {
        tasks.spawn(background::maintain_item_filter(
            Arc::clone(filter),
            Arc::clone(store),
            Duration::from_secs(settings.bloom.rebuild_interval_secs),
            shutdown.clone(),
        ));
    }
    if protection.shedder.is_some() {
        tasks.spawn(background::probe_queue_delay(
            Arc::clone(protection),
            accept_wait,
            shutdown.clone(),
        ));
    }
    if settings.warmup.enabled {
        tasks.spawn(background::warm_up(
            engine.clone(),
            Arc::clone(store),
            Arc::clone(protection),
            hot_keys.cloned(),
            background::WarmupPlan {
                items: settings.warmup_items()?,
                hot_items_limit: settings.warmup.hot_items_limit,
                rate_per_sec: Arc::clone(knobs),
                interval: Duration::from_secs(settings.warmup.interval_secs),
                deadline: settings.request_deadline(),
            },
            shutdown.clone(),
        ));
    }
    Ok(())
}

/// What the API's trace layer records into the slow-request log, and its log-line budget.
fn request_observer(
    settings: &Settings,
    metrics: &Arc<Metrics>,
    slow_log: &Arc<SlowLog>,
    ticker: Arc<dyn Ticker>,
) -> RequestObserver {
    let observability = &settings.observability;
    RequestObserver {
        metrics: Arc::clone(metrics),
        slow_log: Arc::clone(slow_log),
        slow_after: Duration::from_millis(observability.slow_request_ms),
        instance: Arc::from(settings.instance_id()),
        lines: LineBudget::new(observability.slow_log_lines_per_sec, ticker),
    }
}

/// The request limits the handlers and the edge enforce.
fn http_limits(settings: &Settings, knobs: &Arc<LiveKnobs>) -> HttpLimits {
    let http = &settings.http;
    HttpLimits {
        live: Arc::clone(knobs),
        request_timeout: settings.request_timeout(),
        body_limit_bytes: http.body_limit_bytes,
        max_batch_items: http.max_batch_items,
        warm_job_body_limit_bytes: settings.warm_jobs.body_limit_bytes,
        edge: Arc::new(EdgeLimits {
            max_header_bytes: http.max_header_bytes,
            max_headers: http.max_headers,
            max_uri_bytes: http.max_uri_bytes,
            body_limit_bytes: http.body_limit_bytes,
            body_read_timeout: Duration::from_millis(http.body_read_timeout_ms),
        }),
        admin_request_timeout: Duration::from_millis(settings.admin.request_timeout_ms),
        cors: crate::http::cors::Cors::from_settings(&settings.http.cors),
        compression: crate::http::encoding::Compression::from_settings(&settings.http.compression),
    }
}

/// Starts change capture when `change_capture.enabled` (validated: then the store is MySQL and
/// Redis is on).
fn start_change_capture(
    settings: &Settings,
    tier: Option<&rebate_redis_tier::RedisTier>,
    events: &EventBus,
    engine: &rebate_engine::QueryEngine,
    tasks: &TaskTracker,
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<Arc<crate::change_capture::ChangeCapture>>> {
    let capture = &settings.change_capture;
    if !capture.enabled {
        return Ok(None);
    }
    let tier = tier.context("change_capture needs the Redis tier")?;
    let url = if capture.url.is_empty() {
        settings.store.mysql.url.expose()
    } else {
        capture.url.expose()
    };
    // A load of a store-backed part may run for its timeout and the cache's grace beyond it;
    // the fleet's clocks may differ by about a second.
    let timeouts = settings.part_timeouts();
    let resync_margin =
        timeouts.product.max(timeouts.rate) + Duration::from_millis(100) + Duration::from_secs(1);
    let change_capture = Arc::new(crate::change_capture::ChangeCapture::new(
        capture.clone(),
        url,
        settings.instance_id(),
        tier.clone(),
        events.clone(),
        engine.clone(),
        resync_margin,
    )?);
    tasks.spawn(Arc::clone(&change_capture).run(shutdown.clone()));
    Ok(Some(change_capture))
}
