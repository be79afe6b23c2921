//! [`QueryEngine`]: the parallel fan-out behind one quote.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::future::join_all;
use rebate_cache::refresh::uniform_draw;
use rebate_cache::{
    CacheOutcome, Clock, ItemFilter, LoadContext, PartCache, TierError, TierKey, refresh_due,
};
use rebate_domain::{ItemKey, PartKind, Timestamp};
use rebate_resilience::ShedLevel;
use rebate_telemetry::record_stage;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::error::{DegradeReason, QueryError};
use crate::naive;
use crate::parts::EngineParts;
use crate::quote::{PartResult, Quote, assemble};
use crate::rendered::{QuoteAnswer, RenderTicket, RenderedQuote, RenderedQuotes, RenderedStats};
#[cfg(test)]
use crate::timeout_class::ClassTimeouts;
use crate::timeout_class::PartTimeouts;

/// Answers quotes. Cheap to clone; share one per process.
#[derive(Debug, Clone)]
pub struct QueryEngine {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    parts: EngineParts,
    settings: EngineConfig,
    clock: Arc<dyn Clock>,
    /// The Bloom gate; `None` lets every key through (tests, tiny catalogues).
    filter: Option<Arc<ItemFilter>>,
    /// Complete quotes as JSON; `None` when `rendered_capacity_bytes` is 0 or in naive mode.
    rendered: Option<RenderedQuotes>,
    /// Permits for the loads shed level 3 still lets through (`cache_only_loads`).
    warming: Semaphore,
    warming_stats: WarmingCounters,
}

/// What shed level 3 did with keys L1 lacked a part of.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CacheOnlyLoads {
    /// The most that may run at once (`cache_only_loads`).
    pub capacity: usize,
    /// Loads started at level 3 (each warms the caches for every later request).
    pub started: u64,
    /// Keys answered from L1 alone, without their missing parts, because every permit was taken.
    pub refused: u64,
}

#[derive(Debug, Default)]
struct WarmingCounters {
    started: AtomicU64,
    refused: AtomicU64,
}

/// How the engine fetches parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineMode {
    /// The product: parallel fan-out through the cache tiers.
    #[default]
    Aggregated,
    /// The "before" system, for load-test comparisons only: no cache, the four parts fetched
    /// one after another from their sources.
    Naive,
}

/// How the engine answers under normal load and under load shedding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineConfig {
    pub mode: EngineMode,
    pub timeouts: PartTimeouts,
    /// The shortened timeouts of shed level 2 and above.
    pub short_timeouts: PartTimeouts,
    /// Retries one request may spend across all its parts (the dependencies decide whether a
    /// failure is worth one).
    pub retries_per_request: u32,
    /// Bytes of complete quotes kept as JSON for [`QueryEngine::answer`]; 0 turns that off.
    pub rendered_capacity_bytes: u64,
    /// At shed level 3, keys L1 lacks a part of may still load, this many at a time (at level
    /// 2's timeouts), so that a cold instance under load warms instead of refusing every miss
    /// for as long as the load lasts. 0 is strict cache-only.
    pub cache_only_loads: usize,
    /// Refresh ahead for kept renderings: the longest of the parts' `refresh_lead`s (zero: off).
    pub refresh_lead: Duration,
}

impl EngineConfig {
    /// Kept renderings (32 MiB) are the default for a service; tests that only want quotes can
    /// set `rendered_capacity_bytes` to 0.
    pub const DEFAULT_RENDERED_CAPACITY_BYTES: u64 = 32 << 20;

    /// Warming loads at shed level 3, at a time.
    pub const DEFAULT_CACHE_ONLY_LOADS: usize = 8;

    /// No shortening; two retries per request.
    pub fn new(timeouts: PartTimeouts) -> Self {
        Self {
            mode: EngineMode::Aggregated,
            timeouts,
            short_timeouts: timeouts,
            retries_per_request: 2,
            rendered_capacity_bytes: Self::DEFAULT_RENDERED_CAPACITY_BYTES,
            cache_only_loads: Self::DEFAULT_CACHE_ONLY_LOADS,
            refresh_lead: Duration::ZERO,
        }
    }
}

impl QueryEngine {
    pub fn new(parts: EngineParts, timeouts: PartTimeouts, clock: Arc<dyn Clock>) -> Self {
        Self::with_settings(parts, EngineConfig::new(timeouts), clock, None)
    }

    /// The engine with every knob: shed-level timeouts, retries and the optional Bloom gate.
    pub fn with_settings(
        parts: EngineParts,
        settings: EngineConfig,
        clock: Arc<dyn Clock>,
        filter: Option<Arc<ItemFilter>>,
    ) -> Self {
        let rendered = (settings.mode == EngineMode::Aggregated
            && settings.rendered_capacity_bytes > 0)
            .then(|| RenderedQuotes::new(settings.rendered_capacity_bytes));
        Self {
            inner: Arc::new(Inner {
                parts,
                warming: Semaphore::new(settings.cache_only_loads.min(Semaphore::MAX_PERMITS)),
                settings,
                clock,
                filter,
                rendered,
                warming_stats: WarmingCounters::default(),
            }),
        }
    }

