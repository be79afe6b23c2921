//! The query engine and what it reads through: the four part caches (L1, L2 when Redis is on,
//! each over its guarded source), the Bloom filter, and the engine's timeouts.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rebate_cache::{Clock, ItemFilter, L2Config, Loader, PartCache, PartCacheConfig, SharedTier};
use rebate_domain::{PartKind, Product, RebateRate};
use rebate_engine::{EngineConfig, EngineMode, EngineParts, QueryEngine};
use rebate_guard::GuardedTier;
use rebate_redis_tier::RedisTier;
use rebate_sources::{CatalogLoader, CouponClient, ExtrasClient, LoadLimiter, http_client};
use rebate_store::CatalogRepository;
use serde::de::DeserializeOwned;

use crate::config::{PartSettings, Settings};
use crate::protection::Protection;
use crate::upstreams::UpstreamClients;

/// What the engine's sources read from: the catalogue store, the L2 tier, and the coupon and
/// extras APIs (the embedded simulator's, when it runs).
pub(super) struct Sources<'a> {
    pub store: &'a Arc<dyn CatalogRepository>,
    pub tier: Option<&'a Arc<RedisTier>>,
    pub load_limiter: &'a Arc<LoadLimiter>,
    pub coupons_url: &'a str,
    pub extras_url: &'a str,
}

/// Builds the engine: one cache per part over its guarded loader, every L2 command through the
/// Redis breaker, the Bloom filter when enabled. The upstream clients come back too, for their
/// batch counters.
pub(super) fn build(
    settings: &Settings,
    sources: Sources<'_>,
    protection: &Protection,
    clock: Arc<dyn Clock>,
) -> anyhow::Result<(QueryEngine, UpstreamClients)> {
    let timeouts = settings.part_timeouts();
    let client = http_client(Duration::from_millis(settings.upstreams.connect_timeout_ms))?;
    let upstreams = &settings.upstreams;
    let coupons = Arc::new(CouponClient::new(
        client.clone(),
        sources.coupons_url,
        Arc::clone(&protection.coupons),
        upstreams.batch(upstreams.coupons_batch_max_items),
    )?);
    let extras = Arc::new(ExtrasClient::new(
        client,
        sources.extras_url,
        Arc::clone(&protection.extras),
        upstreams.batch(upstreams.extras_batch_max_items),
    )?);
    let clients = UpstreamClients {
        coupons: Arc::clone(&coupons),
        extras: Arc::clone(&extras),
    };

    // Every L2 command goes through the Redis breaker: while it is open, misses go straight to
    // the source instead of paying a command timeout each.
    let shared_tier: Option<Arc<dyn SharedTier>> = sources.tier.map(|tier| {
        Arc::new(GuardedTier::new(
            Arc::clone(tier) as Arc<dyn SharedTier>,
            Arc::clone(&protection.redis),
        )) as Arc<dyn SharedTier>
    });
    let builder = PartBuilder {
        settings,
        tier: shared_tier,
        clock: &clock,
    };
    // Products and rates share the store, its load limiter and the MySQL guard.
    let catalogue = Arc::new(CatalogLoader::new(
        Arc::clone(sources.store),
        Arc::clone(sources.load_limiter),
        Arc::clone(&protection.mysql),
    ));
    let parts = EngineParts {
        product: builder.build(
            PartKind::Product,
            &settings.parts.product,
            timeouts.product,
            Arc::clone(&catalogue) as Arc<dyn Loader<Product>>,
        ),
        rate: builder.build(
            PartKind::Rate,
            &settings.parts.rate,
            timeouts.rate,
            catalogue as Arc<dyn Loader<RebateRate>>,
        ),
        coupons: builder.build(
            PartKind::Coupons,
            &settings.parts.coupons,
            timeouts.coupons,
            coupons,
        ),
        extras: builder.build(
            PartKind::Extras,
            &settings.parts.extras,
            timeouts.extras,
            extras,
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
    if settings.engine.mode == EngineMode::Naive {
        tracing::warn!(
            "engine.mode = naive: no cache, parts fetched one after another (a load-test baseline)"
        );
    }
    let engine = QueryEngine::with_settings(parts, engine_settings(settings), clock, filter);
    Ok((engine, clients))
}

/// The engine's timeouts (and the shorter ones it uses while shedding), retry budget and
/// rendered-quote cache, from the settings.
fn engine_settings(settings: &Settings) -> EngineConfig {
    let budget = settings.request_budget();
    EngineConfig {
        mode: settings.engine.mode,
        timeouts: budget.timeouts,
        short_timeouts: budget.short_timeouts,
        retries_per_request: budget.retries_per_request,
        rendered_capacity_bytes: settings.engine.rendered_max_bytes,
        cache_only_loads: settings.engine.cache_only_loads,
        refresh_lead: settings.rendering_lead(),
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
        let cache_settings = PartCacheConfig {
            name: part.as_str(),
            part,
            max_entries: settings.l1_max_entries,
            ttl: settings.ttl_policy(),
            // The dependency guard times each attempt out at the part's timeout and records it;
            // the cache's own cut comes a little later, as a backstop.
            load_timeout: load_timeout + LOAD_TIMEOUT_GRACE,
            refresh_lead: Duration::from_millis(settings.refresh_ahead_ms),
            max_version_gap: self.settings.events.max_version_gap,
        };
        let clock = Arc::clone(self.clock);
        match &self.tier {
            None => PartCache::new(cache_settings, loader, clock),
            Some(tier) => {
                let redis = &self.settings.redis;
                let l2 = L2Config {
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
