//! A built-in consistency observer (the idea behind Meta's Polaris: "N nines of writes
//! consistent within T").
//!
//! For each applied event (sampled by `events.observer.sample_ratio`), after each of a few
//! windows (default 1 s, 10 s, 60 s) the instance compares what its L1 and the shared L2 would
//! serve for the event's store-backed parts (product, rate) with the store. A tier is
//! *inconsistent* when it would serve a fresh copy older than `min(event version, store
//! version)`: the event promised that version, and the store holds it (the minimum keeps an event
//! that ran ahead of the store from being blamed on the caches). The store is read after the
//! tiers, so a write newer than the event is never a false alarm: it raises the store's version
//! above the event's, and the target stays at the event's.
//!
//! An event that ran ahead of the store is not blamed on the caches, but it is not consistent
//! either: the check is *ahead_of_store* when the store's row is more than
//! `events.max_version_gap` versions behind the event (an operator's typo, 40000000000 for 4) at
//! any window, or has not reached the event's version by the verdict window (the first at or
//! after `events.fence_secs`, when the event's fence has fallen; the last window if none is).
//! Before the verdict window an event slightly ahead is judged as above, since the store's write
//! may still be on its way. A missing row is nothing to compare with (a deleted item, not a
//! typo). A tier that would serve a copy older than the store's own version is still
//! *inconsistent*, ahead or not.
//!
//! Each inconsistency is logged with the versions seen and the event id; an event ahead of the
//! store is logged once per item and part (not at every window) and counted in the report's
//! `ahead_of_store`. The counts per window are the metric
//! `rebate_consistency_checks_total{window,outcome}` and the status's `consistency`. Only
//! sampled events are looked at; the caches detect far-ahead events on every load themselves.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rebate_cache::{EntryMeta, L2Entry, PartView};
use rebate_domain::{ItemKey, PartKind, Timestamp};
use rebate_engine::QueryEngine;
use rebate_events::InvalidationEvent;
use rebate_store::CatalogRepository;
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How the observer samples and when it looks.
#[derive(Debug, Clone, PartialEq)]
pub struct ObserverConfig {
    pub enabled: bool,
    /// Share of applied events checked (0–1).
    pub sample_ratio: f64,
    /// When to look after an event is applied, ascending.
    pub windows: Vec<Duration>,
    /// Events under observation at once; beyond it, events are not sampled (counted as skipped).
    pub max_pending: u64,
    /// How long an event's fence stands (`events.fence_secs`): by then the store should hold
    /// the event's version.
    pub fence_for: Duration,
    /// Versions the store's row may lag an event by before the event is taken for a mistake
    /// (`events.max_version_gap`).
    pub max_version_gap: u64,
}

/// What one check found; its discriminant indexes `WindowCounts::by_outcome`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Consistent,
    Inconsistent,
    /// The store or L2 could not be read: nothing can be said.
    Unknown,
    /// The event's version is one the store's row does not reach: far ahead of it, or still
    /// ahead at the verdict window.
    AheadOfStore,
}

impl Outcome {
    /// Every outcome, in discriminant order.
    pub const ALL: [Outcome; 4] = [
        Outcome::Consistent,
        Outcome::Inconsistent,
        Outcome::Unknown,
        Outcome::AheadOfStore,
    ];

    /// The name in the status and the metric's `outcome` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Consistent => "consistent",
            Outcome::Inconsistent => "inconsistent",
            Outcome::Unknown => "unknown",
            Outcome::AheadOfStore => "ahead_of_store",
        }
    }
}

/// The counts of one window, for the status page.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WindowReport {
    pub window_ms: u64,
    pub consistent: u64,
    pub inconsistent: u64,
    pub unknown: u64,
    pub ahead_of_store: u64,
    /// `-log10(inconsistent / checked)`, where checked is consistent + inconsistent (an event
    /// ahead of the store says nothing of the caches): 3.0 is "three nines". None while nothing
    /// was found inconsistent (or nothing checked).
    pub nines: Option<f64>,
}

