//! [`PartCache`]: L1 (moka) read-through for one part, with single-flight loads.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use moka::sync::Cache;
use rebate_domain::ItemKey;
use serde::Serialize;

use crate::clock::Clock;
use crate::envelope::{Envelope, TtlPolicy};

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
    /// The source answered within the budget (this caller's load or one it joined).
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
    pub max_entries: u64,
    pub ttl: TtlPolicy,
    /// Upper bound for one load, whatever the callers' budgets: loads run on after their callers
    /// give up, and must not pile up behind a hung source.
    pub load_timeout: Duration,
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
    pub entries: u64,
}

type LoadResult<T> = Result<Arc<Envelope<T>>, LoadFailure>;
type SharedLoad<T> = Shared<BoxFuture<'static, LoadResult<T>>>;

/// The L1 tier of one part: a bounded moka cache plus the loads in flight.
pub struct PartCache<T> {
    inner: Arc<Inner<T>>,
}

struct Inner<T> {
    settings: PartCacheSettings,
    entries: Cache<ItemKey, Arc<Envelope<T>>>,
    /// Loads in flight, one per key. Only touched on a miss and never held across `.await`.
    in_flight: Mutex<HashMap<ItemKey, SharedLoad<T>>>,
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

impl<T> PartCache<T>
where
    T: Send + Sync + 'static,
{
    pub fn new(
        settings: PartCacheSettings,
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
                entries,
                in_flight: Mutex::new(HashMap::new()),
                loader,
                clock,
                stats: CacheStats::default(),
            }),
        }
    }

    pub fn name(&self) -> &'static str {
        self.inner.settings.name
    }

    /// Reads through the cache, waiting at most `budget` for a load.
    pub async fn get(&self, key: ItemKey, budget: Duration) -> CacheOutcome<T> {
        let inner = &self.inner;
        let cached = inner.entries.get(&key);
        if let Some(envelope) = &cached
            && envelope.is_fresh(inner.clock.now())
        {
            inner.stats.hits.fetch_add(1, Ordering::Relaxed);
            return CacheOutcome::Hit(Arc::clone(envelope));
        }
        inner.stats.misses.fetch_add(1, Ordering::Relaxed);

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
        match cached {
            Some(envelope) if envelope.is_servable(inner.clock.now()) => {
                inner.stats.stale_served.fetch_add(1, Ordering::Relaxed);
                CacheOutcome::Stale(envelope, failure)
            }
            _ => CacheOutcome::Failed(failure),
        }
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
        CacheStatsSnapshot {
            hits: stats.hits.load(Ordering::Relaxed),
            misses: stats.misses.load(Ordering::Relaxed),
            loads_started: stats.loads_started.load(Ordering::Relaxed),
            loads_joined: stats.loads_joined.load(Ordering::Relaxed),
            load_failures: stats.load_failures.load(Ordering::Relaxed),
            stale_served: stats.stale_served.load(Ordering::Relaxed),
            not_found_cached: stats.not_found_cached.load(Ordering::Relaxed),
            entries: self.inner.entries.entry_count(),
        }
    }

    /// Returns a fresh envelope when another caller's load completed meanwhile, else the one load
    /// in flight for `key` (joined, or started here).
    fn join_or_start_load(&self, key: ItemKey) -> Result<Arc<Envelope<T>>, SharedLoad<T>> {
        let inner = &self.inner;
        let mut in_flight = inner
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(load) = in_flight.get(&key) {
            inner.stats.loads_joined.fetch_add(1, Ordering::Relaxed);
            return Err(load.clone());
        }
        // A load finishes by caching its value and *then* leaving `in_flight`, so a caller that
        // missed before the value landed and locks after the load left sees the value here.
        if let Some(envelope) = inner.entries.get(&key)
            && envelope.is_fresh(inner.clock.now())
        {
            return Ok(envelope);
        }
        inner.stats.loads_started.fetch_add(1, Ordering::Relaxed);
        let task = tokio::spawn(Self::run_load(Arc::clone(inner), key));
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
        in_flight.insert(key, load.clone());
        Err(load)
    }

    async fn run_load(inner: Arc<Inner<T>>, key: ItemKey) -> LoadResult<T> {
        let timeout = inner.settings.load_timeout;
        let result = match tokio::time::timeout(timeout, inner.loader.load(key)).await {
            Ok(Ok(loaded)) => {
                let envelope = inner.settings.ttl.envelope(
                    loaded.value,
                    loaded.version,
                    inner.clock.now(),
                    &mut rand::rng(),
                );
                if envelope.is_not_found() {
                    inner.stats.not_found_cached.fetch_add(1, Ordering::Relaxed);
                }
                let envelope = Arc::new(envelope);
                inner.entries.insert(key, Arc::clone(&envelope));
                Ok(envelope)
            }
            Ok(Err(failure)) => Err(failure),
            Err(_elapsed) => Err(LoadFailure::timeout(format!(
                "{} source gave no answer within {} ms",
                inner.settings.name,
                timeout.as_millis()
            ))),
        };
        if let Err(failure) = &result {
            inner.stats.load_failures.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(part = inner.settings.name, %key, %failure, "load failed");
        }
        inner
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&key);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
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
                version: self.version.load(Ordering::SeqCst),
            })
        }
    }

    fn key() -> ItemKey {
        ItemKey::new(Platform::Taobao, ItemId::from_u64(100_001))
    }

    fn cache(source: &Arc<FakeSource>, clock: &ManualClock) -> PartCache<String> {
        let settings = PartCacheSettings {
            name: "test",
            max_entries: 1_000,
            ttl: TtlPolicy {
                fresh: Duration::from_secs(60),
                jitter_ratio: 0.1,
                stale: Duration::from_secs(600),
                not_found: Duration::from_secs(30),
            },
            load_timeout: Duration::from_secs(2),
        };
        let loader: Arc<dyn Loader<String>> = source.clone();
        PartCache::new(settings, loader, Arc::new(clock.clone()))
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
        let mut values = Vec::new();
        for caller in callers {
            match caller.await.unwrap() {
                CacheOutcome::Loaded(envelope) | CacheOutcome::Hit(envelope) => {
                    values.push(envelope.value.clone().unwrap());
                }
                other => panic!("unexpected {other:?}"),
            }
        }
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
