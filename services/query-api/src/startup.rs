//! Building and running the service.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rebate_cache::{Clock, Loader, PartCache, PartCacheSettings, SystemClock};
use rebate_engine::{EngineParts, QueryEngine};
use rebate_sources::{CouponClient, ExtrasClient, ProductLoader, RateLoader, http_client};
use rebate_store::{CatalogRepository, SqliteSettings, SqliteStore};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use upstream_sim::RunningSimulator;

use crate::config::{PartSettings, Settings, StoreBackend};

/// What every handler shares. Cheap to clone.
#[derive(Debug, Clone)]
pub struct AppState {
    pub engine: QueryEngine,
    pub store: Arc<dyn CatalogRepository>,
    pub limits: Arc<HttpLimits>,
}

/// The request limits handlers and middleware enforce, resolved once from the settings.
#[derive(Debug, Clone)]
pub struct HttpLimits {
    pub request_deadline: Duration,
    pub request_timeout: Duration,
    pub body_limit_bytes: usize,
    pub max_batch_items: usize,
}

/// A built service bound to its listener, not yet serving.
#[derive(Debug)]
pub struct Application {
    listener: TcpListener,
    state: AppState,
    simulator: Option<RunningSimulator>,
    shutdown: CancellationToken,
    drain: Duration,
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
        let shutdown = CancellationToken::new();
        let store = open_store(&settings).await?;

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
        let client = http_client(Duration::from_millis(settings.upstreams.connect_timeout_ms))?;
        let coupons = CouponClient::new(client.clone(), &coupons_url)?;
        let extras = ExtrasClient::new(client, &extras_url)?;

        let timeouts = settings.part_timeouts();
        let parts = EngineParts {
            product: part_cache(
                "product",
                &settings.parts.product,
                timeouts.product,
                Arc::new(ProductLoader::new(Arc::clone(&store))),
                &clock,
            ),
            rate: part_cache(
                "rate",
                &settings.parts.rate,
                timeouts.rate,
                Arc::new(RateLoader::new(Arc::clone(&store))),
                &clock,
            ),
            coupons: part_cache(
                "coupons",
                &settings.parts.coupons,
                timeouts.coupons,
                Arc::new(coupons),
                &clock,
            ),
            extras: part_cache(
                "extras",
                &settings.parts.extras,
                timeouts.extras,
                Arc::new(extras),
                &clock,
            ),
        };
        let engine = QueryEngine::new(parts, timeouts, clock);

        let listener = TcpListener::bind(settings.http.listen)
            .await
            .with_context(|| format!("binding http.listen {}", settings.http.listen))?;
        let state = AppState {
            engine,
            store,
            limits: Arc::new(HttpLimits {
                request_deadline: settings.request_deadline(),
                request_timeout: settings.request_timeout(),
                body_limit_bytes: settings.http.body_limit_bytes,
                max_batch_items: settings.http.max_batch_items,
            }),
        };
        Ok(Self {
            listener,
            state,
            simulator,
            shutdown,
            drain: settings.shutdown_drain(),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
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
    /// most the configured drain time.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let address = self.local_addr();
        let router = crate::http::router(self.state);
        let shutdown = self.shutdown.clone();
        let server = axum::serve(
            self.listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(shutdown.clone().cancelled_owned());
        let mut server = tokio::spawn(server.into_future());
        tracing::info!(%address, "rebate query service listening");

        tokio::select! {
            finished = &mut server => {
                shutdown.cancel();
                return finished.context("server task failed")?.context("server failed");
            }
            () = shutdown.cancelled() => {}
        }
        tracing::info!(
            drain_ms = self.drain.as_millis() as u64,
            "shutting down, draining requests"
        );
        match tokio::time::timeout(self.drain, &mut server).await {
            Ok(finished) => finished
                .context("server task failed")?
                .context("server failed")?,
            Err(_elapsed) => {
                server.abort();
                tracing::warn!("drain time over; remaining connections closed");
            }
        }
        if let Some(simulator) = self.simulator {
            simulator.stopped().await;
        }
        tracing::info!("stopped");
        Ok(())
    }
}

/// `rebate-query seed`: opens (creating and migrating) the configured catalogue and loads the demo
/// catalogue into it. Idempotent.
pub async fn seed(settings: &Settings) -> anyhow::Result<()> {
    match settings.store.backend {
        StoreBackend::Sqlite => {
            let store = open_sqlite(settings).await?;
            let report = store
                .seed_demo()
                .await
                .context("seeding the demo catalogue")?;
            tracing::info!(
                products = report.products,
                rates = report.rates,
                elapsed_ms = report.elapsed.as_millis() as u64,
                "demo catalogue loaded"
            );
        }
    }
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

async fn open_store(settings: &Settings) -> anyhow::Result<Arc<dyn CatalogRepository>> {
    match settings.store.backend {
        StoreBackend::Sqlite => {
            let store = open_sqlite(settings).await?;
            if settings.store.seed_demo {
                let report = store
                    .seed_demo_if_empty()
                    .await
                    .context("seeding the demo catalogue")?;
                if let Some(report) = report {
                    tracing::info!(
                        products = report.products,
                        rates = report.rates,
                        elapsed_ms = report.elapsed.as_millis() as u64,
                        "demo catalogue seeded"
                    );
                }
            }
            Ok(Arc::new(store))
        }
    }
}

fn part_cache<T: Send + Sync + 'static>(
    name: &'static str,
    settings: &PartSettings,
    load_timeout: Duration,
    loader: Arc<dyn Loader<T>>,
    clock: &Arc<dyn Clock>,
) -> PartCache<T> {
    PartCache::new(
        PartCacheSettings {
            name,
            max_entries: settings.l1_max_entries,
            ttl: settings.ttl_policy(),
            load_timeout,
        },
        loader,
        Arc::clone(clock),
    )
}
