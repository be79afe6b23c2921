//! [`QueryEngine`]: the parallel fan-out behind one quote.

use std::sync::Arc;
use std::time::Duration;

use rebate_cache::{CacheOutcome, Clock, FailureKind, LoadFailure, PartCache};
use rebate_domain::{Coupon, Extras, ItemKey, PartKind, Product, RebateRate};
use tokio::time::Instant;

use crate::quote::{DegradeReason, PartResult, Quote, assemble};
use crate::tier::{Tier, TimeoutTiers};

/// Why there is no quote at all. Everything else degrades inside the quote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    #[error("item not found (delisted: {delisted})")]
    NotFound { delisted: bool },
    #[error("product source unavailable ({reason:?}) and nothing stale is cached")]
    Unavailable { reason: DegradeReason },
}

/// The four part caches the engine reads through, with each part's timeout.
#[derive(Debug, Clone)]
pub struct EngineParts {
    pub product: PartCache<Product>,
    pub rate: PartCache<RebateRate>,
    pub coupons: PartCache<Vec<Coupon>>,
    pub extras: PartCache<Extras>,
}

/// Answers quotes. Cheap to clone; share one per process.
#[derive(Debug, Clone)]
pub struct QueryEngine {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    parts: EngineParts,
    timeouts: PartTimeouts,
    clock: Arc<dyn Clock>,
}

/// Each part's timeout, resolved from its tier (or its own override) at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartTimeouts {
    pub product: Duration,
    pub rate: Duration,
    pub coupons: Duration,
    pub extras: Duration,
}

impl PartTimeouts {
    /// The conventional tiers: product and rate are core, coupons normal, extras edge.
    pub fn from_tiers(tiers: &TimeoutTiers) -> Self {
        Self {
            product: tiers.timeout(Tier::Core),
            rate: tiers.timeout(Tier::Core),
            coupons: tiers.timeout(Tier::Normal),
            extras: tiers.timeout(Tier::Edge),
        }
    }

    pub fn get(&self, part: PartKind) -> Duration {
        match part {
            PartKind::Product => self.product,
            PartKind::Rate => self.rate,
            PartKind::Coupons => self.coupons,
            PartKind::Extras => self.extras,
        }
    }
}

impl QueryEngine {
    pub fn new(parts: EngineParts, timeouts: PartTimeouts, clock: Arc<dyn Clock>) -> Self {
        Self {
            inner: Arc::new(Inner {
                parts,
                timeouts,
                clock,
            }),
        }
    }

    pub fn parts(&self) -> &EngineParts {
        &self.inner.parts
    }

    pub fn timeouts(&self) -> PartTimeouts {
        self.inner.timeouts
    }

    /// The quote for one item, answered by `deadline` at the latest (plus scheduling noise).
    #[tracing::instrument(name = "quote", skip(self), fields(%key))]
    pub async fn quote(&self, key: ItemKey, deadline: Instant) -> Result<Quote, QueryError> {
        let parts = &self.inner.parts;
        let (product, rate, coupons, extras) = tokio::join!(
            self.fetch(&parts.product, PartKind::Product, key, deadline),
            self.fetch(&parts.rate, PartKind::Rate, key, deadline),
            self.fetch(&parts.coupons, PartKind::Coupons, key, deadline),
            self.fetch(&parts.extras, PartKind::Extras, key, deadline),
        );
        let result = assemble(product, rate, coupons, extras, self.inner.clock.now());
        if let Ok(quote) = &result
            && quote.degraded
        {
            tracing::debug!(parts = ?quote.degraded_parts, "quote degraded");
        }
        result
    }

    async fn fetch<T: Clone + Send + Sync + 'static>(
        &self,
        cache: &PartCache<T>,
        part: PartKind,
        key: ItemKey,
        deadline: Instant,
    ) -> PartResult<T> {
        let left = deadline.saturating_duration_since(Instant::now());
        let budget = self.inner.timeouts.get(part).min(left);
        match cache.get(key, budget).await {
            CacheOutcome::Hit(envelope) | CacheOutcome::Loaded(envelope) => PartResult::Live {
                value: envelope.value.clone(),
                as_of: envelope.fetched_at,
            },
            CacheOutcome::Stale(envelope, failure) => {
                tracing::debug!(part = part.as_str(), %failure, "serving stale");
                PartResult::Stale {
                    value: envelope.value.clone(),
                    as_of: envelope.fetched_at,
                    reason: reason_of(&failure),
                }
            }
            CacheOutcome::Failed(failure) => {
                tracing::debug!(part = part.as_str(), %failure, "part failed");
                PartResult::Failed {
                    reason: reason_of(&failure),
                }
            }
        }
    }
}

