//! Opening the catalogue store (SQLite or MySQL, seeded with the demo catalogue when asked) and
//! connecting the Redis L2 tier.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rebate_redis_tier::{RedisTarget, RedisTier, RedisTierConfig};
use rebate_store::{
    CatalogRepository, MySqlConfig, MySqlStore, RuleRepository, SqliteConfig, SqliteStore,
};

use crate::config::{Settings, StoreBackend};

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
    SqliteStore::open(&SqliteConfig {
        path: sqlite.path.clone(),
        max_connections: sqlite.max_connections,
        acquire_timeout: Duration::from_millis(sqlite.acquire_timeout_ms),
    })
    .await
    .with_context(|| format!("opening the SQLite store {}", sqlite.path.display()))
}

async fn connect_mysql(settings: &Settings) -> anyhow::Result<MySqlStore> {
    let mysql = &settings.store.mysql;
    let mut options = MySqlConfig::new(mysql.url.expose());
    options.max_connections = mysql.max_connections;
    options.min_connections = mysql.min_connections;
    options.acquire_timeout = Duration::from_millis(mysql.acquire_timeout_ms);
    options.statement_timeout = Duration::from_millis(mysql.statement_timeout_ms);
    // The store's error never contains the URL; `options`' Debug redacts it.
    MySqlStore::connect(&options)
        .await
        .with_context(|| format!("connecting to MySQL ({options:?})"))
}

/// The catalogue, and the same store's live rule sets (`crate::rules`).
pub(super) async fn open_store(
    settings: &Settings,
) -> anyhow::Result<(Arc<dyn CatalogRepository>, Arc<dyn RuleRepository>)> {
    let seed = settings.store.seed_demo;
    let (store, rules, report): (Arc<dyn CatalogRepository>, Arc<dyn RuleRepository>, _) =
        match settings.store.backend {
            StoreBackend::Sqlite => {
                let store = open_sqlite(settings).await?;
                let report = if seed {
                    store.seed_demo_if_empty().await?
                } else {
                    None
                };
                let store = Arc::new(store);
                (Arc::clone(&store) as _, store as _, report)
            }
            StoreBackend::Mysql => {
                let store = connect_mysql(settings).await?;
                let report = if seed {
                    store.seed_demo_if_empty().await?
                } else {
                    None
                };
                let store = Arc::new(store);
                (Arc::clone(&store) as _, store as _, report)
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
    Ok((store, rules))
}

/// Connects the Redis L2 tier when enabled. An unreachable Redis at start is an error: an
/// instance that silently ran without L2 would multiply the load on MySQL unnoticed.
pub(super) async fn connect_tier(settings: &Settings) -> anyhow::Result<Option<Arc<RedisTier>>> {
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
    let mut options = RedisTierConfig::new(target);
    options.prefix = redis.prefix.clone();
    options.command_timeout = Duration::from_millis(redis.command_timeout_ms);
    options.connect_timeout = Duration::from_millis(redis.connect_timeout_ms);
    options.tls = redis.tls.load()?;
    let tier = RedisTier::connect(options.clone())
        .await
        .with_context(|| format!("connecting to Redis ({options:?})"))?;
    tracing::info!(prefix = %redis.prefix, "redis L2 tier connected");
    Ok(Some(Arc::new(tier)))
}
