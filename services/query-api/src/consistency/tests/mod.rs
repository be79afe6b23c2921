//! The observer against in-process fakes: a store whose rows the tests set, part caches over
//! it (L1 alone, or over a [`MemoryTier`] as L2) on a manual clock, and tokio's paused clock
//! for the windows.

mod events;
mod sampler;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;
use rebate_cache::{
    Jitter, L2Config, LoadFailure, Loaded, Loader, ManualClock, MemoryTier, PartCache,
    PartCacheConfig, TtlPolicy,
};
use rebate_domain::{
    Cents, ItemId, ItemKey, PartKind, Platform, Product, ProductStatus, RateBps, RebateRate,
    Timestamp,
};
use rebate_engine::{EngineParts, PartTimeouts, QueryEngine, QuoteAnswer, ShedLevel};
use rebate_events::{EventId, EventKind, InvalidationEvent};
use rebate_store::{CatalogRepository, StoreCounters, StoreError, Versioned};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{ConsistencyObserver, ObserverConfig, ObserverReport, WindowReport};

const WINDOWS: [Duration; 3] = [
    Duration::from_secs(1),
    Duration::from_secs(10),
    Duration::from_secs(60),
];

/// The store: each row's version per item and part, changed by the tests.
#[derive(Debug, Default)]
struct Rows {
    versions: Mutex<HashMap<(ItemKey, PartKind), u64>>,
    counters: StoreCounters,
}

impl Rows {
    fn set(&self, key: ItemKey, part: PartKind, version: u64) {
        self.versions
            .lock()
            .expect("not poisoned")
            .insert((key, part), version);
    }

    fn version(&self, key: ItemKey, part: PartKind) -> Option<u64> {
        self.versions
            .lock()
            .expect("not poisoned")
            .get(&(key, part))
            .copied()
    }
}

fn product_row(key: ItemKey, version: u64) -> Versioned<Product> {
    Versioned {
        value: Product {
            platform: key.platform,
            item_id: key.item_id,
            title: "耳机".to_owned(),
            price_cents: Cents::new(10_000),
            image_url: String::new(),
            shop_name: String::new(),
            status: ProductStatus::OnSale,
        },
        version,
        updated_at: Timestamp::now(),
    }
}

fn rate_row(version: u64) -> Versioned<RebateRate> {
    Versioned {
        value: RebateRate {
            rate_bps: RateBps::try_from(500u64).expect("a rate"),
        },
        version,
        updated_at: Timestamp::now(),
    }
}

#[async_trait]
impl CatalogRepository for Rows {
    async fn product(&self, key: ItemKey) -> Result<Option<Versioned<Product>>, StoreError> {
        Ok(self
            .version(key, PartKind::Product)
            .map(|version| product_row(key, version)))
    }

    async fn rate(&self, key: ItemKey) -> Result<Option<Versioned<RebateRate>>, StoreError> {
        Ok(self.version(key, PartKind::Rate).map(rate_row))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn keys(&self) -> BoxStream<'_, Result<ItemKey, StoreError>> {
        futures::stream::empty().boxed()
    }

    async fn hot_keys(&self, _limit: u32) -> Result<Vec<ItemKey>, StoreError> {
        Ok(Vec::new())
    }

    fn counters(&self) -> &StoreCounters {
        &self.counters
    }
}

/// A part's source: its row as the store holds it now.
#[derive(Debug)]
struct ProductSource(Arc<Rows>);

#[async_trait]
impl Loader<Product> for ProductSource {
    async fn load(&self, key: ItemKey) -> Result<Loaded<Product>, LoadFailure> {
        let row = self
            .0
            .version(key, PartKind::Product)
            .map(|version| product_row(key, version));
        Ok(Loaded {
            version: row.as_ref().map_or(0, |row| row.version),
            value: row.map(|row| row.value),
        })
    }
}

#[derive(Debug)]
struct RateSource(Arc<Rows>);

#[async_trait]
impl Loader<RebateRate> for RateSource {
    async fn load(&self, key: ItemKey) -> Result<Loaded<RebateRate>, LoadFailure> {
        let row = self.0.version(key, PartKind::Rate).map(rate_row);
        Ok(Loaded {
            version: row.as_ref().map_or(0, |row| row.version),
            value: row.map(|row| row.value),
        })
    }
}

/// Coupons' and extras' source: nothing (no coupons, no extras; a complete quote all the same).
#[derive(Debug)]
struct Nothing;

#[async_trait]
impl<T: Send + Sync + 'static> Loader<T> for Nothing {
    async fn load(&self, _key: ItemKey) -> Result<Loaded<T>, LoadFailure> {
        Ok(Loaded {
            value: None,
            version: 0,
        })
    }
}

const FRESH_FOR: Duration = Duration::from_secs(600);

