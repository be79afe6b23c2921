//! [`PartCache`]: L1 (moka) read-through for one part, with single-flight loads, over an
//! optional shared L2 tier with per-key rebuild leases.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use moka::ops::compute::{CompResult, Op};
use moka::sync::Cache;
use rebate_domain::{ItemKey, PartKind};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::clock::Clock;
use crate::context::LoadContext;
use crate::envelope::{Envelope, TtlPolicy};
use crate::shared::{FenceOutcome, SharedTier, TierEntry, TierError, TierKey};
use rebate_telemetry::{Timeline, record_stage};
use tracing::Instrument;

/// What a source returns: the value (or `None` for "does not exist") and its data version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loaded<T> {
    pub value: Option<T>,
    pub version: u64,
}

/// Why a load produced no value. Cloneable, because every caller sharing a load receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadFailure {
    pub kind: FailureKind,
    /// For logs only; never shown to clients.
    pub detail: Arc<str>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// The source did not answer within the time allowed.
    Timeout,
    /// The source answered with an error or could not be reached.
    Error,
    /// The source's circuit breaker is open: it was not called.
    BreakerOpen,
    /// Every slot for concurrent calls to the source is taken: it was not called.
    BulkheadFull,
    /// The outbound rate quota for the source is spent: it was not called.
    Quota,
    /// Load shedding: the service is over capacity and answers from cache only.
    Shed,
}

impl LoadFailure {
    pub fn timeout(detail: impl Into<Arc<str>>) -> Self {
        Self {
            kind: FailureKind::Timeout,
            detail: detail.into(),
        }
    }

    pub fn error(detail: impl Into<Arc<str>>) -> Self {
        Self {
            kind: FailureKind::Error,
            detail: detail.into(),
        }
    }

    pub fn new(kind: FailureKind, detail: impl Into<Arc<str>>) -> Self {
        Self {
            kind,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for LoadFailure {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{:?}: {}", self.kind, self.detail)
    }
}

/// Fetches one part of one item from its source (store or upstream API).
#[async_trait]
pub trait Loader<T>: Send + Sync + fmt::Debug + 'static {
    async fn load(&self, key: ItemKey) -> Result<Loaded<T>, LoadFailure>;
}

/// What [`PartCache::get`] found.
#[derive(Debug, Clone)]
pub enum CacheOutcome<T> {
    /// A fresh L1 entry answered without touching the source.
    Hit(Arc<Envelope<T>>),
    /// L2 or the source answered within the budget (this caller's load or one it joined).
    Loaded(Arc<Envelope<T>>),
    /// The source failed or was too slow; this copy is past fresh but inside its stale window.
    Stale(Arc<Envelope<T>>, LoadFailure),
    /// The source failed and nothing servable is cached.
    Failed(LoadFailure),
}

/// Construction settings of one part's cache.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PartCacheSettings {
    pub name: &'static str,
    pub part: PartKind,
    pub max_entries: u64,
    /// L1 lifetimes. With an L2 tier, an L1 copy is never fresh longer than the L2 entry.
    pub ttl: TtlPolicy,
    /// Upper bound for one load, whatever the callers' budgets: loads run on after their callers
    /// give up, and must not pile up behind a hung source.
    pub load_timeout: Duration,
}

/// The shared tier under one part's L1, and how this part uses it.
#[derive(Debug, Clone)]
pub struct L2Settings {
    pub tier: Arc<dyn SharedTier>,
    /// L2 lifetimes (15 min + 0–300 s by default): longer than L1's, so instances refill from L2.
    pub ttl: TtlPolicy,
    /// How long a rebuild lease lives: longer than a load may take, short enough that a crashed
    /// winner does not block the key for long.
    pub lease_ttl: Duration,
    /// How long a loser waits for the winner's value before serving stale or loading itself.
    pub lease_wait: Duration,
    /// How often a loser looks for the winner's value.
    pub lease_poll: Duration,
}

/// Counters of one part cache. Relaxed atomics: they are statistics, not synchronisation.
#[derive(Debug, Default)]
pub struct CacheStats {
    hits: AtomicU64,
    misses: AtomicU64,
    loads_started: AtomicU64,
    loads_joined: AtomicU64,
    load_failures: AtomicU64,
    stale_served: AtomicU64,
    not_found_cached: AtomicU64,
    l2_hits: AtomicU64,
    l2_misses: AtomicU64,
    l2_errors: AtomicU64,
    source_loads: AtomicU64,
    leases_won: AtomicU64,
    leases_lost: AtomicU64,
    lease_waits_served: AtomicU64,
    fenced_writes_refused: AtomicU64,
    invalidations: AtomicU64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CacheStatsSnapshot {
    pub hits: u64,
    pub misses: u64,
    pub loads_started: u64,
    pub loads_joined: u64,
    pub load_failures: u64,
    pub stale_served: u64,
    pub not_found_cached: u64,
    pub l2_hits: u64,
    pub l2_misses: u64,
    pub l2_errors: u64,
    pub source_loads: u64,
    pub leases_won: u64,
    pub leases_lost: u64,
    pub lease_waits_served: u64,
    pub fenced_writes_refused: u64,
    pub invalidations: u64,
    pub entries: u64,
}

type LoadResult<T> = Result<Arc<Envelope<T>>, LoadFailure>;
type SharedLoad<T> = Shared<BoxFuture<'static, LoadResult<T>>>;

/// One part's cache: a bounded moka L1, the loads in flight, and optionally the shared L2.
pub struct PartCache<T> {
    inner: Arc<Inner<T>>,
}

struct Inner<T> {
    settings: PartCacheSettings,
    l2: Option<L2Settings>,
    entries: Cache<ItemKey, Arc<Envelope<T>>>,
    /// Loads in flight, one per key, each with its id so that a load only ever removes its own
    /// entry. Only touched on a miss or an invalidation, never held across `.await`.
    in_flight: Mutex<HashMap<ItemKey, (u64, SharedLoad<T>)>>,
    next_load_id: AtomicU64,
    loader: Arc<dyn Loader<T>>,
    clock: Arc<dyn Clock>,
    stats: CacheStats,
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

/// Tells moka to drop an entry once its stale window ends, measured on the injected clock at
/// insert time. Freshness itself is always re-checked against the clock on read.
struct UntilStale {
    clock: Arc<dyn Clock>,
}

impl<T> moka::Expiry<ItemKey, Arc<Envelope<T>>> for UntilStale {
    fn expire_after_create(
        &self,
        _key: &ItemKey,
        envelope: &Arc<Envelope<T>>,
        _created_at: std::time::Instant,
    ) -> Option<Duration> {
        let remaining = envelope.stale_until.millis_since(self.clock.now());
        Some(Duration::from_millis(remaining))
    }

