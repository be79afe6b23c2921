//! [`PartCache`]: L1 (moka) read-through for one part, with single-flight loads, over an
//! optional shared L2 tier with per-key rebuild leases.
//!
//! # A read, file by file
//!
//! 1. **L1** (`l1.rs`). [`PartCache::get`] (in this file) answers from L1 while the entry is
//!    fresh on the injected clock. Every write to L1 is version-fenced: an older version never
//!    replaces a newer one, be it data or a fence put there by [`PartCache::invalidate_to`].
//! 2. **Single flight** (`l1.rs`). On a miss the caller joins the key's load in flight or starts
//!    it. The load runs in its own task (`start_load` and `run_load`, here) under the caller's
//!    load context, timeline and span, and leaves the in-flight map only after caching its
//!    result. The caller waits at most its budget; if the load fails or the budget runs out, it
//!    serves a stale copy if L1 still has one.
//! 3. **L2 and the lease** (`lease.rs`), when the cache has a shared tier ([`L2Config`]): the
//!    load reads L2, else takes the key's rebuild lease or waits for the instance that holds
//!    it, and writes the rebuilt value back in the background. Fences go to L2 from here too.
//! 4. **The loader** (`inner.rs`): the [`Loader`], cut off at the part's load timeout.
//!
//! Beside them: `load.rs`, the load vocabulary ([`Loaded`], [`LoadFailure`], [`CacheOutcome`]);
//! `settings.rs` ([`PartCacheConfig`], [`L2Config`], and the lifetimes as they stand now, which
//! [`PartCache::set_ttl`] replaces at runtime); `stats.rs` ([`CacheStats`]);
//! `inner.rs`, the state a cache shares with its load tasks, which `l1.rs` and `lease.rs`
//! extend. Imports only point down this list: `mod.rs`, `lease.rs`, `l1.rs`, `inner.rs`, then
//! `load.rs`, `settings.rs` and `stats.rs`, which import none of the others.

mod inner;
mod l1;
mod lease;
mod load;
mod settings;
mod stats;
mod view;

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use futures::FutureExt;
use rebate_domain::{ItemKey, PartKind, Timestamp};
use rebate_telemetry::Timeline;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::Instrument;

use self::inner::Inner;
use self::load::{LoadResult, SharedLoad};
use self::settings::TtlPolicies;
use self::stats::bump;
use crate::clock::Clock;
use crate::context::LoadContext;
use crate::envelope::{Envelope, PolicyError, TtlPolicy};
use crate::refresh::{RefreshLead, refresh_due, uniform_draw};
use crate::shared::{SharedTier, TierEntry, TierError};

pub use self::load::{CacheOutcome, FailureKind, LoadFailure, Loaded, Loader};
pub use self::settings::{L2Config, PartCacheConfig};
pub use self::stats::{CacheStats, CacheStatsSnapshot};
pub use self::view::{L2Entry, PartView};

/// One part's cache: a bounded moka L1, the loads in flight, and optionally the shared L2.
pub struct PartCache<T> {
    inner: Arc<Inner<T>>,
}

impl<T> Clone for PartCache<T> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<T> fmt::Debug for PartCache<T> {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("PartCache")
            .field("name", &self.inner.settings.name)
            .field("entries", &self.inner.entries.entry_count())
            .field("l2", &self.inner.l2.is_some())
            .finish_non_exhaustive()
    }
}