fn ttl() -> TtlPolicy {
    TtlPolicy {
        fresh: FRESH_FOR,
        jitter: Jitter::Ratio(0.0),
        stale: FRESH_FOR,
        not_found: FRESH_FOR,
    }
}

fn part<T>(
    kind: PartKind,
    loader: Arc<dyn Loader<T>>,
    clock: &ManualClock,
    tier: Option<&Arc<MemoryTier>>,
) -> PartCache<T>
where
    T: serde::Serialize + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    let settings = PartCacheConfig {
        name: kind.as_str(),
        part: kind,
        max_entries: 100,
        ttl: ttl(),
        load_timeout: Duration::from_secs(1),
        refresh_lead: Duration::ZERO,
        max_version_gap: 1_000_000,
    };
    let clock = Arc::new(clock.clone());
    match tier {
        None => PartCache::new(settings, loader, clock),
        Some(tier) => PartCache::with_shared_tier(
            settings,
            L2Config {
                tier: Arc::clone(tier) as Arc<dyn rebate_cache::SharedTier>,
                ttl: ttl(),
                lease_ttl: Duration::from_secs(5),
                lease_wait: Duration::from_secs(1),
                lease_poll: Duration::from_millis(10),
            },
            loader,
            clock,
        ),
    }
}

struct Observed {
    observer: Arc<ConsistencyObserver>,
    engine: QueryEngine,
    rows: Arc<Rows>,
    tasks: TaskTracker,
    shutdown: CancellationToken,
}

impl Observed {
    /// Waits (on the paused clock) until every window of every observed event and followed key
    /// is checked.
    async fn finish(&self) -> ObserverReport {
        self.tasks.close();
        self.tasks.wait().await;
        self.observer.report()
    }

    /// Answers `key` through the engine: its parts cached, and its quote kept rendered.
    async fn request(&self, key: ItemKey) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        let answer = self
            .engine
            .answer(key, deadline, ShedLevel::Normal)
            .await
            .expect("a quote");
        assert!(
            matches!(answer, QuoteAnswer::Rendered(_)),
            "a complete quote is kept"
        );
    }
}

fn settings() -> ObserverConfig {
    ObserverConfig {
        enabled: true,
        sample_ratio: 1.0,
        windows: WINDOWS.to_vec(),
        max_pending: 100,
        fence_for: Duration::from_secs(60),
        max_version_gap: 1_000_000,
        drift_keys_per_sec: 20,
    }
}

/// L1 only.
fn observed() -> Observed {
    observed_with(settings(), None)
}

fn observed_with(settings: ObserverConfig, tier: Option<&Arc<MemoryTier>>) -> Observed {
    let rows = Arc::new(Rows::default());
    let clock = ManualClock::starting_now();
    let parts = EngineParts {
        product: part(
            PartKind::Product,
            Arc::new(ProductSource(Arc::clone(&rows))),
            &clock,
            tier,
        ),
        rate: part(
            PartKind::Rate,
            Arc::new(RateSource(Arc::clone(&rows))),
            &clock,
            tier,
        ),
        coupons: part(PartKind::Coupons, Arc::new(Nothing), &clock, tier),
        extras: part(PartKind::Extras, Arc::new(Nothing), &clock, tier),
    };
    let second = Duration::from_secs(1);
    let timeouts = PartTimeouts {
        product: second,
        rate: second,
        coupons: second,
        extras: second,
    };
    let engine = QueryEngine::new(parts, timeouts, Arc::new(clock));
    let tasks = TaskTracker::new();
    let shutdown = CancellationToken::new();
    let observer = ConsistencyObserver::new(
        settings,
        engine.clone(),
        Arc::clone(&rows) as Arc<dyn CatalogRepository>,
        tasks.clone(),
        shutdown.clone(),
    );
    Observed {
        observer,
        engine,
        rows,
        tasks,
        shutdown,
    }
}

fn key(item: u64) -> ItemKey {
    ItemKey::new(Platform::Jd, ItemId::from_u64(item))
}

fn rate_changed(item: u64, version: u64) -> InvalidationEvent {
    rate_changed_by(&format!("evt-{item}-{version}"), item, version)
}

fn rate_changed_by(event_id: &str, item: u64, version: u64) -> InvalidationEvent {
    InvalidationEvent::new(
        EventId::parse(event_id).expect("valid id"),
        EventKind::RateChanged,
        Platform::Jd,
        vec![ItemId::from_u64(item)],
        version,
        Timestamp::now(),
    )
    .expect("valid event")
}

/// Each window's (consistent, inconsistent, unknown, ahead_of_store).
fn counts(windows: &[WindowReport]) -> Vec<(u64, u64, u64, u64)> {
    windows
        .iter()
        .map(|window| {
            (
                window.consistent,
                window.inconsistent,
                window.unknown,
                window.ahead_of_store,
            )
        })
        .collect()
}
