//! Building and running the service.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rebate_cache::{
    Clock, ItemFilter, L2Settings, Loader, PartCache, PartCacheSettings, SharedTier, SystemClock,
};
use rebate_domain::PartKind;
use rebate_engine::{EngineParts, EngineSettings, QueryEngine};
use rebate_redis_tier::{RedisTarget, RedisTier, RedisTierSettings};
use rebate_resilience::{MonotonicTicker, Ticker};
use rebate_sources::{
    CouponClient, ExtrasClient, GuardedTier, LoadLimiter, ProductLoader, RateLoader, http_client,
};
use rebate_store::{CatalogRepository, MySqlSettings, MySqlStore, SqliteSettings, SqliteStore};
use serde::de::DeserializeOwned;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use upstream_sim::RunningSimulator;

use crate::background;
use crate::config::{EventBackend, PartSettings, Settings, StoreBackend};
use crate::http::admin::AdminToken;
use crate::http::edge::EdgeLimits;
use crate::invalidation::{InvalidationSettings, Invalidator};
use crate::lifecycle::{Lifecycle, Phase};
use crate::metrics::{Metrics, StateCollector};
use crate::protection::{DependencyTimeouts, Protection};
use crate::server::{ConnectionLimits, ConnectionStats};
use crate::slow::SlowLog;
use rebate_amqp_bus::AmqpBus;
use rebate_amqp_bus::events::{AmqpEventPublisher, DecodingHandler};
use rebate_events::{
    BusSettings, EventPublisher, InProcessBus, SigningKey, Subscription, ValidationPolicy,
};

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
    /// The last slow, failed or degraded requests, by trace id.
    pub slow_log: Arc<SlowLog>,
    /// This instance's name in slow-request records and traces.
    pub instance: Arc<str>,
    pub slow_after: Duration,
    /// At most this many slow-request log lines a second (every one is still recorded).
    pub slow_log_lines_per_sec: u32,
    /// Where operators' change events are published and received.
    pub events: EventBus,
    pub limits: Arc<HttpLimits>,
    /// The Prometheus registry: the API middleware records into it, `/metrics` encodes it.
    pub metrics: Arc<Metrics>,
    /// Starting, serving or draining: readiness is false outside serving.
    pub lifecycle: Arc<Lifecycle>,
    /// The API listener's connection counts and refusals.
    pub connections: Arc<ConnectionStats>,
    /// Checks that applied events hold in L1 and L2 (`crate::consistency`).
    pub consistency: Arc<crate::consistency::ConsistencyObserver>,
}

/// The request limits handlers and middleware enforce, resolved once from the settings.
#[derive(Debug, Clone)]
pub struct HttpLimits {
    pub request_deadline: Duration,
    pub request_timeout: Duration,
    pub body_limit_bytes: usize,
    pub max_batch_items: usize,
    /// The head and body bounds checked before a request is admitted.
    pub edge: Arc<EdgeLimits>,
    pub admin_request_timeout: Duration,
}