impl WindowReport {
    pub fn count(&self, outcome: Outcome) -> u64 {
        match outcome {
            Outcome::Consistent => self.consistent,
            Outcome::Inconsistent => self.inconsistent,
            Outcome::Unknown => self.unknown,
            Outcome::AheadOfStore => self.ahead_of_store,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ObserverReport {
    pub enabled: bool,
    pub sample_ratio: f64,
    pub pending: u64,
    /// Events not observed because `max_pending` were already under observation.
    pub skipped: u64,
    /// Sampled events found ahead of the store, once per event, item and part (however many
    /// windows saw it).
    pub ahead_of_store: u64,
    pub windows: Vec<WindowReport>,
}

#[derive(Debug, Default)]
struct WindowCounts {
    by_outcome: [AtomicU64; Outcome::ALL.len()],
}

/// One per instance; [`ConsistencyObserver::observe`] is called for every event applied to L1.
#[derive(Debug)]
pub struct ConsistencyObserver {
    settings: ObserverConfig,
    engine: QueryEngine,
    store: Arc<dyn CatalogRepository>,
    counts: Vec<WindowCounts>,
    /// The index of the first window at or after the fence time (else the last): from it on,
    /// an event the store has not reached is ahead of the store.
    verdict_window: usize,
    pending: AtomicU64,
    skipped: AtomicU64,
    ahead_of_store: AtomicU64,
    tasks: TaskTracker,
    shutdown: CancellationToken,
}

impl ConsistencyObserver {
    pub fn new(
        settings: ObserverConfig,
        engine: QueryEngine,
        store: Arc<dyn CatalogRepository>,
        tasks: TaskTracker,
        shutdown: CancellationToken,
    ) -> Arc<Self> {
        let counts = settings
            .windows
            .iter()
            .map(|_| WindowCounts::default())
            .collect();
        let verdict_window = settings
            .windows
            .iter()
            .position(|window| *window >= settings.fence_for)
            .unwrap_or_else(|| settings.windows.len().saturating_sub(1));
        Arc::new(Self {
            settings,
            engine,
            store,
            counts,
            verdict_window,
            pending: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            ahead_of_store: AtomicU64::new(0),
            tasks,
            shutdown,
        })
    }

    /// Schedules the checks of one applied event (if sampled and store-backed parts changed;
    /// an event that names no items, such as a rules announcement, has nothing to check).
    pub fn observe(self: &Arc<Self>, event: &InvalidationEvent) {
        let fences: Vec<(PartKind, u64)> = event
            .fences(Timestamp::now())
            .filter(|fence| matches!(fence.part, PartKind::Product | PartKind::Rate))
            .map(|fence| (fence.part, fence.version))
            .collect();
        if !self.settings.enabled
            || fences.is_empty()
            || rand::random::<f64>() >= self.settings.sample_ratio
        {
            return;
        }
        let admitted = self
            .pending
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |pending| {
                (pending < self.settings.max_pending).then_some(pending + 1)
            });
        if admitted.is_err() {
            self.skipped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let observer = Arc::clone(self);
        let event = event.clone();
        self.tasks.spawn(async move {
            let started = tokio::time::Instant::now();
            // Per item and part: whether its being ahead of the store was logged already.
            let mut ahead_reported = vec![false; event.item_ids().len() * fences.len()];
            for (index, window) in observer.settings.windows.iter().enumerate() {
                tokio::select! {
                    () = tokio::time::sleep_until(started + *window) => {}
                    () = observer.shutdown.cancelled() => break,
                }
                let look = Look {
                    window: *window,
                    at_verdict: index >= observer.verdict_window,
                };
                let mut reported = ahead_reported.iter_mut();
                for key in event.keys() {
                    for ((part, version), reported) in fences.iter().zip(reported.by_ref()) {
                        let outcome = observer
                            .check(&event, key, *part, *version, look, reported)
                            .await;
                        observer.counts[index].by_outcome[outcome as usize]
                            .fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            observer.pending.fetch_sub(1, Ordering::AcqRel);
        });
    }

    /// One item's part at one window. `ahead_reported` is whether this item and part of the
    /// event were found ahead of the store at an earlier window (and logged then).
    async fn check(
        &self,
        event: &InvalidationEvent,
        key: ItemKey,
        part: PartKind,
        event_version: u64,
        look: Look,
        ahead_reported: &mut bool,
    ) -> Outcome {
        if !matches!(part, PartKind::Product | PartKind::Rate) {
            return Outcome::Unknown;
        }
        let tiers = served_versions(self.engine.parts().view(part), key, self.engine.now()).await;
        let Ok((l1, l2)) = tiers else {
            return Outcome::Unknown;
        };
        let store = match part {
            PartKind::Product => self
                .store
                .product(key)
                .await
                .map(|row| row.map(|row| row.version)),
            _ => self
                .store
                .rate(key)
                .await
                .map(|row| row.map(|row| row.version)),
        };
        let Ok(store) = store else {
            return Outcome::Unknown;
        };
        let target = event_version.min(store.unwrap_or(0));
        let behind = |version: Option<u64>| version.is_some_and(|version| version < target);
        let ahead = store.and_then(|store_version| {
            let gap = event_version
                .checked_sub(store_version)
                .filter(|gap| *gap > 0)?;
            if gap > self.settings.max_version_gap {
                Some(AheadBy::MoreThanTheGap)
            } else if look.at_verdict {
                Some(AheadBy::NotReachedInTime)
            } else {
                None
            }
        });
        if let Some(ahead) = ahead
            && !*ahead_reported
        {
            *ahead_reported = true;
            self.ahead_of_store.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                event_id = event.event_id().as_str(),
                %key,
                part = part.as_str(),
                window_ms = look.window_ms(),
                event_version,
                store_version = store,
                max_version_gap = self.settings.max_version_gap,
                why = ahead.as_str(),
                "event ahead of the store: the store's row does not reach the event's version"
            );
        }
        if behind(l1) || behind(l2) {
            tracing::warn!(
                event_id = event.event_id().as_str(),
                %key,
                part = part.as_str(),
                window_ms = look.window_ms(),
                event_version,
                store_version = store,
                l1_version = l1,
                l2_version = l2,
                "inconsistent: a cache tier would serve a version older than the event's"
            );
            return Outcome::Inconsistent;
        }
        if ahead.is_some() {
            return Outcome::AheadOfStore;
        }
        Outcome::Consistent
    }

    pub fn report(&self) -> ObserverReport {
        ObserverReport {
            enabled: self.settings.enabled,
            sample_ratio: self.settings.sample_ratio,
            pending: self.pending.load(Ordering::Relaxed),
            skipped: self.skipped.load(Ordering::Relaxed),
            ahead_of_store: self.ahead_of_store.load(Ordering::Relaxed),
            windows: self
                .settings
                .windows
                .iter()
                .zip(&self.counts)
                .map(|(window, counts)| {
                    let [consistent, inconsistent, unknown, ahead_of_store] = counts
                        .by_outcome
                        .each_ref()
                        .map(|count| count.load(Ordering::Relaxed));
                    let checked = consistent + inconsistent;
                    WindowReport {
                        window_ms: u64::try_from(window.as_millis()).unwrap_or(u64::MAX),
                        consistent,
                        inconsistent,
                        unknown,
                        ahead_of_store,
                        nines: (inconsistent > 0)
                            .then(|| -(inconsistent as f64 / checked as f64).log10()),
                    }
                })
                .collect(),
        }
    }
}

/// When a check looks: which window, and whether the store should hold the event's version by
/// now.
#[derive(Debug, Clone, Copy)]
struct Look {
    window: Duration,
    at_verdict: bool,
}

impl Look {
    fn window_ms(self) -> u64 {
        u64::try_from(self.window.as_millis()).unwrap_or(u64::MAX)
    }
}

/// Why an event counts as ahead of the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AheadBy {
    /// More than `events.max_version_gap` versions ahead: a mistake, whatever the window.
    MoreThanTheGap,
    /// Still ahead at the verdict window: the write the event announced never came.
    NotReachedInTime,
}

impl AheadBy {
    fn as_str(self) -> &'static str {
        match self {
            AheadBy::MoreThanTheGap => "more_than_max_version_gap",
            AheadBy::NotReachedInTime => "not_reached_in_time",
        }
    }
}

/// The versions L1 and L2 would serve fresh for `key` (None: that tier would not serve it: absent,
/// past fresh, or a fence). `Err` when L2 could not be read.
async fn served_versions(
    cache: &dyn PartView,
    key: ItemKey,
    now: Timestamp,
) -> Result<(Option<u64>, Option<u64>), ()> {
    let servable =
        |entry: EntryMeta| (!entry.tombstone && entry.is_fresh(now)).then_some(entry.version);
    let l1 = cache.l1_entry(&key).and_then(servable);
    let l2 = match cache.l2_entry(key).await.map_err(|_| ())? {
        L2Entry::Present(entry) => servable(entry),
        L2Entry::Absent | L2Entry::Undecodable => None,
    };
    Ok((l1, l2))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use async_trait::async_trait;
    use futures::StreamExt;
    use futures::stream::BoxStream;
    use rebate_cache::{
        Jitter, LoadFailure, Loaded, Loader, ManualClock, PartCache, PartCacheConfig, TtlPolicy,
    };
    use rebate_domain::{ItemId, Platform, Product, RateBps, RebateRate};
    use rebate_engine::{EngineParts, PartTimeouts};
    use rebate_events::{EventId, EventKind};
    use rebate_store::{StoreCounters, StoreError, Versioned};

    use super::*;
    use crate::test_log::CapturedLines;

    const WINDOWS: [Duration; 3] = [
        Duration::from_secs(1),
        Duration::from_secs(10),
        Duration::from_secs(60),
    ];

    /// The store: a rate row's version per item, changed by the tests; no products.
    #[derive(Debug, Default)]
    struct Rows {
        rates: Mutex<HashMap<ItemKey, u64>>,
        counters: StoreCounters,
    }

    impl Rows {
        fn set(&self, key: ItemKey, version: u64) {
            self.rates
                .lock()
                .expect("not poisoned")
                .insert(key, version);
        }

        fn version(&self, key: ItemKey) -> Option<u64> {
            self.rates.lock().expect("not poisoned").get(&key).copied()
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
        async fn product(&self, _key: ItemKey) -> Result<Option<Versioned<Product>>, StoreError> {
            Ok(None)
        }

        async fn rate(&self, key: ItemKey) -> Result<Option<Versioned<RebateRate>>, StoreError> {
            Ok(self.version(key).map(rate_row))
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

    /// The rate cache's source: the row as the store holds it now.
    #[derive(Debug)]
    struct RateSource(Arc<Rows>);

    #[async_trait]
    impl Loader<RebateRate> for RateSource {
        async fn load(&self, key: ItemKey) -> Result<Loaded<RebateRate>, LoadFailure> {
            let row = self.0.version(key).map(rate_row);
            Ok(Loaded {
                version: row.as_ref().map_or(0, |row| row.version),
                value: row.map(|row| row.value),
            })
        }
    }

    /// The other parts' sources: nothing.
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

    fn part<T>(kind: PartKind, loader: Arc<dyn Loader<T>>, clock: &ManualClock) -> PartCache<T>
    where
        T: serde::Serialize + serde::de::DeserializeOwned + Send + Sync + 'static,
    {
        let ttl = TtlPolicy {
            fresh: Duration::from_secs(600),
            jitter: Jitter::Ratio(0.0),
            stale: Duration::from_secs(600),
            not_found: Duration::from_secs(600),
        };
        PartCache::new(
            PartCacheConfig {
                name: kind.as_str(),
                part: kind,
                max_entries: 100,
                ttl,
                load_timeout: Duration::from_secs(1),
                refresh_lead: Duration::ZERO,
                max_version_gap: 1_000_000,
            },
            loader,
            Arc::new(clock.clone()),
        )
    }

    struct Observed {
        observer: Arc<ConsistencyObserver>,
        engine: QueryEngine,
        rows: Arc<Rows>,
        tasks: TaskTracker,
    }

    impl Observed {
        /// Waits (on the paused clock) until every window of every observed event is checked.
        async fn finish(&self) -> ObserverReport {
            self.tasks.close();
            self.tasks.wait().await;
            self.observer.report()
        }
    }

    fn observed() -> Observed {
        let rows = Arc::new(Rows::default());
        let clock = ManualClock::starting_now();
        let parts = EngineParts {
            product: part(PartKind::Product, Arc::new(Nothing), &clock),
            rate: part(
                PartKind::Rate,
                Arc::new(RateSource(Arc::clone(&rows))),
                &clock,
            ),
            coupons: part(PartKind::Coupons, Arc::new(Nothing), &clock),
            extras: part(PartKind::Extras, Arc::new(Nothing), &clock),
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
        let observer = ConsistencyObserver::new(
            ObserverConfig {
                enabled: true,
                sample_ratio: 1.0,
                windows: WINDOWS.to_vec(),
                max_pending: 100,
                fence_for: Duration::from_secs(60),
                max_version_gap: 1_000_000,
            },
            engine.clone(),
            Arc::clone(&rows) as Arc<dyn CatalogRepository>,
            tasks.clone(),
            CancellationToken::new(),
        );
        Observed {
            observer,
            engine,
            rows,
            tasks,
        }
    }

    fn key(item: u64) -> ItemKey {
        ItemKey::new(Platform::Jd, ItemId::from_u64(item))
    }

    fn rate_changed(item: u64, version: u64) -> InvalidationEvent {
        InvalidationEvent::new(
            EventId::parse(&format!("evt-{item}-{version}")).expect("valid id"),
            EventKind::RateChanged,
            Platform::Jd,
            vec![ItemId::from_u64(item)],
            version,
            Timestamp::now(),
        )
        .expect("valid event")
    }

    /// Each window's (consistent, inconsistent, unknown, ahead_of_store).
    fn counts(report: &ObserverReport) -> Vec<(u64, u64, u64, u64)> {
        report
            .windows
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

    const AHEAD_LINE: &str = "event ahead of the store";

    #[tokio::test(start_paused = true)]
    async fn a_mistyped_version_is_ahead_of_store_at_every_window_and_logged_once() {
        let (captured, _guard) = CapturedLines::start();
        let observed = observed();
        observed.rows.set(key(4), 4);
        observed.observer.observe(&rate_changed(4, 40_000_000_000));

        let report = observed.finish().await;
        assert_eq!(counts(&report), [(0, 0, 0, 1); 3]);
        assert_eq!(report.ahead_of_store, 1);
        let lines = captured.containing(AHEAD_LINE);
        assert_eq!(lines.len(), 1, "{:?}", captured.lines());
        for field in [
            "event_id=evt-4-40000000000",
            "key=jd:4",
            "part=rate",
            "event_version=40000000000",
            "store_version=4",
            "why=more_than_max_version_gap",
            "window_ms=1000",
        ] {
            assert!(lines[0].contains(field), "{field} missing: {lines:?}");
        }
        assert!(lines[0].starts_with("WARN "), "{lines:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn an_event_the_store_holds_is_consistent_and_says_nothing() {
        let (captured, _guard) = CapturedLines::start();
        let observed = observed();
        observed.rows.set(key(5), 5);
        observed.observer.observe(&rate_changed(5, 5));

        let report = observed.finish().await;
        assert_eq!(counts(&report), [(1, 0, 0, 0); 3]);
        assert_eq!(report.ahead_of_store, 0);
        assert!(captured.lines().is_empty(), "{:?}", captured.lines());
    }

    #[tokio::test(start_paused = true)]
    async fn an_event_slightly_ahead_is_judged_at_the_first_window_at_or_after_the_fence() {
        let (captured, _guard) = CapturedLines::start();
        let observed = observed();
        // The store never reaches the event's version.
        observed.rows.set(key(6), 5);
        observed.observer.observe(&rate_changed(6, 7));
        // The store reaches it between the 10 s and the 60 s look.
        observed.rows.set(key(7), 5);
        observed.observer.observe(&rate_changed(7, 7));
        tokio::time::sleep(Duration::from_secs(30)).await;
        observed.rows.set(key(7), 7);

        let report = observed.finish().await;
        assert_eq!(
            counts(&report),
            [(2, 0, 0, 0), (2, 0, 0, 0), (1, 0, 0, 1)],
            "before the fence falls, an event slightly ahead may still be met by its write"
        );
        assert_eq!(report.ahead_of_store, 1);
        let lines = captured.containing(AHEAD_LINE);
        assert_eq!(lines.len(), 1, "{:?}", captured.lines());
        assert!(lines[0].contains("key=jd:6"), "{lines:?}");
        assert!(lines[0].contains("why=not_reached_in_time"), "{lines:?}");
        assert!(lines[0].contains("window_ms=60000"), "{lines:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_tier_behind_the_store_is_inconsistent_even_when_the_event_is_ahead() {
        let (captured, _guard) = CapturedLines::start();
        let observed = observed();
        observed.rows.set(key(8), 3);
        let cached = observed
            .engine
            .parts()
            .rate
            .get(key(8), Duration::from_secs(1))
            .await;
        assert!(
            matches!(&cached, rebate_cache::CacheOutcome::Loaded(entry) if entry.version == 3),
            "L1 holds version 3"
        );
        observed.rows.set(key(8), 4);
        observed.observer.observe(&rate_changed(8, 40_000_000_000));

        let report = observed.finish().await;
        assert_eq!(counts(&report), [(0, 1, 0, 0); 3]);
        assert_eq!(report.ahead_of_store, 1, "counted all the same");
        assert_eq!(captured.containing(AHEAD_LINE).len(), 1);
        assert_eq!(captured.containing("inconsistent").len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_missing_row_is_nothing_to_be_ahead_of() {
        let observed = observed();
        observed.observer.observe(&rate_changed(9, 40_000_000_000));
        let report = observed.finish().await;
        assert_eq!(counts(&report), [(1, 0, 0, 0); 3]);
        assert_eq!(report.ahead_of_store, 0);
    }

    #[test]
    fn the_verdict_window_is_the_first_at_or_after_the_fence_else_the_last() {
        let verdict = |windows: &[u64], fence_secs: u64| {
            let observed = observed();
            let observer = ConsistencyObserver::new(
                ObserverConfig {
                    enabled: true,
                    sample_ratio: 1.0,
                    windows: windows
                        .iter()
                        .map(|secs| Duration::from_secs(*secs))
                        .collect(),
                    max_pending: 1,
                    fence_for: Duration::from_secs(fence_secs),
                    max_version_gap: 1,
                },
                observed.engine.clone(),
                Arc::clone(&observed.rows) as Arc<dyn CatalogRepository>,
                TaskTracker::new(),
                CancellationToken::new(),
            );
            observer.verdict_window
        };
        assert_eq!(verdict(&[1, 10, 60], 60), 2);
        assert_eq!(verdict(&[1, 10, 60], 5), 1);
        assert_eq!(verdict(&[1, 10, 60], 1), 0);
        assert_eq!(
            verdict(&[1, 10, 60], 600),
            2,
            "none reaches the fence: the last"
        );
        assert_eq!(verdict(&[3, 6], 60), 1);
    }

    #[test]
    fn every_outcome_has_its_name_and_its_count() {
        let report = WindowReport {
            window_ms: 1_000,
            consistent: 1,
            inconsistent: 2,
            unknown: 3,
            ahead_of_store: 4,
            nines: None,
        };
        let named: Vec<(&str, u64)> = Outcome::ALL
            .iter()
            .map(|outcome| (outcome.as_str(), report.count(*outcome)))
            .collect();
        assert_eq!(
            named,
            [
                ("consistent", 1),
                ("inconsistent", 2),
                ("unknown", 3),
                ("ahead_of_store", 4)
            ]
        );
        for (index, outcome) in Outcome::ALL.iter().enumerate() {
            assert_eq!(*outcome as usize, index);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_rules_announcement_is_not_observed() {
        let observed = observed();
        let announcement = InvalidationEvent::rules_changed(
            EventId::parse("rules-9").expect("valid id"),
            9,
            Timestamp::now(),
        )
        .expect("valid announcement");
        observed.observer.observe(&announcement);

        let report = observed.finish().await;
        assert_eq!(counts(&report), [(0, 0, 0, 0); 3]);
        assert_eq!((report.pending, report.skipped), (0, 0));
    }
}