fn reason_of(failure: &LoadFailure) -> DegradeReason {
    match failure.kind {
        FailureKind::Timeout => DegradeReason::Timeout,
        FailureKind::Error => DegradeReason::Error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_trait::async_trait;
    use rebate_cache::{Loaded, Loader, ManualClock, PartCacheSettings, TtlPolicy};
    use rebate_domain::{Cents, ItemId, Platform, ProductStatus, RateBps};

    #[derive(Debug)]
    struct Fixed<T> {
        value: Option<T>,
        delay: Duration,
        fail: bool,
    }

    #[async_trait]
    impl<T: Clone + Send + Sync + std::fmt::Debug + 'static> Loader<T> for Fixed<T> {
        async fn load(&self, _key: ItemKey) -> Result<Loaded<T>, LoadFailure> {
            tokio::time::sleep(self.delay).await;
            if self.fail {
                return Err(LoadFailure::error("down"));
            }
            Ok(Loaded {
                value: self.value.clone(),
                version: 1,
            })
        }
    }

    fn part<T: Clone + Send + Sync + std::fmt::Debug + 'static>(
        name: &'static str,
        loader: Fixed<T>,
        clock: &ManualClock,
    ) -> PartCache<T> {
        PartCache::new(
            PartCacheSettings {
                name,
                max_entries: 100,
                ttl: TtlPolicy {
                    fresh: Duration::from_secs(60),
                    jitter_ratio: 0.1,
                    stale: Duration::from_secs(600),
                    not_found: Duration::from_secs(30),
                },
                load_timeout: Duration::from_secs(5),
            },
            Arc::new(loader),
            Arc::new(clock.clone()),
        )
    }

    fn key() -> ItemKey {
        ItemKey::new(Platform::Jd, ItemId::from_u64(100_001))
    }

    fn engine(coupon_delay: Duration, rate_fails: bool) -> QueryEngine {
        let clock = ManualClock::starting_now();
        let product = Product {
            platform: Platform::Jd,
            item_id: ItemId::from_u64(100_001),
            title: "耳机".to_owned(),
            price_cents: Cents::new(10_000),
            image_url: String::new(),
            shop_name: String::new(),
            status: ProductStatus::OnSale,
        };
        let parts = EngineParts {
            product: part(
                "product",
                Fixed {
                    value: Some(product),
                    delay: Duration::from_millis(5),
                    fail: false,
                },
                &clock,
            ),
            rate: part(
                "rate",
                Fixed {
                    value: Some(RebateRate {
                        rate_bps: RateBps::try_from(1000u64).unwrap(),
                    }),
                    delay: Duration::from_millis(5),
                    fail: rate_fails,
                },
                &clock,
            ),
            coupons: part(
                "coupons",
                Fixed {
                    value: Some(Vec::new()),
                    delay: coupon_delay,
                    fail: false,
                },
                &clock,
            ),
            extras: part(
                "extras",
                Fixed {
                    value: Some(Extras {
                        sales_30d: 1,
                        popular_searches: vec![],
                    }),
                    delay: Duration::from_millis(5),
                    fail: false,
                },
                &clock,
            ),
        };
        QueryEngine::new(
            parts,
            PartTimeouts::from_tiers(&TimeoutTiers::default()),
            Arc::new(clock),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn parts_are_fetched_in_parallel() {
        let engine = engine(Duration::from_millis(5), false);
        let started = Instant::now();
        let quote = engine
            .quote(key(), Instant::now() + Duration::from_secs(2))
            .await
            .unwrap();
        // Four 5 ms loads in parallel take 5 ms of (paused) time, not 20.
        assert_eq!(started.elapsed(), Duration::from_millis(5));
        assert!(!quote.degraded);
        assert_eq!(quote.rebate.estimated_cents, Some(Cents::new(1000)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_part_is_cut_at_its_tier() {
        let engine = engine(Duration::from_secs(3), false);
        let started = Instant::now();
        let quote = engine
            .quote(key(), Instant::now() + Duration::from_secs(2))
            .await
            .unwrap();
        assert_eq!(started.elapsed(), Duration::from_millis(500));
        assert_eq!(quote.degraded_parts.len(), 1);
        assert_eq!(quote.degraded_parts[0].part, PartKind::Coupons);
        assert_eq!(quote.degraded_parts[0].reason, DegradeReason::Timeout);
    }

    #[tokio::test(start_paused = true)]
    async fn the_request_deadline_caps_every_tier() {
        let engine = engine(Duration::from_secs(3), false);
        let started = Instant::now();
        let quote = engine
            .quote(key(), Instant::now() + Duration::from_millis(200))
            .await
            .unwrap();
        assert_eq!(started.elapsed(), Duration::from_millis(200));
        assert!(quote.degraded);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_rate_degrades_to_template() {
        let engine = engine(Duration::from_millis(5), true);
        let quote = engine
            .quote(key(), Instant::now() + Duration::from_secs(2))
            .await
            .unwrap();
        assert_eq!(quote.rebate.rate_bps, None);
        assert_eq!(quote.degraded_parts[0].reason, DegradeReason::Error);
    }
}