/// A built service bound to its listener, not yet serving.
#[derive(Debug)]
pub struct Application {
    listener: TcpListener,
    admin_listener: TcpListener,
    admin_token: AdminToken,
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
    /// (breakers, quotas, shedding), so tests move time instead of sleeping.
    pub async fn build_with_clocks(
        settings: Settings,
        clock: Arc<dyn Clock>,
        ticker: Arc<dyn Ticker>,
    ) -> anyhow::Result<Self> {
        let shutdown = CancellationToken::new();
        let store = open_store(&settings).await?;
        let tier = connect_tier(&settings).await?;

        let simulator = if settings.upstreams.simulate {
            let simulator = RunningSimulator::start(
                settings.upstreams.simulator_listen,
                shutdown.child_token(),
            )
            .await
            .context("starting the embedded upstream simulator")?;
            tracing::info!(addr = %simulator.addr(), "embedded upstream simulator started");
            Some(simulator)
        } else {
            None
        };
        let (coupons_url, extras_url) = match &simulator {
            Some(simulator) => (simulator.base_url(), simulator.base_url()),
            None => (
                settings.upstreams.coupons_url.clone(),
                settings.upstreams.extras_url.clone(),
            ),
        };
        let timeouts = settings.part_timeouts();
        // Built first so that every dependency guard reports its calls to it; the collector of
        // state counters is added once that state exists.
        let mut metrics = Metrics::new();
        let protection = Arc::new(Protection::new(
            &settings.resilience,
            DependencyTimeouts {
                mysql: timeouts.product.max(timeouts.rate),
                coupons: timeouts.coupons,
                extras: timeouts.extras,
            },
            ticker,
            Some(metrics.call_observer()),
        ));
        let client = http_client(Duration::from_millis(settings.upstreams.connect_timeout_ms))?;
        let coupons = CouponClient::new(
            client.clone(),
            &coupons_url,
            Arc::clone(&protection.coupons),
        )?;
        let extras = ExtrasClient::new(client, &extras_url, Arc::clone(&protection.extras))?;
        let load_limiter = LoadLimiter::new(settings.store.max_concurrent_loads);

        // Every L2 command goes through the Redis breaker: while it is open, misses go straight
        // to the source instead of paying a command timeout each.
        let shared_tier: Option<Arc<dyn SharedTier>> = tier.as_ref().map(|tier| {
            Arc::new(GuardedTier::new(
                Arc::clone(tier) as Arc<dyn SharedTier>,
                Arc::clone(&protection.redis),
            )) as Arc<dyn SharedTier>
        });
        let builder = PartBuilder {
            settings: &settings,
            tier: shared_tier,
            clock: &clock,
        };
        let parts = EngineParts {
            product: builder.build(
                PartKind::Product,
                &settings.parts.product,
                timeouts.product,
                Arc::new(ProductLoader::new(
                    Arc::clone(&store),
                    Arc::clone(&load_limiter),
                    Arc::clone(&protection.mysql),
                )),
            ),
            rate: builder.build(
                PartKind::Rate,
                &settings.parts.rate,
                timeouts.rate,
                Arc::new(RateLoader::new(
                    Arc::clone(&store),
                    Arc::clone(&load_limiter),
                    Arc::clone(&protection.mysql),
                )),
            ),
            coupons: builder.build(
                PartKind::Coupons,
                &settings.parts.coupons,
                timeouts.coupons,
                Arc::new(coupons),
            ),
            extras: builder.build(
                PartKind::Extras,
                &settings.parts.extras,
                timeouts.extras,
                Arc::new(extras),
            ),
        };
        let filter = if settings.bloom.enabled {
            let filter = ItemFilter::new(
                settings.bloom.false_positive_rate,
                settings.bloom.expected_items,
            )
            .context("bloom settings")?;
            Some(Arc::new(filter))
        } else {
            None
        };
        let shedding = &settings.resilience.shedding;
        if settings.engine.mode == rebate_engine::EngineMode::Naive {
            tracing::warn!(
                "engine.mode = naive: no cache, parts fetched one after another (a load-test baseline)"
            );
        }
        let engine_settings = EngineSettings {
            mode: settings.engine.mode,
            timeouts,
            short_timeouts: timeouts.scaled(
                shedding.core_timeout_factor,
                shedding.normal_timeout_factor,
                shedding.edge_timeout_factor,
            ),
            retries_per_request: settings.resilience.retry.max_per_request,
            rendered_capacity_bytes: settings.engine.rendered_max_bytes,
            cache_only_loads: settings.engine.cache_only_loads,
        };
        let engine = QueryEngine::with_settings(parts, engine_settings, clock, filter);

        let tasks = TaskTracker::new();
        if let Some(filter) = engine.item_filter() {
            tasks.spawn(background::maintain_item_filter(
                Arc::clone(filter),
                Arc::clone(&store),
                Duration::from_secs(settings.bloom.rebuild_interval_secs),
                shutdown.clone(),
            ));
        }
        if protection.shedder.is_some() {
            tasks.spawn(background::probe_queue_delay(
                Arc::clone(&protection),
                shutdown.clone(),
            ));
        }
        if settings.warmup.enabled {
            tasks.spawn(background::warm_up(
                engine.clone(),
                Arc::clone(&store),
                Arc::clone(&protection),
                background::WarmupPlan {
                    items: settings.warmup_items()?,
                    hot_items_limit: settings.warmup.hot_items_limit,
                    rate_per_sec: settings.warmup.rate_per_sec,
                    interval: Duration::from_secs(settings.warmup.interval_secs),
                    deadline: settings.request_deadline(),
                },
                shutdown.clone(),
            ));
        }

        let consistency = crate::consistency::ConsistencyObserver::new(
            settings.events.observer.settings(),
            engine.clone(),
            Arc::clone(&store),
            tasks.clone(),
            shutdown.clone(),
        );
        let invalidator = Invalidator::new(
            engine.clone(),
            Arc::clone(&protection),
            Some(Arc::clone(&consistency)),
            InvalidationSettings {
                fence_for: Duration::from_secs(settings.events.fence_secs),
                rewarm_deadline: settings.request_deadline(),
            },
            tasks.clone(),
            shutdown.clone(),
        );
        let (events, events_subscription) =
            start_event_bus(&settings, invalidator, shutdown.child_token())?;
        metrics.collect_from(StateCollector::new(
            engine.clone(),
            Arc::clone(&protection),
            events.clone(),
            Arc::clone(&consistency),
        ));

        let listener = crate::server::bind(settings.http.listen, settings.http.listen_backlog)
            .with_context(|| format!("binding http.listen {}", settings.http.listen))?;
        let admin_listener = TcpListener::bind(settings.admin.listen)
            .await
            .with_context(|| format!("binding admin.listen {}", settings.admin.listen))?;
        let admin_token = crate::admin_token::load_or_create(&settings)?;
        let state = AppState::new(AppShared {
            consistency,
            engine,
            store,
            tier,
            load_limiter,
            protection,
            slow_log: Arc::new(SlowLog::new(settings.observability.slow_log_size)),
            instance: Arc::from(settings.instance_id()),
            slow_after: Duration::from_millis(settings.observability.slow_request_ms),
            slow_log_lines_per_sec: settings.observability.slow_log_lines_per_sec,
            events,
            limits: Arc::new(HttpLimits {
                request_deadline: settings.request_deadline(),
                request_timeout: settings.request_timeout(),
                body_limit_bytes: settings.http.body_limit_bytes,
                max_batch_items: settings.http.max_batch_items,
                edge: Arc::new(EdgeLimits {
                    max_header_bytes: settings.http.max_header_bytes,
                    max_headers: settings.http.max_headers,
                    max_uri_bytes: settings.http.max_uri_bytes,
                    body_limit_bytes: settings.http.body_limit_bytes,
                    body_read_timeout: Duration::from_millis(settings.http.body_read_timeout_ms),
                }),
                admin_request_timeout: Duration::from_millis(settings.admin.request_timeout_ms),
            }),
            metrics: Arc::new(metrics),
            lifecycle: Arc::new(Lifecycle::default()),
            connections: Arc::new(ConnectionStats::default()),
        });
        Ok(Self {
            listener,
            admin_listener,
            admin_token,
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
        let admin_router = crate::http::admin::router(self.state.clone(), self.admin_token);
        let connections = Arc::clone(&self.state.connections);
        let router = crate::http::router(self.state);
        let shutdown = self.shutdown.clone();
        let admin_shutdown = CancellationToken::new();
        let admin = tokio::spawn(crate::server::serve(
            self.admin_listener,
            admin_router,
            self.admin_limits,
            Arc::new(crate::server::ConnectionStats::default()),
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

/// `rebate-query seed`: opens (creating and migrating) the configured catalogue and loads the demo
/// catalogue into it. Idempotent: rows already present are left alone.
pub async fn seed(settings: &Settings) -> anyhow::Result<()> {
    let report = match settings.store.backend {
        StoreBackend::Sqlite => open_sqlite(settings).await?.seed_demo().await,
        StoreBackend::Mysql => connect_mysql(settings).await?.seed_demo().await,
    }
    .context("seeding the demo catalogue")?;
    tracing::info!(
        products = report.products,
        rates = report.rates,
        hot_items = report.hot_items,
        elapsed_ms = report.elapsed.as_millis() as u64,
        "demo catalogue loaded"
    );
    Ok(())
}

async fn open_sqlite(settings: &Settings) -> anyhow::Result<SqliteStore> {
    let sqlite = &settings.store.sqlite;
    SqliteStore::open(&SqliteSettings {
        path: sqlite.path.clone(),
        max_connections: sqlite.max_connections,
        acquire_timeout: Duration::from_millis(sqlite.acquire_timeout_ms),
    })
    .await
    .with_context(|| format!("opening the SQLite store {}", sqlite.path.display()))
}

async fn connect_mysql(settings: &Settings) -> anyhow::Result<MySqlStore> {
    let mysql = &settings.store.mysql;
    let mut options = MySqlSettings::new(mysql.url.expose());
    options.max_connections = mysql.max_connections;
    options.min_connections = mysql.min_connections;
    options.acquire_timeout = Duration::from_millis(mysql.acquire_timeout_ms);
    options.statement_timeout = Duration::from_millis(mysql.statement_timeout_ms);
    // The store's error never contains the URL; `options`' Debug redacts it.
    MySqlStore::connect(&options)
        .await
        .with_context(|| format!("connecting to MySQL ({options:?})"))
}

async fn open_store(settings: &Settings) -> anyhow::Result<Arc<dyn CatalogRepository>> {
    let seed = settings.store.seed_demo;
    let (store, report): (Arc<dyn CatalogRepository>, _) = match settings.store.backend {
        StoreBackend::Sqlite => {
            let store = open_sqlite(settings).await?;
            let report = if seed {
                store.seed_demo_if_empty().await?
            } else {
                None
            };
            (Arc::new(store), report)
        }
        StoreBackend::Mysql => {
            let store = connect_mysql(settings).await?;
            let report = if seed {
                store.seed_demo_if_empty().await?
            } else {
                None
            };
            (Arc::new(store), report)
        }
    };
    if let Some(report) = report {
        tracing::info!(
            products = report.products,
            rates = report.rates,
            elapsed_ms = report.elapsed.as_millis() as u64,
            "demo catalogue seeded"
        );
    }
    Ok(store)
}

/// Connects the Redis L2 tier when enabled. An unreachable Redis at start is an error: an
/// instance that silently ran without L2 would multiply the load on MySQL unnoticed.
async fn connect_tier(settings: &Settings) -> anyhow::Result<Option<Arc<RedisTier>>> {
    let redis = &settings.redis;
    if !redis.enabled {
        return Ok(None);
    }
    let target = if redis.cluster_nodes.is_empty() {
        RedisTarget::Single(redis.url.expose().to_owned())
    } else {
        RedisTarget::Cluster(
            redis
                .cluster_nodes
                .iter()
                .map(|node| node.expose().to_owned())
                .collect(),
        )
    };
    let mut options = RedisTierSettings::new(target);
    options.prefix = redis.prefix.clone();
    options.command_timeout = Duration::from_millis(redis.command_timeout_ms);
    options.connect_timeout = Duration::from_millis(redis.connect_timeout_ms);
    let tier = RedisTier::connect(options.clone())
        .await
        .with_context(|| format!("connecting to Redis ({options:?})"))?;
    tracing::info!(prefix = %redis.prefix, "redis L2 tier connected");
    Ok(Some(Arc::new(tier)))
}

/// The bus operators' events arrive on (and are published to) in this instance.
#[derive(Clone)]
pub enum EventBus {
    InProcess(InProcessBus),
    Amqp {
        bus: Arc<AmqpBus>,
        publisher: Arc<AmqpEventPublisher>,
    },
}

impl std::fmt::Debug for EventBus {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EventBus::InProcess(_) => formatter.write_str("EventBus::InProcess"),
            EventBus::Amqp { bus, .. } => write!(formatter, "EventBus::Amqp({:?})", bus.status()),
        }
    }
}

impl EventBus {
    pub fn publisher(&self) -> &dyn EventPublisher {
        match self {
            EventBus::InProcess(bus) => bus,
            EventBus::Amqp { publisher, .. } => publisher.as_ref(),
        }
    }

    /// The in-process bus, for its dead letters and `settled()` (tests, embedded profile).
    pub fn in_process(&self) -> Option<&InProcessBus> {
        match self {
            EventBus::InProcess(bus) => Some(bus),
            EventBus::Amqp { .. } => None,
        }
    }

    /// The bus's counters, mapped onto the same five for either backend (for metrics).
    pub fn stats(&self) -> EventStats {
        match self {
            EventBus::InProcess(bus) => {
                let stats = bus.stats();
                EventStats {
                    published: stats.published,
                    processed: stats.delivered_broadcast + stats.delivered_shared,
                    failed: stats.redelivered + stats.dead_lettered + stats.abandoned,
                    redelivered: stats.redelivered,
                    dead_lettered: stats.dead_lettered,
                    abandoned: stats.abandoned,
                }
            }
            EventBus::Amqp { bus, .. } => {
                let stats = bus.stats();
                EventStats {
                    published: stats.publish_ok,
                    processed: stats.acked,
                    failed: stats.retried + stats.dead_lettered + stats.abandoned,
                    redelivered: stats.retried,
                    dead_lettered: stats.dead_lettered,
                    abandoned: stats.abandoned,
                }
            }
        }
    }

    /// Whether events can flow: always for the in-process bus, while connected for the broker.
    pub fn is_ready(&self) -> bool {
        match self {
            EventBus::InProcess(_) => true,
            EventBus::Amqp { bus, .. } => bus.is_ready(),
        }
    }

    /// What the latest reconnect did about the events missed meanwhile (never, in process).
    pub fn last_catch_up(&self) -> Option<rebate_amqp_bus::CatchUpOutcome> {
        match self {
            EventBus::InProcess(_) => None,
            EventBus::Amqp { bus, .. } => {
                bus.status().last_catch_up.map(|catch_up| catch_up.outcome)
            }
        }
    }
}

/// Event counters since start, the same for the in-process bus and RabbitMQ.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EventStats {
    /// Events this instance published (confirmed by the broker on RabbitMQ).
    pub published: u64,
    /// Deliveries handled: every broadcast one, and the shared ones the handler accepted.
    pub processed: u64,
    /// Deliveries refused (undecodable) or failed by the handler; each one was redelivered,
    /// dead-lettered or abandoned, so this is `redelivered + dead_lettered + abandoned`.
    pub failed: u64,
    pub redelivered: u64,
    pub dead_lettered: u64,
    /// Shared deliveries whose L1 effect is in place but whose L2 fence kept failing until the
    /// last attempt: acknowledged and counted, never dead-lettered.
    pub abandoned: u64,
}

fn start_event_bus(
    settings: &Settings,
    invalidator: Arc<Invalidator>,
    shutdown: CancellationToken,
) -> anyhow::Result<(EventBus, Option<Subscription>)> {
    let events = &settings.events;
    let signing_key = if events.signing_key.is_empty() {
        None
    } else {
        Some(
            SigningKey::new(events.signing_key.expose().as_bytes().to_vec())
                .map_err(|error| anyhow::anyhow!("events.signing_key: {error}"))?,
        )
    };
    let policy = ValidationPolicy {
        signing_key: signing_key.clone().filter(|_| events.require_signature),
        max_age: (events.max_age_secs > 0).then(|| Duration::from_secs(events.max_age_secs)),
        max_future_skew: Some(ValidationPolicy::DEFAULT_FUTURE_SKEW),
        now: rebate_domain::Timestamp::now(),
    };
    match events.backend {
        EventBackend::InProcess => {
            let bus = InProcessBus::start(
                BusSettings {
                    policy,
                    ..BusSettings::default()
                },
                shutdown,
            );
            let subscription = bus.subscribe(invalidator);
            Ok((EventBus::InProcess(bus), Some(subscription)))
        }
        EventBackend::Amqp => {
            let handler = Arc::new(DecodingHandler::new(invalidator, policy));
            let bus = AmqpBus::start(events.amqp.clone(), handler, shutdown)
                .context("starting the AMQP event bus")?;
            let publisher = AmqpEventPublisher::new(bus.publisher(), signing_key);
            tracing::info!(instance = %events.amqp.instance_id, "amqp event bus started");
            Ok((
                EventBus::Amqp {
                    bus: Arc::new(bus),
                    publisher: Arc::new(publisher),
                },
                None,
            ))
        }
    }
}

/// How much longer than a part's timeout its load may run before the cache cuts it.
const LOAD_TIMEOUT_GRACE: Duration = Duration::from_millis(100);

/// Builds each part's cache the same way: L1 always, L2 when a tier is configured.
struct PartBuilder<'a> {
    settings: &'a Settings,
    tier: Option<Arc<dyn SharedTier>>,
    clock: &'a Arc<dyn Clock>,
}

impl PartBuilder<'_> {
    fn build<T>(
        &self,
        part: PartKind,
        settings: &PartSettings,
        load_timeout: Duration,
        loader: Arc<dyn Loader<T>>,
    ) -> PartCache<T>
    where
        T: serde::Serialize + DeserializeOwned + Send + Sync + 'static,
    {
        let cache_settings = PartCacheSettings {
            name: part.as_str(),
            part,
            max_entries: settings.l1_max_entries,
            ttl: settings.ttl_policy(),
            // The dependency guard times each attempt out at the part's timeout and records it;
            // the cache's own cut comes a little later, as a backstop.
            load_timeout: load_timeout + LOAD_TIMEOUT_GRACE,
        };
        let clock = Arc::clone(self.clock);
        match &self.tier {
            None => PartCache::new(cache_settings, loader, clock),
            Some(tier) => {
                let redis = &self.settings.redis;
                let l2 = L2Settings {
                    tier: Arc::clone(tier),
                    ttl: settings.l2_ttl_policy(),
                    lease_ttl: Duration::from_millis(redis.lease_ttl_ms),
                    lease_wait: Duration::from_millis(redis.lease_wait_ms),
                    lease_poll: Duration::from_millis(redis.lease_poll_ms),
                };
                PartCache::with_shared_tier(cache_settings, l2, loader, clock)
            }
        }
    }
}
