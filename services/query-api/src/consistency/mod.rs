//! A built-in consistency observer (the idea behind Meta's Polaris: "N nines of writes
//! consistent within T"): it compares what this instance would serve a client with the store.
//!
//! # What a look compares
//! A request is answered from one of three copies, and a look reads each of them (`tiers`):
//! - the kept rendering of the whole quote, by the part versions it records when it is kept;
//! - the part's L1 entry;
//! - the part's L2 entry.
//!
//! Only a copy that would be served as is counts: a fresh one. A copy past its fresh window or
//! a fence is not one. A not-found marker counts as version 0. Reading never disturbs a tier:
//! no hit counted, no load or refresh started. The store is read after the tiers, so a write
//! landing meanwhile raises the store's version, never a copy's.
//!
//! Only product and rate are compared: the store holds their rows, with versions. Coupons and
//! extras have no store row (their versions are the coupon API's and a fetch time), so no
//! check compares them, even when an event names them.
//!
//! # Where checks come from: the `source` label
//! | source | what starts a check | judged against |
//! | --- | --- | --- |
//! | `event` | an operator's event applied here (`events.observer.sample_ratio` of them) | `min(event version, store version)` |
//! | `binlog` | an event change capture derived from the binlog (its id starts `binlog:`), sampled alike | the same |
//! | `sample` | the drift sampler: a key this instance holds, no event | the store's row |
//!
//! # Events (`event`, `binlog`)
//! After each window (default 1 s, 10 s, 60 s) from an applied event, each store-backed part
//! the event names is looked at. A tier is *inconsistent* when its copy is older than
//! `min(event version, store version)`: the event promised that version, and the store holds
//! it. The minimum keeps an event that ran ahead of the store from being blamed on the caches;
//! a write newer than the event raises the store above the event, and the target stays put.
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
//! Each inconsistency is logged with the versions seen, the event id and the source. An event
//! ahead of the store is logged once per item and part (not at every window) and counted in the
//! report's `ahead_of_store`. Only sampled events are looked at; the caches detect far-ahead
//! events on every load themselves.
//!
//! # The drift sampler (`sample`)
//! Events only show what they announce. A write nobody announced, or a copy written behind a
//! fence's back, shows only when someone looks: the sampler does (`sampler`). See its module
//! docs for how keys are drawn and judged.
//!
//! # Counts and nines
//! Every check counts once per window, by source and outcome: the metric
//! `rebate_consistency_checks_total{source,window,outcome}` and the status's `consistency`
//! (`sources`, and `windows` for every event whatever its source). The nines of a window are
//! `-log10(inconsistent / (consistent + inconsistent))`; with no inconsistency they are capped
//! at `log10(consistent)` ([`nines`]).
//!
//! # Layout
//! - `mod.rs`: [`ObserverConfig`], [`ConsistencyObserver`] and the event path.
//! - `source`: [`CheckSource`] (event, binlog, sample) and [`BySource`].
//! - `tiers`: one look at one key's part: each tier's copy, then the store's row.
//! - `sampler`: the drift sampler: drawing keys, the first look, the looks at each window.
//! - `report`: [`Outcome`], the counts, [`ObserverReport`] and [`nines`].

mod report;
mod sampler;
mod source;
#[cfg(test)]
mod tests;
mod tiers;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rebate_domain::{ItemKey, PartKind, Timestamp};
use rebate_engine::QueryEngine;
use rebate_events::InvalidationEvent;
use rebate_store::CatalogRepository;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use report::{DriftReport, ObserverReport, Outcome, WindowReport, nines};
pub use source::{BINLOG_EVENT_PREFIX, BySource, CheckSource};

use report::Counts;
use sampler::DriftState;
use tiers::STORE_BACKED;

/// How the observer samples and when it looks.
#[derive(Debug, Clone, PartialEq)]
pub struct ObserverConfig {
    pub enabled: bool,
    /// Share of applied events checked (0–1).
    pub sample_ratio: f64,
    /// When to look after an event is applied (or a sampled key found behind), ascending.
    pub windows: Vec<Duration>,
    /// Events under observation at once; beyond it, events are not sampled (counted as
    /// skipped). The drift sampler follows at most as many keys.
    pub max_pending: u64,
    /// How long an event's fence stands (`events.fence_secs`): by then the store should hold
    /// the event's version.
    pub fence_for: Duration,
    /// Versions the store's row may lag an event by before the event is taken for a mistake
    /// (`events.max_version_gap`).
    pub max_version_gap: u64,
    /// Keys the drift sampler draws each second; 0 turns it off.
    pub drift_keys_per_sec: u32,
}