    /// Counters of the loads shed level 3 let through or refused.
    pub fn cache_only_loads(&self) -> CacheOnlyLoads {
        let stats = &self.inner.warming_stats;
        CacheOnlyLoads {
            capacity: self.inner.settings.cache_only_loads,
            started: stats.started.load(Ordering::Relaxed),
            refused: stats.refused.load(Ordering::Relaxed),
        }
    }

    /// Counters of the rendered-quote map; `None` when it is off.
    pub fn rendered_stats(&self) -> Option<RenderedStats> {
        self.inner.rendered.as_ref().map(RenderedQuotes::stats)
    }

    pub fn item_filter(&self) -> Option<&Arc<ItemFilter>> {
        self.inner.filter.as_ref()
    }

    fn passes_filter(&self, key: &ItemKey) -> bool {
        self.inner
            .filter
            .as_ref()
            .is_none_or(|filter| filter.might_contain(key))
    }

    pub fn parts(&self) -> &EngineParts {
        &self.inner.parts
    }

    /// The clock freshness is judged by.
    pub fn now(&self) -> Timestamp {
        self.inner.clock.now()
    }

    pub fn settings(&self) -> EngineConfig {
        self.inner.settings
    }

    /// The quote for one item, answered by `deadline` at the latest (plus scheduling noise).
    pub async fn quote(&self, key: ItemKey, deadline: Instant) -> Result<Quote, QueryError> {
        self.assemble_one(key, deadline, ShedLevel::Normal)
            .await
            .map(|(quote, _)| quote)
    }

    /// The answer for one item at a load-shedding level: from level 1 extras come from L1 or not
    /// at all; from level 2 every part waits its shortened timeout; level 3 answers from the cache
    /// tiers only, and a product nobody has cached is [`QueryError::Unavailable`] with reason
    /// `shed`. Answered from the quote's rendering when a complete quote for `key` was assembled
    /// earlier and none of its inputs has changed since (see [`RenderedQuotes`]): one lookup
    /// instead of four, and no serialisation. A complete quote assembled now is rendered and kept
    /// for the next request.
    pub async fn answer(
        &self,
        key: ItemKey,
        deadline: Instant,
        level: ShedLevel,
    ) -> Result<QuoteAnswer, QueryError> {
        let Some(rendered) = &self.inner.rendered else {
            return self
                .assemble_one(key, deadline, level)
                .await
                .map(|(quote, _)| QuoteAnswer::Assembled(Box::new(quote)));
        };
        if let Some((hit, _)) = self.answer_rendered(key) {
            return Ok(QuoteAnswer::Rendered(hit));
        }
        let ticket = rendered.begin();
        let (quote, fresh_until) = self.assemble_one(key, deadline, level).await?;
        Ok(self.keep(rendered, key, quote, fresh_until, ticket))
    }

    /// [`QueryEngine::answer`]'s first step on its own, without a future: the kept rendering of
    /// `key`'s complete quote when one is valid now. Callers on the hot path try this first and
    /// build (and box) `answer`'s larger future only when it misses. With the rendering comes
    /// the time it was found valid at (what is left of its validity is its answer's freshness).
    pub fn answer_rendered(&self, key: ItemKey) -> Option<(Arc<RenderedQuote>, Timestamp)> {
        let rendered = self.inner.rendered.as_ref()?;
        let now = self.inner.clock.now();
        let hit = rendered.get(&key, now)?;
        self.refresh_ahead(key, &hit, now);
        Some((hit, now))
    }

    /// A read of a kept rendering near its end starts, once per rendering, the background
    /// refresh of the parts it ends with ([`rebate_cache::refresh`]): the rendering's reads
    /// never reach the part caches, whose own refresh ahead would never run for a hot key.
    /// When the rendering ends, its parts are fresh in L1 again and the next read assembles
    /// without waiting on a load.
    fn refresh_ahead(&self, key: ItemKey, rendered: &RenderedQuote, now: Timestamp) {
        let lead = self.inner.settings.refresh_lead;
        if refresh_due(rendered.valid_until(), now, lead, uniform_draw) && rendered.claim_refresh()
        {
            for (_, part) in self.inner.parts.views().iter() {
                part.refresh_ahead(key, rendered.valid_until());
            }
        }
    }

