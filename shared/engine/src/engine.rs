//! [`QueryEngine`]: the parallel fan-out behind one quote.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use futures::future::join_all;
use rebate_cache::refresh::uniform_draw;
use rebate_cache::{
    CacheOutcome, Clock, Envelope, ItemFilter, LoadContext, PartCache, RefreshLead, TierError,
    TierKey, refresh_due,
};
use rebate_domain::{ItemKey, PartKind, PerPart, Timestamp};
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
use crate::timeout_class::PartTimeouts;

/// Answers quotes. Cheap to clone; share one per process.
#[derive(Debug, Clone)]
pub struct QueryEngine {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    parts: EngineParts,
    /// As built. Its `timeouts`, `short_timeouts`, `retries_per_request` and `refresh_lead` are
    /// only where `budget` and `refresh_lead` started: read those, which change at runtime.
    settings: EngineConfig,
    /// What a request may spend, replaced whole at runtime; each request copies it once, when
    /// it begins ([`Request`]).
    budget: ArcSwap<RequestBudget>,
    /// Refresh ahead for kept renderings, read on every rendered hit: one relaxed atomic load.
    refresh_lead: RefreshLead,
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

/// How the engine answers under normal load and under load shedding. `timeouts`,
/// `short_timeouts`, `retries_per_request` and `refresh_lead` are starting values, which
/// [`QueryEngine::set_request_budget`] and [`QueryEngine::set_refresh_lead`] replace at runtime.
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

    /// The budget a request starts with.
    pub fn request_budget(&self) -> RequestBudget {
        RequestBudget {
            timeouts: self.timeouts,
            short_timeouts: self.short_timeouts,
            retries_per_request: self.retries_per_request,
        }
    }
}

/// What one request may spend: each part's timeout, under normal load and from shed level 2 on,
/// and the retries its parts share. The engine replaces it whole
/// ([`QueryEngine::set_request_budget`]) and a request reads it once, when it begins: every part
/// of every item in a request waits timeouts from one set, and a change reaches the next
/// request, not one in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestBudget {
    pub timeouts: PartTimeouts,
    /// The shortened timeouts of shed level 2 and above.
    pub short_timeouts: PartTimeouts,
    pub retries_per_request: u32,
}

impl RequestBudget {
    /// The timeouts parts wait at `level`: shortened from level 2 on.
    pub fn timeouts_at(&self, level: ShedLevel) -> PartTimeouts {
        if level >= ShedLevel::ShortTimeouts {
            self.short_timeouts
        } else {
            self.timeouts
        }
    }
}

/// One request as it began: the deadline and retries its parts share, its shed level, and the
/// timeouts its parts wait at that level, copied from the engine's budget once so that a change
/// meanwhile reaches none of them.
struct Request {
    load: LoadContext,
    level: ShedLevel,
    timeouts: PartTimeouts,
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
                budget: ArcSwap::from_pointee(settings.request_budget()),
                refresh_lead: RefreshLead::new(settings.refresh_lead),
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

    /// The settings as they stand now: as built, with the budget and refresh lead of the
    /// latest change.
    pub fn settings(&self) -> EngineConfig {
        let budget = self.request_budget();
        EngineConfig {
            timeouts: budget.timeouts,
            short_timeouts: budget.short_timeouts,
            retries_per_request: budget.retries_per_request,
            refresh_lead: self.inner.refresh_lead.get(),
            ..self.inner.settings
        }
    }

    /// The budget the next request starts with.
    pub fn request_budget(&self) -> RequestBudget {
        **self.inner.budget.load()
    }

    /// Replaces the budget from the next request on, in one swap: a request reads the old one
    /// or the new one, never a mix. Requests in flight keep the budget they began with, and so
    /// do the loads they started; nothing is dropped.
    pub fn set_request_budget(&self, budget: RequestBudget) {
        self.inner.budget.store(Arc::new(budget));
    }

    /// Replaces the parts' timeouts (normal and shortened) from the next request on, keeping
    /// the retries: [`QueryEngine::set_request_budget`] with only the timeouts changed.
    pub fn set_timeouts(&self, timeouts: PartTimeouts, short_timeouts: PartTimeouts) {
        self.inner.budget.rcu(|current| RequestBudget {
            timeouts,
            short_timeouts,
            ..**current
        });
    }