/// One per instance; [`ConsistencyObserver::observe`] is called for every event applied to L1.
#[derive(Debug)]
pub struct ConsistencyObserver {
    settings: ObserverConfig,
    engine: QueryEngine,
    store: Arc<dyn CatalogRepository>,
    counts: Counts,
    /// The index of the first window at or after the fence time (else the last): from it on,
    /// an event the store has not reached is ahead of the store.
    verdict_window: usize,
    pending: AtomicU64,
    skipped: AtomicU64,
    ahead_of_store: AtomicU64,
    drift: DriftState,
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
        let verdict_window = settings
            .windows
            .iter()
            .position(|window| *window >= settings.fence_for)
            .unwrap_or_else(|| settings.windows.len().saturating_sub(1));
        Arc::new(Self {
            counts: Counts::new(&settings.windows),
            settings,
            engine,
            store,
            verdict_window,
            pending: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            ahead_of_store: AtomicU64::new(0),
            drift: DriftState::default(),
            tasks,
            shutdown,
        })
    }

    /// Schedules the checks of one applied event (if sampled and store-backed parts changed;
    /// an event that names no items, such as a rules announcement, has nothing to check).
    pub fn observe(self: &Arc<Self>, event: &InvalidationEvent) {
        let fences: Vec<(PartKind, u64)> = event
            .fences(Timestamp::now())
            .filter(|fence| STORE_BACKED.contains(&fence.part))
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
        let source = CheckSource::of(&event);
        self.tasks.spawn(async move {
            let started = tokio::time::Instant::now();
            // Per item and part: whether its being ahead of the store was logged already.
            let mut ahead_reported = vec![false; event.item_ids().len() * fences.len()];
            for (index, window) in observer.settings.windows.iter().enumerate() {
                tokio::select! {
                    () = tokio::time::sleep_until(started + *window) => {}
                    () = observer.shutdown.cancelled() => break,
                }
                let look = EventLook {
                    source,
                    window: *window,
                    at_verdict: index >= observer.verdict_window,
                };
                let mut reported = ahead_reported.iter_mut();
                for key in event.keys() {
                    for ((part, version), reported) in fences.iter().zip(reported.by_ref()) {
                        let outcome = observer
                            .check(&event, key, *part, *version, look, reported)
                            .await;
                        observer.counts.add(source, index, outcome);
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
        look: EventLook,
        ahead_reported: &mut bool,
    ) -> Outcome {
        let Ok(seen) = tiers::look(&self.engine, self.store.as_ref(), key, part).await else {
            return Outcome::Unknown;
        };
        let store = seen.store;
        let target = event_version.min(store.unwrap_or(0));
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
                source = look.source.as_str(),
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
        if seen.copies.any(|version| version < target) {
            tracing::warn!(
                source = look.source.as_str(),
                event_id = event.event_id().as_str(),
                %key,
                part = part.as_str(),
                window_ms = look.window_ms(),
                event_version,
                store_version = store,
                rendering_version = seen.copies.rendering,
                l1_version = seen.copies.l1,
                l2_version = seen.copies.l2,
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
        let (windows, sources) = self.counts.reports();
        ObserverReport {
            enabled: self.settings.enabled,
            sample_ratio: self.settings.sample_ratio,
            pending: self.pending.load(Ordering::Relaxed),
            skipped: self.skipped.load(Ordering::Relaxed),
            ahead_of_store: self.ahead_of_store.load(Ordering::Relaxed),
            windows,
            sources,
            drift: self.drift_report(),
        }
    }
}

/// When an event's check looks: for which source, at which window, and whether the store
/// should hold the event's version by now.
#[derive(Debug, Clone, Copy)]
struct EventLook {
    source: CheckSource,
    window: Duration,
    at_verdict: bool,
}

impl EventLook {
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