impl<T> PartCache<T>
where
    T: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    /// An L1-only cache: misses go straight to the source (the embedded profile).
    pub fn new(
        settings: PartCacheConfig,
        loader: Arc<dyn Loader<T>>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self::build(settings, None, loader, clock)
    }

    /// L1 over a shared L2 tier with cross-instance rebuild leases (the production profile).
    pub fn with_shared_tier(
        settings: PartCacheConfig,
        l2: L2Config,
        loader: Arc<dyn Loader<T>>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self::build(settings, Some(l2), loader, clock)
    }

    fn build(
        settings: PartCacheConfig,
        l2: Option<L2Config>,
        loader: Arc<dyn Loader<T>>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let entries = l1::new_entries(&settings, &clock);
        let ttl_policies = TtlPolicies {
            l1: settings.ttl,
            l2: l2.as_ref().map(|l2| l2.ttl),
        };
        Self {
            inner: Arc::new(Inner {
                refresh_lead: RefreshLead::new(settings.refresh_lead),
                ttl_policies: ArcSwap::from_pointee(ttl_policies),
                settings,
                l2,
                entries,
                in_flight: Mutex::new(HashMap::new()),
                next_load_id: AtomicU64::new(0),
                loader,
                clock,
                stats: CacheStats::default(),
                recent_loads: Default::default(),
                recent_l2_trips: Default::default(),
                recent_winner_waits: Default::default(),
                l2_floor_ms: AtomicU64::new(0),
                generation: AtomicU64::new(0),
            }),
        }
    }

    pub fn name(&self) -> &'static str {
        self.inner.settings.name
    }

    pub fn part(&self) -> PartKind {
        self.inner.settings.part
    }

    /// The shared tier, when this cache has one.
    pub fn shared_tier(&self) -> Option<&Arc<dyn SharedTier>> {
        self.inner.l2.as_ref().map(|l2| &l2.tier)
    }

    /// Replaces the lifetimes entries are stamped with from now on: L1's, and L2's when this
    /// cache has a shared tier (`None` keeps L2's as they are; a cache without L2 checks `l2`
    /// and has no use for it). Both are swapped in together, and a load reads them once, when
    /// its value arrives: no entry is stamped with half of a change. Entries already cached,
    /// in L1 or in L2, keep the expiry they were stamped with; nothing in flight is dropped.
    ///
    /// # Errors
    /// The first policy that fails [`TtlPolicy::validate`]; then nothing changes.
    pub fn set_ttl(&self, l1: TtlPolicy, l2: Option<TtlPolicy>) -> Result<(), PolicyError> {
        l1.validate()?;
        if let Some(l2) = &l2 {
            l2.validate()?;
        }
        let has_l2 = self.inner.l2.is_some();
        self.inner.ttl_policies.rcu(|current| TtlPolicies {
            l1,
            l2: if has_l2 { l2.or(current.l2) } else { None },
        });
        Ok(())
    }

    /// The lifetimes entries are stamped with now: L1's, and L2's when this cache has one.
    pub fn ttl(&self) -> (TtlPolicy, Option<TtlPolicy>) {
        let policies = self.inner.ttl_policies.load();
        (policies.l1, policies.l2)
    }

    /// Replaces the refresh lead ([`PartCacheConfig::refresh_lead`]) from the next read on;
    /// zero turns refresh ahead off. A refresh already started runs to its end.
    pub fn set_refresh_lead(&self, lead: Duration) {
        self.inner.refresh_lead.set(lead);
    }

    pub fn refresh_lead(&self) -> Duration {
        self.inner.refresh_lead.get()
    }

    /// Reads through the cache, waiting at most `budget` for a load. A fresh entry near its
    /// expiry may start its refresh in the background ([`crate::refresh`]).
    pub async fn get(&self, key: ItemKey, budget: Duration) -> CacheOutcome<T> {
        let inner = &self.inner;
        if let Some(envelope) = inner.entries.get(&key) {
            let now = inner.clock.now();
            if envelope.is_fresh(now) {
                bump(&inner.stats.hits);
                if refresh_due(
                    envelope.fresh_until,
                    now,
                    inner.refresh_lead.get(),
                    uniform_draw,
                ) {
                    self.start_refresh(key, envelope.fresh_until);
                }
                return CacheOutcome::Hit(envelope);
            }
        }
        bump(&inner.stats.misses);

        let start = |load_id| self.start_load(key, load_id, None);
        let load = match inner.join_or_start(key, start) {
            Ok(fresh) => return CacheOutcome::Loaded(fresh),
            Err(load) => load,
        };
        let failure = match tokio::time::timeout(budget, load).await {
            Ok(Ok(envelope)) => return CacheOutcome::Loaded(envelope),
            Ok(Err(failure)) => failure,
            Err(_elapsed) => LoadFailure::timeout(format!(
                "{} not loaded within the {} ms budget",
                inner.settings.name,
                budget.as_millis()
            )),
        };
        // Read L1 again: a failed load may have left a stale copy it found in L2, and a lease
        // winner's value may have landed since the load answered.
        let now = inner.clock.now();
        match inner.entries.get(&key) {
            Some(envelope) if envelope.is_fresh(now) => CacheOutcome::Loaded(envelope),
            Some(envelope) if envelope.is_servable(now) => {
                bump(&inner.stats.stale_served);
                CacheOutcome::Stale(envelope, failure)
            }
            _ => CacheOutcome::Failed(failure),
        }
    }

    /// Calls the source directly, bypassing every tier and the single-flight map: the naive
    /// baseline the load harness compares against ("no cache, parts one after another").
    pub async fn load_uncached(&self, key: ItemKey) -> Result<Loaded<T>, LoadFailure> {
        self.inner.load_from_source(key).await
    }

    /// Starts the background refresh of `key` when L1's entry is fresh but stops being fresh by
    /// `horizon` (the engine asks when a kept rendering that this entry limits nears its end).
    /// Returns whether a refresh started.
    pub fn refresh_ahead(&self, key: ItemKey, horizon: Timestamp) -> bool {
        let inner = &self.inner;
        if inner.refresh_lead.get().is_zero() {
            return false;
        }
        match inner.entries.get(&key) {
            Some(envelope)
                if envelope.is_fresh(inner.clock.now()) && envelope.fresh_until <= horizon =>
            {
                self.start_refresh(key, envelope.fresh_until)
            }
            _ => false,
        }
    }

    /// Reloads `key`, whose L1 entry is fresh until `fresh_until`, in the background unless a
    /// load of it is in flight or its source would refuse now. The refresh is nobody's request:
    /// it runs without a caller's deadline, retries or timeline, and takes an L2 copy only if
    /// that copy stays fresh longer than L1's (else the source, under the key's lease).
    fn start_refresh(&self, key: ItemKey, fresh_until: Timestamp) -> bool {
        let inner = &self.inner;
        if !inner.loader.ready_for(key) {
            return false;
        }
        let started = inner.start_if_idle(key, |load_id| {
            self.start_load(key, load_id, Some(fresh_until))
        });
        if started {
            bump(&inner.stats.refreshes);
        }
        started
    }

    /// True when L1 has no fresh entry for `key`: a batch prefetches those from L2.
    pub fn needs_load(&self, key: &ItemKey) -> bool {
        self.inner
            .entries
            .get(key)
            .is_none_or(|envelope| !envelope.is_fresh(self.inner.clock.now()))
    }

    /// Takes an entry read from L2 by someone else (a batch prefetch) into L1 if it is still
    /// servable. Returns whether it was fresh.
    pub fn absorb(&self, key: ItemKey, entry: &TierEntry) -> bool {
        let inner = &self.inner;
        let Ok(envelope) = Envelope::<T>::decode(&entry.bytes) else {
            return false;
        };
        if inner.below_l2_floor(envelope.fetched_at) {
            return false;
        }
        let now = inner.clock.now();
        if !envelope.is_servable(now) {
            return false;
        }
        let fresh = envelope.is_fresh(now);
        if fresh {
            bump(&inner.stats.l2_hits);
        }
        inner.adopt_from_l2(key, envelope);
        fresh
    }

    /// The cached entry, fresh or not, without loading. For inspection and cache-only serving.
    pub fn peek(&self, key: &ItemKey) -> Option<Arc<Envelope<T>>> {
        self.inner.entries.get(key)
    }

    /// Up to `wanted` keys L1 holds copies (not fences) of, a random sample (a reservoir) of
    /// the first `visit` entries of its map: bounded work however large L1 is. For the drift
    /// sampler of the consistency observer.
    pub fn sample_keys(&self, wanted: usize, visit: usize) -> Vec<ItemKey> {
        use rand::Rng as _;
        let mut rng = rand::rng();
        let mut reservoir = Vec::with_capacity(wanted);
        let copies = self
            .inner
            .entries
            .iter()
            .filter(|(_, envelope)| !envelope.tombstone)
            .take(visit);
        for (seen, (key, _)) in copies.enumerate() {
            if reservoir.len() < wanted {
                reservoir.push(*key);
            } else if let Some(kept) = reservoir.get_mut(rng.random_range(0..=seen)) {
                *kept = *key;
            }
        }
        reservoir
    }

    /// Drops the L1 copy of one key.
    pub fn invalidate(&self, key: &ItemKey) {
        self.inner.entries.invalidate(key);
    }

    pub fn stats(&self) -> CacheStatsSnapshot {
        let inner = &self.inner;
        inner.stats.snapshot(inner.entries.entry_count())
    }

    /// Drops everything L1 holds and detaches every load in flight, as after invalidation
    /// events this instance may have missed: the next read of any key goes to L2 or the source.
    /// Fences go too; L2 keeps its own (server-side), which is what refuses old rebuilds there.
    pub fn forget_all(&self) {
        self.inner.clear();
        bump(&self.inner.stats.invalidations);
    }

    /// Ignores, from now on, every L2 copy fetched before `floor`: they read as absent (a miss
    /// that reloads from the source and overwrites them). A fleet-wide resync sets it when
    /// changes may have gone unannounced, together with [`Self::forget_all`]. Never lowered: an
    /// older floor changes nothing.
    pub fn set_l2_floor(&self, floor: Timestamp) {
        let floor = u64::try_from(floor.as_millis()).unwrap_or(0);
        self.inner.l2_floor_ms.fetch_max(floor, Ordering::Relaxed);
    }

    /// The floor set by [`Self::set_l2_floor`], `None` before any.
    pub fn l2_floor(&self) -> Option<Timestamp> {
        match self.inner.l2_floor_ms.load(Ordering::Relaxed) {
            0 => None,
            floor => Some(Timestamp::from_millis(
                i64::try_from(floor).unwrap_or(i64::MAX),
            )),
        }
    }

    /// Fences `key` at `version` after a change event. L1 keeps a copy that already holds
    /// `version` or newer and otherwise holds the fence; a load in flight is detached (it may
    /// have read the row before the change, so no new caller may join it, and its result cannot
    /// pass the fence). With `through_l2`, the same fence is written to the shared tier, where a
    /// server-side version check protects it from racing rebuilds of other instances.
    ///
    /// `fence_for` is how long the fence stands: long enough to outlive any rebuild that started
    /// before the change.
    pub async fn invalidate_to(
        &self,
        key: ItemKey,
        version: u64,
        fence_for: Duration,
        through_l2: bool,
    ) -> Result<(), TierError> {
        let inner = &self.inner;
        let now = inner.clock.now();
        let until =
            now.saturating_add_millis(u64::try_from(fence_for.as_millis()).unwrap_or(u64::MAX));
        let fence = Envelope::<T>::tombstone(version, now, until);
        inner.hold_fence(key, &fence);
        bump(&inner.stats.invalidations);
        let Some(l2) = inner.l2.as_ref().filter(|_| through_l2) else {
            return Ok(());
        };
        inner.fence_l2(l2, key, &fence, fence_for).await
    }

    /// The load for `key`, running in its own task: it outlives its caller, but keeps the
    /// caller's deadline, retry allowance and timeline, and its spans are children of the
    /// caller's. A refresh (`refreshing` the entry fresh until then) keeps none of these: its
    /// attempts may take the part's load timeout, it has no deadline and spends no retries.
    fn start_load(
        &self,
        key: ItemKey,
        load_id: u64,
        refreshing: Option<Timestamp>,
    ) -> SharedLoad<T> {
        let inner = &self.inner;
        let span = match refreshing {
            None => tracing::debug_span!("load", part = inner.settings.name, %key),
            Some(_) => {
                tracing::debug_span!(parent: None, "refresh", part = inner.settings.name, %key)
            }
        };
        let run = Inner::run_load(Arc::clone(inner), key, load_id, refreshing).instrument(span);
        let (context, timeline) = match refreshing {
            None => (LoadContext::current(), Timeline::current()),
            // Nobody waits for a refresh: it has no deadline (a batch of refreshes may wait
            // half the part's load timeout for a quota token, however close the entry's end:
            // a refresh sent at once without a token is refused, and the entry expires anyway),
            // and it spends no retries.
            Some(_) => {
                let context = LoadContext::new(None, 0).for_part(inner.settings.load_timeout);
                (Some(context), None)
            }
        };
        let task = tokio::spawn(async move {
            let run = async move {
                match timeline {
                    Some(timeline) => timeline.scope(run).await,
                    None => run.await,
                }
            };
            match context {
                Some(context) => context.scope(run).await,
                None => run.await,
            }
        });
        async move {
            match task.await {
                Ok(result) => result,
                Err(join_error) => {
                    Err(LoadFailure::error(format!("load task ended: {join_error}")))
                }
            }
        }
        .boxed()
        .shared()
    }
}

