//! What the observer counts and how it reports it: [`Outcome`], the counts per source, window
//! and outcome, and [`ObserverReport`] with its nines.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;

use super::source::{BySource, CheckSource};

/// What one check found; its discriminant indexes the counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Consistent,
    Inconsistent,
    /// The store or L2 could not be read: nothing can be said.
    Unknown,
    /// The event's version is one the store's row does not reach: far ahead of it, or still
    /// ahead at the verdict window. Events only.
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
    /// See [`nines`]: 3.0 is "three nines"; null before anything was checked.
    pub nines: Option<f64>,
}

impl WindowReport {
    fn new(
        window: Duration,
        [consistent, inconsistent, unknown, ahead_of_store]: [u64; 4],
    ) -> Self {
        Self {
            window_ms: u64::try_from(window.as_millis()).unwrap_or(u64::MAX),
            consistent,
            inconsistent,
            unknown,
            ahead_of_store,
            nines: nines(consistent, inconsistent),
        }
    }

    pub fn count(&self, outcome: Outcome) -> u64 {
        match outcome {
            Outcome::Consistent => self.consistent,
            Outcome::Inconsistent => self.inconsistent,
            Outcome::Unknown => self.unknown,
            Outcome::AheadOfStore => self.ahead_of_store,
        }
    }

    /// The two windows' counts added up (the same window of two sources).
    fn plus(&self, other: &WindowReport) -> WindowReport {
        let counts = Outcome::ALL.map(|outcome| self.count(outcome) + other.count(outcome));
        WindowReport::new(Duration::from_millis(self.window_ms), counts)
    }
}

/// `-log10(1 - consistent / checked)`, checked being consistent + inconsistent (unknown and
/// ahead-of-store checks say nothing of the caches): `-log10(inconsistent / checked)`.
///
/// With no inconsistency the ratio's logarithm is infinite; the figure is then capped at
/// `log10(checked)`, the nines one inconsistency among as many checks would give: the most the
/// counts can vouch for (a lower bound of what they showed). So 1,000 clean checks are 3.0, and
/// a single clean check is 0.0. `None` while nothing was checked.
pub fn nines(consistent: u64, inconsistent: u64) -> Option<f64> {
    let checked = consistent + inconsistent;
    if checked == 0 {
        return None;
    }
    let failed = inconsistent.max(1);
    Some(-(failed as f64 / checked as f64).log10())
}

/// What the drift sampler did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DriftReport {
    /// Keys drawn each second (`events.observer.drift_keys_per_sec`); 0: the sampler is off.
    pub keys_per_sec: u32,
    /// Keys drawn since start.
    pub drawn: u64,
    /// Keys found behind at their first look and followed now: looked at again after each
    /// window.
    pub following: u64,
    /// Keys found behind while `max_pending` were already followed: not followed.
    pub skipped: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ObserverReport {
    pub enabled: bool,
    pub sample_ratio: f64,
    /// Events under observation now.
    pub pending: u64,
    /// Events not observed because `max_pending` were already under observation.
    pub skipped: u64,
    /// Sampled events found ahead of the store, once per event, item and part (however many
    /// windows saw it).
    pub ahead_of_store: u64,
    /// The checks of applied events per window, whatever their source: `sources.event` and
    /// `sources.binlog` added up. The drift sampler's are in `sources.sample` only.
    pub windows: Vec<WindowReport>,
    /// The checks per source and window.
    pub sources: BySource<Vec<WindowReport>>,
    pub drift: DriftReport,
}

/// The checks counted per source, window (by index) and outcome.
#[derive(Debug)]
pub(super) struct Counts {
    windows: Vec<Duration>,
    by_source: BySource<Vec<[AtomicU64; Outcome::ALL.len()]>>,
}

impl Counts {
    pub(super) fn new(windows: &[Duration]) -> Self {
        Self {
            windows: windows.to_vec(),
            by_source: BySource::from_fn(|_| windows.iter().map(|_| Default::default()).collect()),
        }
    }

    pub(super) fn add(&self, source: CheckSource, window: usize, outcome: Outcome) {
        self.by_source.get(source)[window][outcome as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// One outcome at every window: what a check that needs no second look counts.
    pub(super) fn add_every_window(&self, source: CheckSource, outcome: Outcome) {
        for window in 0..self.windows.len() {
            self.add(source, window, outcome);
        }
    }

    /// Each source's windows as reported, and the events' (every source but the sampler)
    /// added up.
    pub(super) fn reports(&self) -> (Vec<WindowReport>, BySource<Vec<WindowReport>>) {
        let sources = BySource::from_fn(|source| {
            self.windows
                .iter()
                .zip(self.by_source.get(source))
                .map(|(window, counts)| {
                    WindowReport::new(
                        *window,
                        counts.each_ref().map(|count| count.load(Ordering::Relaxed)),
                    )
                })
                .collect::<Vec<_>>()
        });
        let events = sources
            .event
            .iter()
            .zip(&sources.binlog)
            .map(|(event, binlog)| event.plus(binlog))
            .collect();
        (events, sources)
    }
}