    /// Renders and keeps a complete quote whose four parts were fresh until `fresh_until`.
    fn keep(
        &self,
        rendered: &RenderedQuotes,
        key: ItemKey,
        quote: Quote,
        fresh_until: Option<Timestamp>,
        ticket: RenderTicket,
    ) -> QuoteAnswer {
        let now = self.inner.clock.now();
        let kept = fresh_until.and_then(|fresh_until| {
            // The estimate counts only coupons not yet expired: it changes at the next expiry.
            let next_expiry = quote
                .coupons
                .iter()
                .map(|coupon| coupon.expires_at)
                .filter(|expires_at| *expires_at > now)
                .min();
            let valid_until = next_expiry.map_or(fresh_until, |expiry| expiry.min(fresh_until));
            rendered.insert(key, &quote, ticket, valid_until, now)
        });
        match kept {
            Some(rendered) => QuoteAnswer::Rendered(rendered),
            None => QuoteAnswer::Assembled(Box::new(quote)),
        }
    }

    /// The quote, and — when all four parts were fresh cache entries — the earliest time one of
    /// them stops being fresh.
    #[tracing::instrument(
        name = "quote",
        level = "debug",
        skip(self),
        fields(%key, level = level.as_str())
    )]
    async fn assemble_one(
        &self,
        key: ItemKey,
        deadline: Instant,
        level: ShedLevel,
    ) -> Result<(Quote, Option<Timestamp>), QueryError> {
        if !self.passes_filter(&key) {
            return Err(QueryError::NotFound { delisted: false });
        }
        if self.inner.settings.mode == EngineMode::Naive {
            return naive::quote(&self.inner.parts, key, self.inner.clock.as_ref())
                .await
                .map(|quote| (quote, None));
        }
        if level == ShedLevel::CacheOnly {
            let started = Instant::now();
            self.prefetch_shared_tier(&[key]).await;
            let cached = self.quote_cached(key);
            record_stage("shed", "engine", "cache_only", started, None);
            return self.warm_or(cached, key, deadline, None).await;
        }
        let request = self.request_context(deadline);
        self.quote_admitted(key, deadline, level, &request).await
    }

    /// Shed level 3's answer for a key: L1's, unless L1 lacks one of its parts and a warming
    /// permit is free; then the key loads at level 2 (short timeouts, no extras), which fills
    /// the caches for every later request. The permit is held until the load ends, so at most
    /// `cache_only_loads` run at once however many requests miss. A batch passes its one
    /// request context; a single request gets its own only if it loads.
    async fn warm_or(
        &self,
        cached: Cached,
        key: ItemKey,
        deadline: Instant,
        request: Option<&LoadContext>,
    ) -> Result<(Quote, Option<Timestamp>), QueryError> {
        if !cached.incomplete {
            return cached.answer;
        }
        let stats = &self.inner.warming_stats;
        let Ok(_permit) = self.inner.warming.try_acquire() else {
            stats.refused.fetch_add(1, Ordering::Relaxed);
            return cached.answer;
        };
        stats.started.fetch_add(1, Ordering::Relaxed);
        let owned;
        let request = match request {
            Some(request) => request,
            None => {
                owned = self.request_context(deadline);
                &owned
            }
        };
        let started = Instant::now();
        let answer = self
            .quote_admitted(key, deadline, ShedLevel::ShortTimeouts, request)
            .await;
        record_stage("shed", "engine", "warming_load", started, None);
        answer
    }

    /// One request's deadline and retry allowance, shared by every part of every item in it.
    fn request_context(&self, deadline: Instant) -> LoadContext {
        LoadContext::new(Some(deadline), self.inner.settings.retries_per_request)
    }

    /// The fan-out for a key that passed the filter.
    async fn quote_admitted(
        &self,
        key: ItemKey,
        deadline: Instant,
        level: ShedLevel,
        request: &LoadContext,
    ) -> Result<(Quote, Option<Timestamp>), QueryError> {
        let parts = &self.inner.parts;
        let (product, rate, coupons, extras) = tokio::join!(
            self.fetch(
                &parts.product,
                PartKind::Product,
                key,
                deadline,
                level,
                request
            ),
            self.fetch(&parts.rate, PartKind::Rate, key, deadline, level, request),
            self.fetch(
                &parts.coupons,
                PartKind::Coupons,
                key,
                deadline,
                level,
                request
            ),
            self.fetch(
                &parts.extras,
                PartKind::Extras,
                key,
                deadline,
                level,
                request
            ),
        );
        let fresh_until = earliest([product.1, rate.1, coupons.1, extras.1]);
        let result = assemble(
            product.0,
            rate.0,
            coupons.0,
            extras.0,
            self.inner.clock.now(),
        );
        if let Ok(quote) = &result
            && quote.degraded
        {
            tracing::debug!(parts = ?quote.degraded_parts, "quote degraded");
        }
        result.map(|quote| (quote, fresh_until))
    }

    /// Drops this instance's L1 and kept renderings whole (see [`PartCache::forget_all`]): what
    /// an instance does when it cannot know which invalidation events it missed.
    pub fn forget_l1(&self) {
        for (_, part) in self.inner.parts.views().iter() {
            part.forget_all();
        }
        if let Some(rendered) = &self.inner.rendered {
            rendered.invalidate_all();
        }
    }

    /// Fences one part of one item at `version` after a change event (see
    /// [`PartCache::invalidate_to`]): L1 always, the shared tier too when `through_l2`.
    pub async fn invalidate(
        &self,
        key: ItemKey,
        part: PartKind,
        version: u64,
        fence_for: Duration,
        through_l2: bool,
    ) -> Result<(), TierError> {
        let parts = &self.inner.parts;
        // Before the part's L1 fence: its rendering goes first, and none is kept until the
        // fences (L2's round trip included) are in place; a rendering begun before is refused.
        let rendering = self
            .inner
            .rendered
            .as_ref()
            .map(|rendered| rendered.invalidating(key));
        let fenced = parts
            .view(part)
            .invalidate_to(key, version, fence_for, through_l2)
            .await;
        // Dropped after the fences (even if L2 failed): a rendering begun after this reads the
        // fenced part.
        drop(rendering);
        fenced
    }

    /// Quotes for several items under one deadline, in order. Whatever L1 lacks is read from L2
    /// first in a single round trip, so a batch never pays one L2 trip per key and part.
    pub async fn quote_many(
        &self,
        keys: &[ItemKey],
        deadline: Instant,
    ) -> Vec<Result<Quote, QueryError>> {
        self.assemble_many(keys, deadline, ShedLevel::Normal)
            .await
            .into_iter()
            .map(|answer| answer.map(|(quote, _)| quote))
            .collect()
    }

    /// [`QueryEngine::answer`] for several items under one deadline, in order: each key answered
    /// from its rendering when one is valid, the rest assembled together (one L2 round trip for
    /// what L1 lacks), and the complete ones kept.
    pub async fn answer_many(
        &self,
        keys: &[ItemKey],
        deadline: Instant,
        level: ShedLevel,
    ) -> Vec<Result<QuoteAnswer, QueryError>> {
        let Some(rendered) = &self.inner.rendered else {
            return self
                .assemble_many(keys, deadline, level)
                .await
                .into_iter()
                .map(|answer| answer.map(|(quote, _)| QuoteAnswer::Assembled(Box::new(quote))))
                .collect();
        };
        let now = self.inner.clock.now();
        let mut answers: Vec<Option<Result<QuoteAnswer, QueryError>>> = keys
            .iter()
            .map(|key| {
                rendered.get(key, now).map(|hit| {
                    self.refresh_ahead(*key, &hit, now);
                    Ok(QuoteAnswer::Rendered(hit))
                })
            })
            .collect();
        let missing: Vec<ItemKey> = keys
            .iter()
            .zip(&answers)
            .filter(|(_, answer)| answer.is_none())
            .map(|(key, _)| *key)
            .collect();
        if !missing.is_empty() {
            let ticket = rendered.begin();
            let mut assembled = self
                .assemble_many(&missing, deadline, level)
                .await
                .into_iter()
                .zip(missing);
            for answer in answers.iter_mut().filter(|answer| answer.is_none()) {
                let (result, key) = assembled
                    .next()
                    .expect("one assembled answer per missing key");
                *answer = Some(result.map(|(quote, fresh_until)| {
                    self.keep(rendered, key, quote, fresh_until, ticket)
                }));
            }
        }
        answers
            .into_iter()
            .map(|answer| answer.expect("every key answered"))
            .collect()
    }

    async fn assemble_many(
        &self,
        keys: &[ItemKey],
        deadline: Instant,
        level: ShedLevel,
    ) -> Vec<Result<(Quote, Option<Timestamp>), QueryError>> {
        let admitted: Vec<bool> = keys.iter().map(|key| self.passes_filter(key)).collect();
        let to_prefetch: Vec<ItemKey> = keys
            .iter()
            .zip(&admitted)
            .filter(|(_, admitted)| **admitted)
            .map(|(key, _)| *key)
            .collect();
        if self.inner.settings.mode != EngineMode::Naive {
            self.prefetch_shared_tier(&to_prefetch).await;
        }
        if level == ShedLevel::CacheOnly {
            let request = &self.request_context(deadline);
            return join_all(keys.iter().zip(admitted).map(|(key, admitted)| async move {
                if admitted {
                    let cached = self.quote_cached(*key);
                    self.warm_or(cached, *key, deadline, Some(request)).await
                } else {
                    Err(QueryError::NotFound { delisted: false })
                }
            }))
            .await;
        }
        if self.inner.settings.mode == EngineMode::Naive {
            let mut quotes = Vec::with_capacity(keys.len());
            for (key, admitted) in keys.iter().zip(admitted) {
                quotes.push(if admitted {
                    naive::quote(&self.inner.parts, *key, self.inner.clock.as_ref())
                        .await
                        .map(|quote| (quote, None))
                } else {
                    Err(QueryError::NotFound { delisted: false })
                });
            }
            return quotes;
        }
        // One allowance of retries for the whole batch, as for any one request.
        let request = &self.request_context(deadline);
        join_all(keys.iter().zip(admitted).map(|(key, admitted)| async move {
            if admitted {
                self.quote_admitted(*key, deadline, level, request).await
            } else {
                Err(QueryError::NotFound { delisted: false })
            }
        }))
        .await
    }

    /// Shed level 3: whatever L1 holds (after any L2 prefetch), fresh or stale; no loads.
    fn quote_cached(&self, key: ItemKey) -> Cached {
        let parts = &self.inner.parts;
        let now = self.inner.clock.now();
        let (product, rate, coupons, extras) = (
            cached(&parts.product, key, now),
            cached(&parts.rate, key, now),
            cached(&parts.coupons, key, now),
            cached(&parts.extras, key, now),
        );
        // Extras are off from level 1 on: their absence is no reason to load.
        let incomplete = product.0.is_failed() || rate.0.is_failed() || coupons.0.is_failed();
        let fresh_until = earliest([product.1, rate.1, coupons.1, extras.1]);
        Cached {
            answer: assemble(product.0, rate.0, coupons.0, extras.0, now)
                .map(|quote| (quote, fresh_until)),
            incomplete,
        }
    }

    async fn prefetch_shared_tier(&self, keys: &[ItemKey]) {
        let parts = &self.inner.parts;
        let Some(tier) = parts.product.shared_tier() else {
            return;
        };
        let views = parts.views();
        let wanted: Vec<TierKey> = keys
            .iter()
            .flat_map(|key| {
                views
                    .iter()
                    .filter(|(_, view)| view.needs_load(key))
                    .map(|(part, _)| TierKey { item: *key, part })
            })
            .collect();
        if wanted.is_empty() {
            return;
        }
        let entries = match tier.get_many(&wanted).await {
            Ok(entries) => entries,
            Err(error) => {
                tracing::debug!(%error, "batch L2 prefetch failed; parts load one by one");
                return;
            }
        };
        for (tier_key, entry) in wanted.iter().zip(entries) {
            let Some(entry) = entry else { continue };
            views[tier_key.part].absorb(tier_key.item, &entry);
        }
    }

    async fn fetch<T: Clone + Serialize + DeserializeOwned + Send + Sync + 'static>(
        &self,
        cache: &PartCache<T>,
        part: PartKind,
        key: ItemKey,
        deadline: Instant,
        level: ShedLevel,
        request: &LoadContext,
    ) -> (PartResult<T>, Option<Timestamp>) {
        if part == PartKind::Extras && level >= ShedLevel::DropExtras {
            return cached(cache, key, self.inner.clock.now());
        }
        let settings = &self.inner.settings;
        let timeouts = if level >= ShedLevel::ShortTimeouts {
            &settings.short_timeouts
        } else {
            &settings.timeouts
        };
        let timeout = timeouts[part];
        let started = Instant::now();
        let budget = timeout.min(deadline.saturating_duration_since(started));
        // A load this call starts keeps the part's timeout at this level, the request's deadline
        // (for retries) and its retry allowance.
        let outcome = request
            .for_part(timeout)
            .scope(cache.get(key, budget))
            .await;
        let result = match outcome {
            CacheOutcome::Hit(envelope) => {
                return (
                    PartResult::Live {
                        value: envelope.value.clone(),
                        as_of: envelope.fetched_at,
                    },
                    Some(envelope.fresh_until),
                );
            }
            CacheOutcome::Loaded(envelope) => {
                record_stage("part", part.as_str(), "loaded", started, None);
                return (
                    PartResult::Live {
                        value: envelope.value.clone(),
                        as_of: envelope.fetched_at,
                    },
                    Some(envelope.fresh_until),
                );
            }
            CacheOutcome::Stale(envelope, failure) => {
                tracing::debug!(part = part.as_str(), %failure, "serving stale");
                let reason = DegradeReason::from(failure.kind);
                record_stage(
                    "part",
                    part.as_str(),
                    format!("stale ({})", reason.as_str()),
                    started,
                    None,
                );
                PartResult::Stale {
                    value: envelope.value.clone(),
                    as_of: envelope.fetched_at,
                    reason,
                }
            }
            CacheOutcome::Failed(failure) => {
                tracing::debug!(part = part.as_str(), %failure, "part failed");
                let reason = DegradeReason::from(failure.kind);
                record_stage(
                    "part",
                    part.as_str(),
                    format!("template ({})", reason.as_str()),
                    started,
                    None,
                );
                PartResult::Failed { reason }
            }
        };
        (result, None)
    }
}