    /// Replaces the refresh lead of kept renderings ([`EngineConfig::refresh_lead`]) from the
    /// next read on; zero turns their refresh ahead off. Renderings already kept keep their
    /// validity: it comes from the expiry their parts were stamped with, which a change of the
    /// parts' lifetimes ([`PartCache::set_ttl`]) leaves as it is too.
    pub fn set_refresh_lead(&self, lead: Duration) {
        self.inner.refresh_lead.set(lead);
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
        let (quote, inputs) = self.assemble_one(key, deadline, level).await?;
        Ok(self.keep(rendered, key, quote, inputs, ticket))
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

    /// The kept rendering of `key` if one is valid now, for inspection (the consistency
    /// observer): no hit counted, no refresh started, nothing removed. See
    /// [`RenderedQuotes::peek`].
    pub fn peek_rendered(&self, key: &ItemKey) -> Option<Arc<RenderedQuote>> {
        let rendered = self.inner.rendered.as_ref()?;
        rendered.peek(key, self.inner.clock.now())
    }

    /// The keys with a kept rendering now (none when renderings are off): what this instance
    /// has cached whole. See [`RenderedQuotes::keys`].
    pub fn rendered_keys(&self) -> impl Iterator<Item = ItemKey> + '_ {
        self.inner
            .rendered
            .iter()
            .flat_map(|rendered| rendered.keys())
    }

    /// A read of a kept rendering near its end starts, once per rendering, the background
    /// refresh of the parts it ends with ([`rebate_cache::refresh`]): the rendering's reads
    /// never reach the part caches, whose own refresh ahead would never run for a hot key.
    /// Parts that end within the refresh lead after it are refreshed too: the next read
    /// assembles from them before their own refresh ahead could start, and a part ending a few
    /// milliseconds after the rendering would otherwise be a miss. When the rendering ends,
    /// its parts are fresh in L1 again and the next read assembles without waiting on a load.
    fn refresh_ahead(&self, key: ItemKey, rendered: &RenderedQuote, now: Timestamp) {
        let lead = self.inner.refresh_lead.get();
        if refresh_due(rendered.valid_until(), now, lead, uniform_draw) && rendered.claim_refresh()
        {
            let lead_ms = u64::try_from(lead.as_millis()).unwrap_or(u64::MAX);
            let horizon = rendered.valid_until().saturating_add_millis(lead_ms);
            for (_, part) in self.inner.parts.views().iter() {
                part.refresh_ahead(key, horizon);
            }
        }
    }

    /// Renders and keeps a complete quote whose four parts were fresh cache entries (`inputs`).
    fn keep(
        &self,
        rendered: &RenderedQuotes,
        key: ItemKey,
        quote: Quote,
        inputs: Option<FreshInputs>,
        ticket: RenderTicket,
    ) -> QuoteAnswer {
        let now = self.inner.clock.now();
        let kept = inputs.and_then(|inputs| {
            let fresh_until = inputs.until;
            // The estimate counts only coupons not yet expired: it changes at the next expiry.
            let next_expiry = quote
                .coupons
                .iter()
                .map(|coupon| coupon.expires_at)
                .filter(|expires_at| *expires_at > now)
                .min();
            let valid_until = next_expiry.map_or(fresh_until, |expiry| expiry.min(fresh_until));
            rendered.insert(key, &quote, ticket, valid_until, inputs.versions, now)
        });
        match kept {
            Some(rendered) => QuoteAnswer::Rendered(rendered),
            None => QuoteAnswer::Assembled(Box::new(quote)),
        }
    }

