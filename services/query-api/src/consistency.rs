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
//! Each inconsistency is logged once with the versions seen and the event id; the counts per
//! window are the metric `rebate_consistency_checks_total{window,outcome}` and the status's
//! `consistency`.

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
}

/// What one check found; its discriminant indexes `WindowCounts::by_outcome`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Consistent,
    Inconsistent,
    /// The store or L2 could not be read: nothing can be said.
    Unknown,
}

/// The counts of one window, for the status page.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WindowReport {
    pub window_ms: u64,
    pub consistent: u64,
    pub inconsistent: u64,
    pub unknown: u64,
    /// `-log10(inconsistent / checked)`: 3.0 is "three nines". None while nothing was found
    /// inconsistent (or nothing checked).
    pub nines: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ObserverReport {
    pub enabled: bool,
    pub sample_ratio: f64,
    pub pending: u64,
    /// Events not observed because `max_pending` were already under observation.
    pub skipped: u64,
    pub windows: Vec<WindowReport>,
}

#[derive(Debug, Default)]
struct WindowCounts {
    by_outcome: [AtomicU64; 3],
}

/// One per instance; [`ConsistencyObserver::observe`] is called for every event applied to L1.
#[derive(Debug)]
pub struct ConsistencyObserver {
    settings: ObserverConfig,
    engine: QueryEngine,
    store: Arc<dyn CatalogRepository>,
    counts: Vec<WindowCounts>,
    pending: AtomicU64,
    skipped: AtomicU64,
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
        Arc::new(Self {
            settings,
            engine,
            store,
            counts,
            pending: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            tasks,
            shutdown,
        })
    }

    /// Schedules the checks of one applied event (if sampled and store-backed parts changed).
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
            for (index, window) in observer.settings.windows.iter().enumerate() {
                tokio::select! {
                    () = tokio::time::sleep_until(started + *window) => {}
                    () = observer.shutdown.cancelled() => break,
                }
                for key in event.keys() {
                    for (part, version) in &fences {
                        let outcome = observer.check(&event, key, *part, *version, *window).await;
                        observer.counts[index].by_outcome[outcome as usize]
                            .fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            observer.pending.fetch_sub(1, Ordering::AcqRel);
        });
    }

    async fn check(
        &self,
        event: &InvalidationEvent,
        key: ItemKey,
        part: PartKind,
        event_version: u64,
        window: Duration,
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
        if behind(l1) || behind(l2) {
            tracing::warn!(
                event_id = event.event_id().as_str(),
                %key,
                part = part.as_str(),
                window_ms = window.as_millis() as u64,
                event_version,
                store_version = store,
                l1_version = l1,
                l2_version = l2,
                "inconsistent: a cache tier would serve a version older than the event's"
            );
            return Outcome::Inconsistent;
        }
        Outcome::Consistent
    }

    pub fn report(&self) -> ObserverReport {
        ObserverReport {
            enabled: self.settings.enabled,
            sample_ratio: self.settings.sample_ratio,
            pending: self.pending.load(Ordering::Relaxed),
            skipped: self.skipped.load(Ordering::Relaxed),
            windows: self
                .settings
                .windows
                .iter()
                .zip(&self.counts)
                .map(|(window, counts)| {
                    let [consistent, inconsistent, unknown] = counts
                        .by_outcome
                        .each_ref()
                        .map(|count| count.load(Ordering::Relaxed));
                    let checked = consistent + inconsistent;
                    WindowReport {
                        window_ms: u64::try_from(window.as_millis()).unwrap_or(u64::MAX),
                        consistent,
                        inconsistent,
                        unknown,
                        nines: (inconsistent > 0)
                            .then(|| -(inconsistent as f64 / checked as f64).log10()),
                    }
                })
                .collect(),
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