    fn expire_after_update(
        &self,
        key: &ItemKey,
        envelope: &Arc<Envelope<T>>,
        updated_at: std::time::Instant,
        _current: Option<Duration>,
    ) -> Option<Duration> {
        self.expire_after_create(key, envelope, updated_at)
    }
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl<T> PartCache<T>
where
    T: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    /// An L1-only cache: misses go straight to the source (the embedded profile).
    pub fn new(
        settings: PartCacheSettings,
        loader: Arc<dyn Loader<T>>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self::build(settings, None, loader, clock)
    }

    /// L1 over a shared L2 tier with cross-instance rebuild leases (the production profile).
    pub fn with_shared_tier(
        settings: PartCacheSettings,
        l2: L2Settings,
        loader: Arc<dyn Loader<T>>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self::build(settings, Some(l2), loader, clock)
    }

    fn build(
        settings: PartCacheSettings,
        l2: Option<L2Settings>,
        loader: Arc<dyn Loader<T>>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let entries = Cache::builder()
            .name(settings.name)
            .max_capacity(settings.max_entries)
            .expire_after(UntilStale {
                clock: Arc::clone(&clock),
            })
            .build();
        Self {
            inner: Arc::new(Inner {
                settings,
                l2,
                entries,
                in_flight: Mutex::new(HashMap::new()),
                next_load_id: AtomicU64::new(0),
                loader,
                clock,
                stats: CacheStats::default(),
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

    /// Reads through the cache, waiting at most `budget` for a load.
    pub async fn get(&self, key: ItemKey, budget: Duration) -> CacheOutcome<T> {
        let inner = &self.inner;
        if let Some(envelope) = inner.entries.get(&key)
            && envelope.is_fresh(inner.clock.now())
        {
            bump(&inner.stats.hits);
            return CacheOutcome::Hit(envelope);
        }
        bump(&inner.stats.misses);

        let load = match self.join_or_start_load(key) {
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
        // Read L1 again: a failed load may have left a stale copy it found in L2.
        match inner.entries.get(&key) {
            Some(envelope) if envelope.is_servable(inner.clock.now()) => {
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

    /// Drops the L1 copy of one key.
    pub fn invalidate(&self, key: &ItemKey) {
        self.inner.entries.invalidate(key);
    }

    pub fn stats(&self) -> CacheStatsSnapshot {
        let stats = &self.inner.stats;
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        CacheStatsSnapshot {
            hits: read(&stats.hits),
            misses: read(&stats.misses),
            loads_started: read(&stats.loads_started),
            loads_joined: read(&stats.loads_joined),
            load_failures: read(&stats.load_failures),
            stale_served: read(&stats.stale_served),
            not_found_cached: read(&stats.not_found_cached),
            l2_hits: read(&stats.l2_hits),
            l2_misses: read(&stats.l2_misses),
            l2_errors: read(&stats.l2_errors),
            source_loads: read(&stats.source_loads),
            leases_won: read(&stats.leases_won),
            leases_lost: read(&stats.leases_lost),
            lease_waits_served: read(&stats.lease_waits_served),
            fenced_writes_refused: read(&stats.fenced_writes_refused),
            invalidations: read(&stats.invalidations),
            entries: self.inner.entries.entry_count(),
        }
    }

    /// Drops everything L1 holds and detaches every load in flight, as after invalidation
    /// events this instance may have missed: the next read of any key goes to L2 or the source.
    /// Fences go too; L2 keeps its own (server-side), which is what refuses old rebuilds there.
    pub fn forget_all(&self) {
        let inner = &self.inner;
        inner
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        inner.entries.invalidate_all();
        bump(&inner.stats.invalidations);
    }

    /// Returns a fresh envelope when another caller's load completed meanwhile, else the one load
    /// in flight for `key` (joined, or started here).
    fn join_or_start_load(&self, key: ItemKey) -> Result<Arc<Envelope<T>>, SharedLoad<T>> {
        let inner = &self.inner;
        let mut in_flight = inner
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some((_, load)) = in_flight.get(&key) {
            bump(&inner.stats.loads_joined);
            return Err(load.clone());
        }
        // A load finishes by caching its value and *then* leaving `in_flight`, so a caller that
        // missed before the value landed and locks after the load left sees the value here.
        if let Some(envelope) = inner.entries.get(&key)
            && envelope.is_fresh(inner.clock.now())
        {
            return Ok(envelope);
        }
        bump(&inner.stats.loads_started);
        let load_id = inner.next_load_id.fetch_add(1, Ordering::Relaxed);
        // The load outlives its caller, but keeps the caller's deadline, retry allowance and
        // timeline, and its spans are children of the caller's.
        let span = tracing::debug_span!("load", part = inner.settings.name, %key);
        let run = Inner::run_load(Arc::clone(inner), key, load_id).instrument(span);
        let context = LoadContext::current();
        let timeline = Timeline::current();
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
        let load = async move {
            match task.await {
                Ok(result) => result,
                Err(join_error) => {
                    Err(LoadFailure::error(format!("load task ended: {join_error}")))
                }
            }
        }
        .boxed()
        .shared();
        in_flight.insert(key, (load_id, load.clone()));
        Err(load)
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
        {
            let mut in_flight = inner
                .in_flight
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            in_flight.remove(&key);
            let offered = Arc::new(fence.clone_fence());
            inner
                .entries
                .entry(key)
                .and_compute_with(|existing| match existing {
                    Some(current) if current.value().version >= version => Op::Nop,
                    _ => Op::Put(offered),
                });
        }
        bump(&inner.stats.invalidations);
        let Some(l2) = inner.l2.as_ref().filter(|_| through_l2) else {
            return Ok(());
        };
        let bytes = fence
            .encode()
            .map_err(|error| TierError::Backend(format!("cannot encode a fence: {error}")))?;
        let tier_key = TierKey {
            item: key,
            part: inner.settings.part,
        };
        let entry = TierEntry { version, bytes };
        match l2.tier.put_fence(tier_key, &entry, fence_for).await? {
            FenceOutcome::Written | FenceOutcome::Stale { .. } => Ok(()),
        }
    }
}

impl<T> Inner<T>
where
    T: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    async fn run_load(self: Arc<Self>, key: ItemKey, load_id: u64) -> LoadResult<T> {
        let result = match &self.l2 {
            Some(l2) => self.load_through_l2(l2, key).await,
            None => match self.load_from_source(key).await {
                Ok(loaded) => {
                    let envelope = self.stamp(&self.settings.ttl, loaded);
                    Ok(self.insert_fenced(key, envelope))
                }
                Err(failure) => Err(failure),
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
        let mut in_flight = self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if in_flight.get(&key).is_some_and(|(id, _)| *id == load_id) {
            in_flight.remove(&key);
        }
        drop(in_flight);
        result
    }

    /// L2, then (holding the key's lease, or after waiting for its holder) the source.
    async fn load_through_l2(self: &Arc<Self>, l2: &L2Settings, key: ItemKey) -> LoadResult<T> {
        let tier_key = TierKey {
            item: key,
            part: self.settings.part,
        };
        let mut stale = None;
        // A copy older than this instance's fence is what the event replaced: L2 may still
        // hold it while the shared handler has not fenced L2 yet (or could not), and serving it
        // would undo the event here. It counts as absent.
        let fence = self.fence_version(key);
        let read = self
            .read_l2(l2, tier_key)
            .await
            .map(|found| found.filter(|envelope| envelope.version >= fence));
        let tier_up = match read {
            Ok(Some(envelope)) if envelope.is_fresh(self.clock.now()) => {
                bump(&self.stats.l2_hits);
                return Ok(self.adopt_from_l2(key, envelope));
            }
            Ok(found) => {
                bump(&self.stats.l2_misses);
                stale = found.filter(|envelope| envelope.is_servable(self.clock.now()));
                true
            }
            Err(()) => false,
        };

        let token: u64 = rand::random();
        let mut leased = false;
        if tier_up {
            let started = tokio::time::Instant::now();
            match l2.tier.try_lease(tier_key, token, l2.lease_ttl).await {
                Ok(true) => {
                    bump(&self.stats.leases_won);
                    record_stage("lease", self.settings.name, "won", started, None);
                    leased = true;
                }
                Ok(false) => {
                    bump(&self.stats.leases_lost);
                    let waited = self.wait_for_winner(l2, tier_key, fence).await;
                    let outcome = if waited.is_some() {
                        "lost; the winner's value arrived"
                    } else {
                        "lost; gave up waiting"
                    };
                    record_stage("lease", self.settings.name, outcome, started, None);
                    if let Some(envelope) = waited {
                        bump(&self.stats.lease_waits_served);
                        return Ok(self.adopt_from_l2(key, envelope));
                    }
                    if let Some(envelope) = stale {
                        self.adopt_from_l2(key, envelope);
                        return Err(LoadFailure::timeout(
                            "another instance is rebuilding this key; serving stale meanwhile",
                        ));
                    }
                }
                Err(error) => {
                    bump(&self.stats.l2_errors);
                    tracing::debug!(part = self.settings.name, %key, %error, "lease failed");
                }
            }
        }

        match self.load_from_source(key).await {
            Ok(loaded) => {
                let envelope = self.stamp(&l2.ttl, loaded);
                if tier_up {
                    self.write_l2_in_background(l2, tier_key, &envelope, leased.then_some(token));
                }
                Ok(self.adopt_from_l2(key, envelope))
            }
            Err(failure) => {
                if leased {
                    let tier = Arc::clone(&l2.tier);
                    tokio::spawn(async move { tier.release_lease(tier_key, token).await });
                }
                if let Some(envelope) = stale {
                    self.adopt_from_l2(key, envelope);
                }
                Err(failure)
            }
        }
    }

    /// The decoded L2 entry, `Ok(None)` when absent or undecodable, `Err` when the tier failed.
    async fn read_l2(&self, l2: &L2Settings, tier_key: TierKey) -> Result<Option<Envelope<T>>, ()> {
        let started = tokio::time::Instant::now();
        let read = self.read_l2_untimed(l2, tier_key).await;
        let outcome = match &read {
            Ok(Some(envelope)) if envelope.is_fresh(self.clock.now()) => "hit",
            Ok(Some(_)) => "stale",
            Ok(None) => "miss",
            Err(()) => "error",
        };
        record_stage("l2", self.settings.name, outcome, started, None);
        read
    }

    async fn read_l2_untimed(
        &self,
        l2: &L2Settings,
        tier_key: TierKey,
    ) -> Result<Option<Envelope<T>>, ()> {
        match l2.tier.get_many(&[tier_key]).await {
            Ok(mut entries) => Ok(entries
                .pop()
                .flatten()
                .and_then(|entry| match Envelope::decode(&entry.bytes) {
                    Ok(envelope) => Some(envelope),
                    Err(error) => {
                        tracing::warn!(part = self.settings.name, key = %tier_key.item, %error, "undecodable L2 entry ignored");
                        None
                    }
                })),
            Err(error) => {
                bump(&self.stats.l2_errors);
                tracing::debug!(part = self.settings.name, key = %tier_key.item, %error, "L2 read failed; skipping the tier");
                Err(())
            }
        }
    }

    /// Polls L2 for the lease winner's value for at most `lease_wait`.
    async fn wait_for_winner(
        &self,
        l2: &L2Settings,
        tier_key: TierKey,
        fence: u64,
    ) -> Option<Envelope<T>> {
        let give_up = tokio::time::Instant::now() + l2.lease_wait;
        while tokio::time::Instant::now() < give_up {
            tokio::time::sleep(l2.lease_poll).await;
            match self.read_l2(l2, tier_key).await {
                Ok(Some(envelope))
                    if envelope.is_fresh(self.clock.now()) && envelope.version >= fence =>
                {
                    return Some(envelope);
                }
                Ok(_) => {}
                Err(()) => return None,
            }
        }
        None
    }

    async fn load_from_source(&self, key: ItemKey) -> Result<Loaded<T>, LoadFailure> {
        bump(&self.stats.source_loads);
        let timeout = self.settings.load_timeout;
        match tokio::time::timeout(timeout, self.loader.load(key)).await {
            Ok(result) => result,
            Err(_elapsed) => Err(LoadFailure::timeout(format!(
                "{} source gave no answer within {} ms",
                self.settings.name,
                timeout.as_millis()
            ))),
        }
    }

    /// Writes the rebuilt value to L2 (version-fenced) and then releases the lease, off the
    /// caller's path: callers already have the value, Redis latency is not theirs to pay.
    fn write_l2_in_background(
        self: &Arc<Self>,
        l2: &L2Settings,
        tier_key: TierKey,
        envelope: &Envelope<T>,
        lease_token: Option<u64>,
    ) {
        let bytes = match envelope.encode() {
            Ok(bytes) => bytes,
            Err(error) => {
                tracing::error!(part = self.settings.name, %error, "cannot encode an envelope");
                return;
            }
        };
        let entry = TierEntry {
            version: envelope.version,
            bytes,
        };
        let ttl = Duration::from_millis(envelope.stale_until.millis_since(self.clock.now()).max(1));
        let tier = Arc::clone(&l2.tier);
        let name = self.settings.name;
        let refused = Arc::clone(self);
        tokio::spawn(async move {
            match tier.put_fenced(tier_key, &entry, ttl).await {
                Ok(FenceOutcome::Written) => {}
                Ok(FenceOutcome::Stale { current }) => {
                    bump(&refused.stats.fenced_writes_refused);
                    tracing::debug!(part = name, key = %tier_key.item, version = entry.version, current, "L2 holds a newer version; write refused");
                }
                Err(error) => {
                    bump(&refused.stats.l2_errors);
                    tracing::debug!(part = name, key = %tier_key.item, %error, "L2 write failed");
                }
            }
            if let Some(token) = lease_token
                && let Err(error) = tier.release_lease(tier_key, token).await
            {
                tracing::debug!(part = name, key = %tier_key.item, %error, "lease release failed; it expires on its own");
            }
        });
    }

    /// A fresh envelope for a loaded value under `policy`.
    fn stamp(&self, policy: &TtlPolicy, loaded: Loaded<T>) -> Envelope<T> {
        policy.envelope(
            loaded.value,
            loaded.version,
            self.clock.now(),
            &mut rand::rng(),
        )
    }

    /// Puts an L2 envelope into L1, never fresh for longer than L1's own (jittered) TTL.
    fn adopt_from_l2(&self, key: ItemKey, mut envelope: Envelope<T>) -> Arc<Envelope<T>> {
        let now = self.clock.now();
        let policy = &self.settings.ttl;
        let l1_ttl = if envelope.is_not_found() {
            policy.sample_not_found(&mut rand::rng())
        } else {
            policy.sample_fresh(&mut rand::rng())
        };
        let l1_fresh_until =
            now.saturating_add_millis(u64::try_from(l1_ttl.as_millis()).unwrap_or(u64::MAX));
        envelope.fresh_until = envelope.fresh_until.min(l1_fresh_until);
        self.insert_fenced(key, envelope)
    }

    /// The version of the fence L1 holds for `key`, 0 when it holds none.
    fn fence_version(&self, key: ItemKey) -> u64 {
        self.entries
            .get(&key)
            .filter(|envelope| envelope.tombstone)
            .map_or(0, |envelope| envelope.version)
    }

    /// Inserts unless L1 holds a newer version. Returns what the callers of this load get: the
    /// newer data L1 holds, or, when a fence refused the value, the value itself (those callers
    /// asked before the change; only later callers must not see it).
    fn insert_fenced(&self, key: ItemKey, envelope: Envelope<T>) -> Arc<Envelope<T>> {
        let candidate = Arc::new(envelope);
        let offered = Arc::clone(&candidate);
        let result = self
            .entries
            .entry(key)
            .and_compute_with(|existing| match existing {
                Some(current) if current.value().version > offered.version => Op::Nop,
                _ => Op::Put(offered),
            });
        match result {
            CompResult::Unchanged(current) => {
                bump(&self.stats.fenced_writes_refused);
                let current = current.into_value();
                if current.tombstone {
                    uncached(candidate)
                } else {
                    current
                }
            }
            _ => candidate,
        }
    }
}

/// What the callers of a load get when a fence refused its value: the same data, fresh for no
/// one, so that nothing built from it is kept either (the engine keeps a quote's rendering only
/// while every part is fresh). It is what the source said — older than the fence because the
/// event ran ahead of the source — and the next caller loads again.
fn uncached<T>(refused: Arc<Envelope<T>>) -> Arc<Envelope<T>> {
    match Arc::try_unwrap(refused) {
        Ok(mut envelope) => {
            envelope.fresh_until = envelope.fetched_at;
            envelope.stale_until = envelope.fetched_at;
            Arc::new(envelope)
        }
        // Shared with nothing else by construction; keep it as it is rather than copy.
        Err(shared) => shared,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::envelope::Jitter;
    use crate::memory::MemoryTier;
    use crate::shared::{SharedTier, TierEntry, TierKey};
    use rebate_domain::{ItemId, Platform, Timestamp};
    use std::sync::atomic::AtomicBool;

    /// An in-process source whose answers, latency and call count the test controls.
    #[derive(Debug, Default)]
    struct FakeSource {
        calls: AtomicU64,
        failing: AtomicBool,
        missing: AtomicBool,
        delay_ms: AtomicU64,
        version: AtomicU64,
    }

    #[async_trait]
    impl Loader<String> for FakeSource {
        async fn load(&self, key: ItemKey) -> Result<Loaded<String>, LoadFailure> {
            let call = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
            // The row is "read" when the load starts; the delay models the trip back.
            let version = self.version.load(Ordering::SeqCst);
            let delay = self.delay_ms.load(Ordering::SeqCst);
            if delay > 0 {
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
            if self.failing.load(Ordering::SeqCst) {
                return Err(LoadFailure::error("source down"));
            }
            if self.missing.load(Ordering::SeqCst) {
                return Ok(Loaded {
                    value: None,
                    version: 0,
                });
            }
            Ok(Loaded {
                value: Some(format!("{key}#{call}")),
                version,
            })
        }
    }

    fn key() -> ItemKey {
        ItemKey::new(Platform::Taobao, ItemId::from_u64(100_001))
    }

    /// The values concurrent callers received; every one must have been answered with a value.
    async fn answered_values(
        callers: Vec<tokio::task::JoinHandle<CacheOutcome<String>>>,
    ) -> Vec<String> {
        let mut values = Vec::new();
        for caller in callers {
            match caller.await.unwrap() {
                CacheOutcome::Loaded(envelope) | CacheOutcome::Hit(envelope) => {
                    values.push(envelope.value.clone().unwrap());
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        values
    }

    fn cache(source: &Arc<FakeSource>, clock: &ManualClock) -> PartCache<String> {
        let loader: Arc<dyn Loader<String>> = source.clone();
        PartCache::new(settings(), loader, Arc::new(clock.clone()))
    }

    fn settings() -> PartCacheSettings {
        PartCacheSettings {
            name: "test",
            part: PartKind::Rate,
            max_entries: 1_000,
            ttl: TtlPolicy {
                fresh: Duration::from_secs(60),
                jitter: Jitter::Ratio(0.1),
                stale: Duration::from_secs(600),
                not_found: Duration::from_secs(30),
            },
            load_timeout: Duration::from_secs(2),
        }
    }

    /// One "instance": its own L1 and its own view of the source, sharing `tier`.
    fn instance(
        source: &Arc<FakeSource>,
        tier: &Arc<MemoryTier>,
        clock: &ManualClock,
    ) -> PartCache<String> {
        let loader: Arc<dyn Loader<String>> = source.clone();
        let shared: Arc<dyn SharedTier> = tier.clone();
        PartCache::with_shared_tier(
            settings(),
            L2Settings {
                tier: shared,
                ttl: TtlPolicy {
                    fresh: Duration::from_secs(900),
                    jitter: Jitter::UpTo(Duration::from_secs(300)),
                    stale: Duration::from_secs(1800),
                    not_found: Duration::from_secs(120),
                },
                lease_ttl: Duration::from_secs(3),
                lease_wait: Duration::from_millis(300),
                lease_poll: Duration::from_millis(10),
            },
            loader,
            Arc::new(clock.clone()),
        )
    }

    fn tier_key() -> TierKey {
        TierKey {
            item: key(),
            part: PartKind::Rate,
        }
    }

    /// Two instances, 100 concurrent callers each, one cold key: the lease lets exactly one
    /// instance ask the source; the other takes the winner's value from L2.
    #[tokio::test]
    async fn one_rebuild_per_key_across_instances() {
        let source = Arc::new(FakeSource::default());
        source.delay_ms.store(30, Ordering::SeqCst);
        let tier = Arc::new(MemoryTier::new());
        let clock = ManualClock::new(Timestamp::from_millis(0));
        let first = instance(&source, &tier, &clock);
        let second = instance(&source, &tier, &clock);
        let callers: Vec<_> = (0..200)
            .map(|index| {
                let cache = if index % 2 == 0 {
                    first.clone()
                } else {
                    second.clone()
                };
                tokio::spawn(async move { cache.get(key(), BUDGET).await })
            })
            .collect();
        let values = answered_values(callers).await;
        assert_eq!(source.calls.load(Ordering::SeqCst), 1);
        assert!(values.iter().all(|value| value == &values[0]));
        let (a, b) = (first.stats(), second.stats());
        assert_eq!(a.leases_won + b.leases_won, 1);
        assert_eq!(a.lease_waits_served + b.lease_waits_served, 1);
        assert_eq!(tier.version_of(tier_key()), Some(0));
    }

    #[tokio::test]
    async fn a_cold_instance_fills_from_l2_without_the_source() {
        let source = Arc::new(FakeSource::default());
        let tier = Arc::new(MemoryTier::new());
        let clock = ManualClock::new(Timestamp::from_millis(0));
        let warm = instance(&source, &tier, &clock);
        warm.get(key(), BUDGET).await;
        // Let the background L2 write land.
        while tier.version_of(tier_key()).is_none() {
            tokio::task::yield_now().await;
        }
        let cold = instance(&source, &tier, &clock);
        assert!(matches!(
            cold.get(key(), BUDGET).await,
            CacheOutcome::Loaded(_)
        ));
        assert_eq!(source.calls.load(Ordering::SeqCst), 1);
        assert_eq!(cold.stats().l2_hits, 1);
        // The L1 copy is fresh for at most L1's TTL (66 s), though L2's lasts 15 min or more.
        let copy = cold.peek(&key()).unwrap();
        assert!(copy.fresh_until.millis_since(clock.now()) <= 66_000);
    }

    #[tokio::test]
    async fn an_unreachable_l2_is_skipped() {
        let source = Arc::new(FakeSource::default());
        let tier = Arc::new(MemoryTier::new());
        tier.set_failing(true);
        let clock = ManualClock::new(Timestamp::from_millis(0));
        let cache = instance(&source, &tier, &clock);
        assert!(matches!(
            cache.get(key(), BUDGET).await,
            CacheOutcome::Loaded(_)
        ));
        assert!(matches!(
            cache.get(key(), BUDGET).await,
            CacheOutcome::Hit(_)
        ));
        assert_eq!(source.calls.load(Ordering::SeqCst), 1);
        assert!(cache.stats().l2_errors >= 1);
    }

    #[tokio::test]
    async fn a_stale_l2_copy_stands_in_when_the_source_fails() {
        let source = Arc::new(FakeSource::default());
        let tier = Arc::new(MemoryTier::new());
        let clock = ManualClock::new(Timestamp::from_millis(0));
        instance(&source, &tier, &clock).get(key(), BUDGET).await;
        while tier.version_of(tier_key()).is_none() {
            tokio::task::yield_now().await;
        }
        source.failing.store(true, Ordering::SeqCst);
        // Past L2's fresh window (≤ 20 min), inside its stale window (+30 min).
        clock.advance(Duration::from_secs(1_300));
        let fresh_instance = instance(&source, &tier, &clock);
        match fresh_instance.get(key(), BUDGET).await {
            CacheOutcome::Stale(envelope, failure) => {
                assert_eq!(failure.kind, FailureKind::Error);
                assert_eq!(envelope.fetched_at, Timestamp::from_millis(0));
            }
            other => panic!("expected stale, got {other:?}"),
        }
    }

    /// A rebuild that read the row before a change and finishes after the change's event was
    /// processed: its early callers get what they asked for, nobody after the event sees it.
    #[tokio::test(start_paused = true)]
    async fn a_rebuild_racing_an_invalidation_never_serves_the_old_value_afterwards() {
        let source = Arc::new(FakeSource::default());
        source.version.store(1, Ordering::SeqCst);
        source.delay_ms.store(100, Ordering::SeqCst);
        let clock = ManualClock::new(Timestamp::from_millis(0));
        let cache = cache(&source, &clock);
        // The old load starts: it has "read" version 1.
        let early = {
            let cache = cache.clone();
            tokio::spawn(async move { cache.get(key(), Duration::from_secs(1)).await })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        // The row changes to version 2 and the event is processed.
        source.version.store(2, Ordering::SeqCst);
        cache
            .invalidate_to(key(), 2, Duration::from_secs(60), false)
            .await
            .unwrap();
        // A caller after the event does not join the old load; it gets version 2.
        match cache.get(key(), Duration::from_secs(1)).await {
            CacheOutcome::Loaded(envelope) => assert_eq!(envelope.version, 2),
            other => panic!("expected a fresh load, got {other:?}"),
        }
        // The early caller got its version-1 answer, but L1 never took it.
        match early.await.unwrap() {
            CacheOutcome::Loaded(envelope) => assert_eq!(envelope.version, 1),
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(cache.peek(&key()).unwrap().version, 2);
        for _ in 0..3 {
            match cache.get(key(), Duration::from_secs(1)).await {
                CacheOutcome::Hit(envelope) => assert_eq!(envelope.version, 2),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(source.calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn an_old_or_duplicate_event_keeps_newer_data() {
        let source = Arc::new(FakeSource::default());
        source.version.store(5, Ordering::SeqCst);
        let clock = ManualClock::new(Timestamp::from_millis(0));
        let cache = cache(&source, &clock);
        cache.get(key(), BUDGET).await;
        for version in [4, 5] {
            cache
                .invalidate_to(key(), version, Duration::from_secs(60), false)
                .await
                .unwrap();
            assert!(matches!(
                cache.get(key(), BUDGET).await,
                CacheOutcome::Hit(_)
            ));
        }
        assert_eq!(source.calls.load(Ordering::SeqCst), 1);
        // A newer event fences it: the next read reloads, and a fence is never served stale.
        source.failing.store(true, Ordering::SeqCst);
        cache
            .invalidate_to(key(), 6, Duration::from_secs(60), false)
            .await
            .unwrap();
        assert!(matches!(
            cache.get(key(), BUDGET).await,
            CacheOutcome::Failed(_)
        ));
        assert_eq!(cache.stats().invalidations, 3);
    }

    /// Through L2: the fence also stops another instance's rebuild that read the old row.
    #[tokio::test]
    async fn an_instance_that_fenced_its_l1_never_serves_the_older_l2_copy() {
        let source = Arc::new(FakeSource::default());
        source.version.store(1, Ordering::SeqCst);
        let tier = Arc::new(MemoryTier::new());
        let clock = ManualClock::new(Timestamp::from_millis(0));
        let reader = instance(&source, &tier, &clock);
        let value_of = |outcome: CacheOutcome<String>| match outcome {
            CacheOutcome::Loaded(envelope) | CacheOutcome::Hit(envelope) => {
                (envelope.version, envelope.value.clone().unwrap())
            }
            other => panic!("unexpected {other:?}"),
        };
        assert_eq!(value_of(reader.get(key(), BUDGET).await).0, 1);
        while tier.version_of(tier_key()) != Some(1) {
            tokio::task::yield_now().await;
        }
        // The row moves to version 2 and this instance applies the event to its L1; the L2
        // fence (another instance's shared delivery) has not landed yet.
        source.version.store(2, Ordering::SeqCst);
        reader
            .invalidate_to(key(), 2, Duration::from_secs(60), false)
            .await
            .unwrap();
        assert_eq!(tier.version_of(tier_key()), Some(1), "L2 still holds v1");
        let (version, value) = value_of(reader.get(key(), BUDGET).await);
        assert_eq!(version, 2, "{value}: the v1 copy in L2 must not come back");
        assert_eq!(source.calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn an_l2_fence_refuses_an_older_rebuild_from_another_instance() {
        let old_source = Arc::new(FakeSource::default());
        old_source.version.store(1, Ordering::SeqCst);
        let tier = Arc::new(MemoryTier::new());
        let clock = ManualClock::new(Timestamp::from_millis(0));
        let operator_side = instance(&old_source, &tier, &clock);
        operator_side
            .invalidate_to(key(), 2, Duration::from_secs(60), true)
            .await
            .unwrap();
        assert_eq!(tier.version_of(tier_key()), Some(2));
        // Another instance whose source still returns version 1 (a lagging read).
        let lagging = instance(&old_source, &tier, &clock);
        assert!(matches!(
            lagging.get(key(), BUDGET).await,
            CacheOutcome::Loaded(_)
        ));
        let refused = || lagging.stats().fenced_writes_refused >= 1;
        while !refused() {
            tokio::task::yield_now().await;
        }
        assert_eq!(tier.version_of(tier_key()), Some(2));
    }

    #[tokio::test]
    async fn an_older_version_never_replaces_a_newer_one_in_l1() {
        let source = Arc::new(FakeSource::default());
        source.version.store(5, Ordering::SeqCst);
        let tier = Arc::new(MemoryTier::new());
        let clock = ManualClock::new(Timestamp::from_millis(0));
        let cache = instance(&source, &tier, &clock);
        cache.get(key(), BUDGET).await;
        let older = Envelope {
            value: Some("old".to_owned()),
            version: 4,
            fetched_at: clock.now(),
            fresh_until: clock.now().saturating_add_millis(60_000),
            stale_until: clock.now().saturating_add_millis(600_000),
            tombstone: false,
        };
        let entry = TierEntry {
            version: 4,
            bytes: older.encode().unwrap(),
        };
        cache.absorb(key(), &entry);
        let held = cache.peek(&key()).unwrap();
        assert_eq!(held.version, 5);
        assert_ne!(held.value.as_deref(), Some("old"));
        assert_eq!(cache.stats().fenced_writes_refused, 1);
    }

    const BUDGET: Duration = Duration::from_millis(500);

    #[tokio::test]
    async fn fresh_entries_answer_without_the_source() {
        let source = Arc::new(FakeSource::default());
        let clock = ManualClock::new(Timestamp::from_millis(0));
        let cache = cache(&source, &clock);
        let CacheOutcome::Loaded(first) = cache.get(key(), BUDGET).await else {
            panic!("first read must load");
        };
        let CacheOutcome::Hit(second) = cache.get(key(), BUDGET).await else {
            panic!("second read must hit");
        };
        assert_eq!(first.value, second.value);
        assert_eq!(source.calls.load(Ordering::SeqCst), 1);
        // Past the longest jittered fresh TTL (66 s) the entry is reloaded.
        clock.advance(Duration::from_secs(67));
        assert!(matches!(
            cache.get(key(), BUDGET).await,
            CacheOutcome::Loaded(_)
        ));
        assert_eq!(source.calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn concurrent_misses_share_one_load() {
        let source = Arc::new(FakeSource::default());
        source.delay_ms.store(20, Ordering::SeqCst);
        let clock = ManualClock::new(Timestamp::from_millis(0));
        let cache = cache(&source, &clock);
        let callers: Vec<_> = (0..200)
            .map(|_| {
                let cache = cache.clone();
                tokio::spawn(async move { cache.get(key(), BUDGET).await })
            })
            .collect();
        let values = answered_values(callers).await;
        assert_eq!(source.calls.load(Ordering::SeqCst), 1);
        assert!(values.iter().all(|value| value == &values[0]));
        let stats = cache.stats();
        assert_eq!(stats.loads_started, 1);
        assert_eq!(stats.hits + stats.loads_joined + 1, 200, "{stats:?}");
    }

    #[tokio::test]
    async fn failing_source_serves_stale_until_the_stale_window_ends() {
        let source = Arc::new(FakeSource::default());
        let clock = ManualClock::new(Timestamp::from_millis(0));
        let cache = cache(&source, &clock);
        assert!(matches!(
            cache.get(key(), BUDGET).await,
            CacheOutcome::Loaded(_)
        ));
        source.failing.store(true, Ordering::SeqCst);
        clock.advance(Duration::from_secs(120));
        match cache.get(key(), BUDGET).await {
            CacheOutcome::Stale(envelope, failure) => {
                assert_eq!(failure.kind, FailureKind::Error);
                assert_eq!(envelope.fetched_at, Timestamp::from_millis(0));
            }
            other => panic!("expected stale, got {other:?}"),
        }
        // Fresh window ≤ 66 s plus a 600 s stale window: gone by 700 s.
        clock.advance(Duration::from_secs(600));
        assert!(matches!(
            cache.get(key(), BUDGET).await,
            CacheOutcome::Failed(_)
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn slow_source_times_out_but_its_value_is_kept_for_the_next_caller() {
        let source = Arc::new(FakeSource::default());
        source.delay_ms.store(800, Ordering::SeqCst);
        let clock = ManualClock::new(Timestamp::from_millis(0));
        let cache = cache(&source, &clock);
        match cache.get(key(), Duration::from_millis(100)).await {
            CacheOutcome::Failed(failure) => assert_eq!(failure.kind, FailureKind::Timeout),
            other => panic!("expected a timeout, got {other:?}"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(matches!(
            cache.get(key(), Duration::from_millis(100)).await,
            CacheOutcome::Hit(_)
        ));
        assert_eq!(source.calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_source_is_cut_off_by_the_load_timeout() {
        let source = Arc::new(FakeSource::default());
        source.delay_ms.store(3_600_000, Ordering::SeqCst);
        let clock = ManualClock::new(Timestamp::from_millis(0));
        let cache = cache(&source, &clock);
        let outcome = cache.get(key(), Duration::from_secs(10)).await;
        match outcome {
            CacheOutcome::Failed(failure) => assert_eq!(failure.kind, FailureKind::Timeout),
            other => panic!("expected a timeout, got {other:?}"),
        }
        // The load left `in_flight`: the next call starts a new one.
        source.delay_ms.store(0, Ordering::SeqCst);
        assert!(matches!(
            cache.get(key(), BUDGET).await,
            CacheOutcome::Loaded(_)
        ));
        assert_eq!(cache.stats().loads_started, 2);
    }

    #[tokio::test]
    async fn not_found_is_cached_briefly() {
        let source = Arc::new(FakeSource::default());
        source.missing.store(true, Ordering::SeqCst);
        let clock = ManualClock::new(Timestamp::from_millis(0));
        let cache = cache(&source, &clock);
        for _ in 0..5 {
            match cache.get(key(), BUDGET).await {
                CacheOutcome::Loaded(envelope) | CacheOutcome::Hit(envelope) => {
                    assert!(envelope.is_not_found());
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(source.calls.load(Ordering::SeqCst), 1);
        // The marker lives at most 33 s (30 s ± 10 %); then the source is asked again.
        clock.advance(Duration::from_secs(34));
        source.missing.store(false, Ordering::SeqCst);
        match cache.get(key(), BUDGET).await {
            CacheOutcome::Loaded(envelope) => assert!(envelope.value.is_some()),
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(cache.stats().not_found_cached, 1);
    }

    #[tokio::test]
    async fn invalidate_drops_the_copy() {
        let source = Arc::new(FakeSource::default());
        let clock = ManualClock::new(Timestamp::from_millis(0));
        let cache = cache(&source, &clock);
        cache.get(key(), BUDGET).await;
        assert!(cache.peek(&key()).is_some());
        cache.invalidate(&key());
        assert!(cache.peek(&key()).is_none());
        assert!(matches!(
            cache.get(key(), BUDGET).await,
            CacheOutcome::Loaded(_)
        ));
    }
}