    /// The quote, and — when all four parts were fresh cache entries — the earliest time one of
    /// them stops being fresh and their versions.
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
    ) -> Result<(Quote, Option<FreshInputs>), QueryError> {
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
        let request = self.begin(deadline, level);
        self.quote_admitted(key, deadline, &request).await
    }

    /// Shed level 3's answer for a key: L1's, unless L1 lacks one of its parts and a warming
    /// permit is free; then the key loads at level 2 (short timeouts, no extras), which fills
    /// the caches for every later request. The permit is held until the load ends, so at most
    /// `cache_only_loads` run at once however many requests miss. A batch passes its one
    /// request (begun at level 2); a single request begins one only if it loads.
    async fn warm_or(
        &self,
        cached: Cached,
        key: ItemKey,
        deadline: Instant,
        request: Option<&Request>,
    ) -> Result<(Quote, Option<FreshInputs>), QueryError> {
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
                owned = self.begin(deadline, ShedLevel::ShortTimeouts);
                &owned
            }
        };
        let started = Instant::now();
        let answer = self.quote_admitted(key, deadline, request).await;
        record_stage("shed", "engine", "warming_load", started, None);
        answer
    }

    /// One request at `level`, before its first part is fetched: its deadline, and the retry
    /// allowance and timeouts of the budget as it stands now (one read), shared by every part of
    /// every item in it.
    fn begin(&self, deadline: Instant, level: ShedLevel) -> Request {
        let budget = self.inner.budget.load();
        Request {
            load: LoadContext::new(Some(deadline), budget.retries_per_request),
            level,
            timeouts: budget.timeouts_at(level),
        }
    }

    /// The fan-out for a key that passed the filter.
    async fn quote_admitted(
        &self,
        key: ItemKey,
        deadline: Instant,
        request: &Request,
    ) -> Result<(Quote, Option<FreshInputs>), QueryError> {
        let parts = &self.inner.parts;
        let (product, rate, coupons, extras) = tokio::join!(
            self.fetch(&parts.product, PartKind::Product, key, deadline, request),
            self.fetch(&parts.rate, PartKind::Rate, key, deadline, request),
            self.fetch(&parts.coupons, PartKind::Coupons, key, deadline, request),
            self.fetch(&parts.extras, PartKind::Extras, key, deadline, request),
        );
        let inputs = fresh_inputs([product.1, rate.1, coupons.1, extras.1]);
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
        result.map(|quote| (quote, inputs))
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

    /// A fleet-wide resync at `floor`: every L2 copy fetched before it is ignored from now on
    /// (see [`rebate_cache::PartCache::set_l2_floor`]), this instance's L1 and kept renderings
    /// go whole, and the Bloom filter is rebuilt from the store (items created meanwhile may
    /// have gone unannounced). What change capture answers a gap it cannot prove closed with.
    pub fn resync(&self, floor: Timestamp) {
        for (_, part) in self.inner.parts.views().iter() {
            part.set_l2_floor(floor);
        }
        self.forget_l1();
        if let Some(filter) = self.item_filter() {
            filter.request_rebuild();
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
                *answer = Some(
                    result.map(|(quote, inputs)| self.keep(rendered, key, quote, inputs, ticket)),
                );
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
    ) -> Vec<Result<(Quote, Option<FreshInputs>), QueryError>> {
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
            // Loads that warm the caches at level 3 run at level 2's timeouts.
            let request = &self.begin(deadline, ShedLevel::ShortTimeouts);
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
        let request = &self.begin(deadline, level);
        join_all(keys.iter().zip(admitted).map(|(key, admitted)| async move {
            if admitted {
                self.quote_admitted(*key, deadline, request).await
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
        let inputs = fresh_inputs([product.1, rate.1, coupons.1, extras.1]);
        Cached {
            answer: assemble(product.0, rate.0, coupons.0, extras.0, now)
                .map(|quote| (quote, inputs)),
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
        request: &Request,
    ) -> (PartResult<T>, Option<FreshCopy>) {
        if part == PartKind::Extras && request.level >= ShedLevel::DropExtras {
            return cached(cache, key, self.inner.clock.now());
        }
        let timeout = request.timeouts[part];
        let started = Instant::now();
        let budget = timeout.min(deadline.saturating_duration_since(started));
        // A load this call starts keeps the part's timeout at this level, the request's deadline
        // (for retries) and its retry allowance.
        let outcome = request
            .load
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
                    Some(FreshCopy::of(&envelope)),
                );
            }
            CacheOutcome::Loaded(envelope) => {
                record_stage("part", part.as_str(), "loaded", started, None);
                return (
                    PartResult::Live {
                        value: envelope.value.clone(),
                        as_of: envelope.fetched_at,
                    },
                    Some(FreshCopy::of(&envelope)),
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

/// A quote from L1 alone, and whether L1 lacked one of the parts a level-2 load would fetch.
struct Cached {
    answer: Result<(Quote, Option<FreshInputs>), QueryError>,
    incomplete: bool,
}

/// One part as a fresh cache entry: until when it stays fresh, and its version.
#[derive(Debug, Clone, Copy)]
struct FreshCopy {
    until: Timestamp,
    version: u64,
}

impl FreshCopy {
    fn of<T>(envelope: &Envelope<T>) -> Self {
        Self {
            until: envelope.fresh_until,
            version: envelope.version,
        }
    }
}

/// What a quote whose four parts were fresh cache entries was built from: the earliest end of
/// their freshness (a rendering's validity) and each part's version (kept with the rendering).
#[derive(Debug, Clone, Copy)]
struct FreshInputs {
    until: Timestamp,
    versions: PerPart<u64>,
}

/// The parts' fresh copies taken together; `None` if any part was not a fresh cache entry.
fn fresh_inputs([product, rate, coupons, extras]: [Option<FreshCopy>; 4]) -> Option<FreshInputs> {
    let (product, rate, coupons, extras) = (product?, rate?, coupons?, extras?);
    Some(FreshInputs {
        until: product
            .until
            .min(rate.until)
            .min(coupons.until)
            .min(extras.until),
        versions: PerPart {
            product: product.version,
            rate: rate.version,
            coupons: coupons.version,
            extras: extras.version,
        },
    })
}

/// A part from L1 alone, without any load: fresh is live (with its fresh copy's end and
/// version), stale is served with reason `shed`.
fn cached<T: Clone + Serialize + DeserializeOwned + Send + Sync + 'static>(
    cache: &PartCache<T>,
    key: ItemKey,
    now: Timestamp,
) -> (PartResult<T>, Option<FreshCopy>) {
    let result = match cache.peek(&key) {
        Some(envelope) if envelope.is_fresh(now) => {
            return (
                PartResult::Live {
                    value: envelope.value.clone(),
                    as_of: envelope.fetched_at,
                },
                Some(FreshCopy::of(&envelope)),
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
mod tests;