impl<T> Inner<T>
where
    T: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    /// One load: through L2 when the cache has it, else from the source into L1. It leaves the
    /// in-flight map only once its result is cached, so that no caller in between misses both.
    /// A refresh of the entry fresh until `refreshing` takes only an L2 copy fresh for longer.
    async fn run_load(
        self: Arc<Self>,
        key: ItemKey,
        load_id: u64,
        refreshing: Option<Timestamp>,
    ) -> LoadResult<T> {
        let generation = self.generation.load(Ordering::Acquire);
        let (result, following) = match &self.l2 {
            Some(l2) => {
                let load = self.load_through_l2(l2, key, refreshing, load_id).await;
                (load.result, load.following)
            }
            None => match self.load_from_source(key).await {
                Ok(loaded) => {
                    let l1_policy = self.ttl_policies.load().l1;
                    let envelope = self.stamp(&l1_policy, loaded);
                    (Ok(self.insert_fenced(key, envelope)), false)
                }
                Err(failure) => (Err(failure), false),
            },
        };
        match &result {
            Ok(envelope) if envelope.is_not_found() => bump(&self.stats.not_found_cached),
            Ok(_) => {}
            Err(failure) => {
                bump(&self.stats.load_failures);
                tracing::debug!(part = self.settings.name, %key, %failure, "load failed");
            }
        }
        if let Ok(envelope) = &result
            && self.generation.load(Ordering::Acquire) != generation
        {
            // L1 was forgotten while this load ran: what it read may be what was forgotten.
            self.entries
                .entry(key)
                .and_compute_with(|existing| match existing {
                    Some(current) if Arc::ptr_eq(current.value(), envelope) => {
                        moka::ops::compute::Op::Remove
                    }
                    _ => moka::ops::compute::Op::Nop,
                });
        }
        if !following {
            self.finish_load(key, load_id);
        }
        result
    }
}

#[cfg(test)]
mod tests;