/// The earliest of the parts' fresh ends; `None` if any part was not a fresh cache entry.
/// A quote from L1 alone, and whether L1 lacked one of the parts a level-2 load would fetch.
struct Cached {
    answer: Result<(Quote, Option<Timestamp>), QueryError>,
    incomplete: bool,
}

fn earliest(fresh_until: [Option<Timestamp>; 4]) -> Option<Timestamp> {
    fresh_until
        .into_iter()
        .try_fold(Timestamp::from_millis(i64::MAX), |earliest, part| {
            part.map(|part| earliest.min(part))
        })
}

/// A part from L1 alone, without any load: fresh is live (with its fresh end), stale is served
/// with reason `shed`.
fn cached<T: Clone + Serialize + DeserializeOwned + Send + Sync + 'static>(
    cache: &PartCache<T>,
    key: ItemKey,
    now: Timestamp,
) -> (PartResult<T>, Option<Timestamp>) {
    let result = match cache.peek(&key) {
        Some(envelope) if envelope.is_fresh(now) => {
            return (
                PartResult::Live {
                    value: envelope.value.clone(),
                    as_of: envelope.fetched_at,
                },
                Some(envelope.fresh_until),
            );
        }
        Some(envelope) if envelope.is_servable(now) => PartResult::Stale {
            value: envelope.value.clone(),
            as_of: envelope.fetched_at,
            reason: DegradeReason::Shed,
        },
        _ => PartResult::Failed {
            reason: DegradeReason::Shed,
        },
    };
    (result, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_trait::async_trait;
    use rebate_cache::{
        Jitter, LoadFailure, Loaded, Loader, ManualClock, PartCacheConfig, TtlPolicy,
    };
    use rebate_domain::{
        Cents, Coupon, Extras, ItemId, Platform, Product, ProductStatus, RateBps, RebateRate,
    };

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

    fn part<T: Clone + Serialize + DeserializeOwned + Send + Sync + std::fmt::Debug + 'static>(
        name: &'static str,
        loader: Fixed<T>,
        clock: &ManualClock,
        refresh_lead: Duration,
    ) -> PartCache<T> {
        PartCache::new(
            PartCacheConfig {
                name,
                part: PartKind::Product,
                max_entries: 100,
                ttl: TtlPolicy {
                    fresh: Duration::from_secs(60),
                    jitter: Jitter::Ratio(0.1),
                    stale: Duration::from_secs(600),
                    not_found: Duration::from_secs(30),
                },
                load_timeout: Duration::from_secs(5),
                refresh_lead,
                max_version_gap: 1_000_000,
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
        engine_with(coupon_delay, rate_fails, Vec::new(), &clock)
    }

    fn engine_with(
        coupon_delay: Duration,
        rate_fails: bool,
        coupons: Vec<Coupon>,
        clock: &ManualClock,
    ) -> QueryEngine {
        engine_refreshing(coupon_delay, rate_fails, coupons, clock, Duration::ZERO)
    }

    /// The engine of [`engine_with`], its parts and renderings refreshed ahead at `lead`.
    fn engine_refreshing(
        coupon_delay: Duration,
        rate_fails: bool,
        coupons: Vec<Coupon>,
        clock: &ManualClock,
        lead: Duration,
    ) -> QueryEngine {
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
                clock,
                lead,
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
                clock,
                lead,
            ),
            coupons: part(
                "coupons",
                Fixed {
                    value: Some(coupons),
                    delay: coupon_delay,
                    fail: false,
                },
                clock,
                lead,
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
                clock,
                lead,
            ),
        };
        let settings = EngineConfig {
            refresh_lead: lead,
            ..EngineConfig::new(ClassTimeouts::default().part_timeouts())
        };
        QueryEngine::with_settings(parts, settings, Arc::new(clock.clone()), None)
    }

    fn deadline() -> Instant {
        Instant::now() + Duration::from_secs(2)
    }

    async fn answer(engine: &QueryEngine) -> QuoteAnswer {
        engine
            .answer(key(), deadline(), ShedLevel::Normal)
            .await
            .unwrap()
    }

    fn rendered_json(answer: &QuoteAnswer) -> String {
        match answer {
            QuoteAnswer::Rendered(rendered) => rendered.json().get().to_owned(),
            QuoteAnswer::Assembled(quote) => panic!("expected a rendering, got {quote:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_complete_quote_is_kept_rendered_as_it_serialises() {
        let engine = engine(Duration::from_millis(5), false);
        let first = answer(&engine).await;
        let second = answer(&engine).await;
        let quote = engine.quote(key(), deadline()).await.unwrap();
        assert_eq!(
            rendered_json(&first),
            serde_json::to_string(&quote).unwrap()
        );
        assert_eq!(rendered_json(&second), rendered_json(&first));
        let stats = engine.rendered_stats().unwrap();
        assert_eq!((stats.inserts, stats.hits, stats.entries), (1, 1, 1));
        // The second answer touched no part cache.
        assert_eq!(engine.parts().product.stats().hits, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_degraded_quote_is_never_kept() {
        let engine = engine(Duration::from_millis(5), true);
        for _ in 0..2 {
            let answer = answer(&engine).await;
            assert!(answer.degraded());
            assert!(matches!(answer, QuoteAnswer::Assembled(_)));
        }
        assert_eq!(engine.rendered_stats().unwrap().entries, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_rendering_ends_when_a_part_stops_being_fresh() {
        let clock = ManualClock::starting_now();
        let engine = engine_with(Duration::from_millis(5), false, Vec::new(), &clock);
        answer(&engine).await;
        assert!(matches!(answer(&engine).await, QuoteAnswer::Rendered(_)));
        // Fresh for 60 s ± 10 %: past 66 s every part has to be loaded again.
        clock.advance(Duration::from_secs(67));
        assert!(
            matches!(answer(&engine).await, QuoteAnswer::Rendered(_)),
            "re-rendered"
        );
        assert_eq!(engine.rendered_stats().unwrap().inserts, 2);
        assert_eq!(engine.parts().product.stats().misses, 2);
    }

    /// A hot key's reads all land on its rendering, which never asks the part caches; near the
    /// rendering's end one read starts the refresh of the parts it ends with, so that when it
    /// ends the next read assembles from fresh parts and no read waits on a load.
    #[tokio::test(start_paused = true)]
    async fn a_rendering_near_its_end_refreshes_the_parts_that_end_it() {
        let clock = ManualClock::starting_now();
        let lead = Duration::from_secs(1);
        let engine = engine_refreshing(Duration::from_millis(5), false, Vec::new(), &clock, lead);
        let QuoteAnswer::Rendered(rendering) = answer(&engine).await else {
            panic!("assembled and kept");
        };
        // 50 ms before the rendering ends, each read is due with a chance of e^-0.05.
        let left = rendering.valid_until().millis_since(clock.now());
        clock.advance(Duration::from_millis(left - 50));
        for _ in 0..20 {
            assert!(matches!(answer(&engine).await, QuoteAnswer::Rendered(_)));
        }
        let refreshes = |engine: &QueryEngine| {
            engine
                .parts()
                .views()
                .iter()
                .map(|(_, part)| part.stats().refreshes)
                .sum::<u64>()
        };
        // The part that ends the rendering is refreshed (and no more than the four parts,
        // however many reads came).
        assert!(
            (1..=4).contains(&refreshes(&engine)),
            "{}",
            refreshes(&engine)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
        clock.advance(Duration::from_millis(60));
        // The rendering has ended; its parts are fresh again: assembled without a miss.
        let misses = |engine: &QueryEngine| {
            engine
                .parts()
                .views()
                .iter()
                .map(|(_, part)| part.stats().misses)
                .sum::<u64>()
        };
        assert_eq!(misses(&engine), 4, "the first answer's four misses only");
        let inserts = engine.rendered_stats().unwrap().inserts;
        assert!(matches!(answer(&engine).await, QuoteAnswer::Rendered(_)));
        assert_eq!(
            engine.rendered_stats().unwrap().inserts,
            inserts + 1,
            "kept anew"
        );
        assert_eq!(misses(&engine), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn a_rendering_ends_when_a_coupon_in_it_expires() {
        let clock = ManualClock::starting_now();
        let coupon = Coupon {
            coupon_id: "c1".to_owned(),
            discount_cents: Cents::new(2_000),
            threshold_cents: Cents::new(5_000),
            expires_at: clock.now().saturating_add_millis(10_000),
        };
        let engine = engine_with(Duration::from_millis(5), false, vec![coupon], &clock);
        let with_coupon: serde_json::Value =
            serde_json::from_str(&rendered_json(&answer(&engine).await)).unwrap();
        assert_eq!(with_coupon["rebate"]["estimated_cents"], 800);
        clock.advance(Duration::from_secs(11));
        // The parts are still fresh, but the estimate no longer counts the coupon.
        let without: serde_json::Value =
            serde_json::from_str(&rendered_json(&answer(&engine).await)).unwrap();
        assert_eq!(without["rebate"]["estimated_cents"], 1_000);
        assert_eq!(engine.parts().product.stats().misses, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_invalidation_drops_the_rendering() {
        let engine = engine(Duration::from_millis(5), false);
        answer(&engine).await;
        engine
            .invalidate(key(), PartKind::Rate, 2, Duration::from_secs(60), false)
            .await
            .unwrap();
        assert_eq!(engine.rendered_stats().unwrap().entries, 0);
        // The rate is loaded again (the fence at version 2 refuses the loader's version 1, so
        // that answer is not kept either: nothing stale is rendered).
        answer(&engine).await;
        assert_eq!(engine.parts().rate.stats().misses, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_capacity_renders_nothing() {
        let plain = engine(Duration::from_millis(5), false);
        let clock = ManualClock::starting_now();
        let mut settings = plain.settings();
        settings.rendered_capacity_bytes = 0;
        let off =
            QueryEngine::with_settings(plain.parts().clone(), settings, Arc::new(clock), None);
        assert!(off.rendered_stats().is_none());
        assert!(matches!(answer(&off).await, QuoteAnswer::Assembled(_)));
        assert!(matches!(answer(&off).await, QuoteAnswer::Assembled(_)));
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

    #[tokio::test]
    async fn the_bloom_gate_answers_unknown_ids_without_any_load() {
        let clock = ManualClock::starting_now();
        let filter = Arc::new(rebate_cache::ItemFilter::new(0.001, 1_000).unwrap());
        let known = futures::stream::iter([Ok::<_, std::convert::Infallible>(key())]);
        filter.rebuild(known).await.unwrap();
        let plain = engine(Duration::from_millis(5), false);
        let gated = QueryEngine::with_settings(
            plain.parts().clone(),
            plain.settings(),
            Arc::new(clock),
            Some(filter),
        );
        let deadline = Instant::now() + Duration::from_secs(2);
        let unknown = ItemKey::new(Platform::Jd, ItemId::from_u64(999_999_999));
        assert_eq!(
            gated.quote(unknown, deadline).await,
            Err(QueryError::NotFound { delisted: false })
        );
        assert_eq!(gated.parts().product.stats().misses, 0);
        assert!(gated.quote(key(), deadline).await.is_ok());
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

    /// The engine of [`engine_with`] with `cache_only_loads` warming permits.
    fn warming_engine(loads: usize, coupon_delay: Duration) -> QueryEngine {
        let clock = ManualClock::starting_now();
        let base = engine_with(coupon_delay, false, Vec::new(), &clock);
        let settings = EngineConfig {
            cache_only_loads: loads,
            ..base.settings()
        };
        QueryEngine::with_settings(base.parts().clone(), settings, Arc::new(clock), None)
    }

    #[tokio::test(start_paused = true)]
    async fn strict_cache_only_refuses_a_key_l1_lacks() {
        let engine = warming_engine(0, Duration::from_millis(5));
        let answer = engine.answer(key(), deadline(), ShedLevel::CacheOnly).await;
        assert!(matches!(
            answer,
            Err(QueryError::Unavailable {
                reason: DegradeReason::Shed
            })
        ));
        assert_eq!(engine.parts().product.stats().source_loads, 0);
        let loads = engine.cache_only_loads();
        assert_eq!((loads.started, loads.refused), (0, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn cache_only_warms_a_missing_key_under_a_permit_and_serves_it_from_l1_after() {
        let engine = warming_engine(1, Duration::from_millis(5));
        let first = engine
            .answer(key(), deadline(), ShedLevel::CacheOnly)
            .await
            .expect("the key loads under the free permit");
        // Loaded at level 2: extras are off, so the quote is degraded and not rendered.
        assert!(matches!(first, QuoteAnswer::Assembled(_)));
        assert_eq!(engine.parts().product.stats().source_loads, 1);
        assert_eq!(engine.parts().extras.stats().source_loads, 0);
        // The next request finds every part a level-2 load fetches: no load, no permit.
        engine
            .answer(key(), deadline(), ShedLevel::CacheOnly)
            .await
            .expect("answered from L1");
        assert_eq!(engine.parts().product.stats().source_loads, 1);
        let loads = engine.cache_only_loads();
        assert_eq!((loads.capacity, loads.started, loads.refused), (1, 1, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn cache_only_runs_at_most_its_permits_at_once() {
        let engine = warming_engine(2, Duration::from_millis(50));
        let keys: Vec<ItemKey> = (0..6)
            .map(|n| ItemKey::new(Platform::Jd, ItemId::from_u64(100_001 + n)))
            .collect();
        let single = futures::future::join_all(
            keys[..3]
                .iter()
                .map(|key| engine.answer(*key, deadline(), ShedLevel::CacheOnly)),
        );
        let batch = engine.answer_many(&keys[3..], deadline(), ShedLevel::CacheOnly);
        let (single, batch) = tokio::join!(single, batch);
        let answered = single.iter().filter(|answer| answer.is_ok()).count()
            + batch.iter().filter(|answer| answer.is_ok()).count();
        assert_eq!(answered, 2, "two permits: two keys loaded, four refused");
        let loads = engine.cache_only_loads();
        assert_eq!((loads.started, loads.refused), (2, 4));
        assert_eq!(engine.parts().product.stats().source_loads, 2);
    }
}
