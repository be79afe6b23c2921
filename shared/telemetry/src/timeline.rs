//! A request's own record of where its time went, kept without any tracing backend.
//!
//! The edge creates one [`Timeline`] per request and runs the handler inside
//! [`Timeline::scope`]; the engine, the caches and the dependency guards append [`Stage`]s to
//! [`Timeline::current`] (nothing happens when there is none). Loads that run in their own task
//! are given the starting request's timeline, so a slow request's record shows the load it
//! started. On the hot path (every part from L1) nothing is recorded at all.

use std::borrow::Cow;
use std::sync::{Arc, Mutex, PoisonError};

use serde::Serialize;
use tokio::time::Instant;

use crate::TraceId;

tokio::task_local! {
    static TIMELINE: Arc<Timeline>;
}

/// The most stages one request keeps; a pathological request cannot grow without bound.
const MAX_STAGES: usize = 64;

#[derive(Debug)]
pub struct Timeline {
    trace_id: TraceId,
    started: Instant,
    stages: Mutex<Vec<Stage>>,
}

/// One step of a request: a part answered by some tier, a cache-tier read, a dependency call.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Stage {
    /// `part`, `l2`, `lease`, `dependency`, `shed`.
    pub kind: &'static str,
    /// The part (`product`, …) or dependency (`mysql`, `coupons`, …).
    pub name: &'static str,
    /// What happened: which tier answered, hit/miss, success/timeout/breaker_open, …
    pub outcome: Cow<'static, str>,
    /// Milliseconds from the start of the request to the start of this stage.
    pub started_ms: f64,
    pub elapsed_ms: f64,
    /// For dependency calls: 1 for the first attempt, 2 and 3 for retries.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
}

impl Timeline {
    pub fn new(trace_id: TraceId) -> Arc<Self> {
        Arc::new(Self {
            trace_id,
            started: Instant::now(),
            stages: Mutex::new(Vec::new()),
        })
    }

    pub fn trace_id(&self) -> TraceId {
        self.trace_id
    }

    /// When the request began (the timeline's zero).
    pub fn started(&self) -> Instant {
        self.started
    }

    /// The timeline of the running task, if a request set one.
    pub fn current() -> Option<Arc<Self>> {
        TIMELINE.try_with(Arc::clone).ok()
    }

    /// The trace id of the running task's timeline, if a request set one (no reference taken).
    pub fn current_trace_id() -> Option<TraceId> {
        TIMELINE.try_with(|timeline| timeline.trace_id).ok()
    }

    /// Runs `run` with this timeline as [`Timeline::current`], for work done without a future.
    pub fn sync_scope<R>(self: Arc<Self>, run: impl FnOnce() -> R) -> R {
        TIMELINE.sync_scope(self, run)
    }

    /// Runs `future` with this timeline as [`Timeline::current`].
    pub async fn scope<F: Future>(self: Arc<Self>, future: F) -> F::Output {
        TIMELINE.scope(self, future).await
    }

    /// Records a stage that began at `started` and ends now.
    pub fn record(
        &self,
        kind: &'static str,
        name: &'static str,
        outcome: impl Into<Cow<'static, str>>,
        started: Instant,
        attempt: Option<u32>,
    ) {
        let stage = Stage {
            kind,
            name,
            outcome: outcome.into(),
            started_ms: millis(started.saturating_duration_since(self.started)),
            elapsed_ms: millis(started.elapsed()),
            attempt,
        };
        let mut stages = self.stages.lock().unwrap_or_else(PoisonError::into_inner);
        if stages.len() < MAX_STAGES {
            stages.push(stage);
        }
    }

    /// Appends every stage of `other` (work done on this request's behalf and others' at once,
    /// such as one upstream call for several requests), placed on this request's time line.
    pub fn record_from(&self, other: &Timeline) {
        let offset_ms = if other.started >= self.started {
            millis(other.started - self.started)
        } else {
            -millis(self.started - other.started)
        };
        let borrowed = other.stages();
        let mut stages = self.stages.lock().unwrap_or_else(PoisonError::into_inner);
        for mut stage in borrowed {
            if stages.len() >= MAX_STAGES {
                break;
            }
            stage.started_ms = ((stage.started_ms + offset_ms) * 1e3).round() / 1e3;
            stages.push(stage);
        }
    }

    /// The stages so far, in the order they ended.
    pub fn stages(&self) -> Vec<Stage> {
        self.stages
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Records a stage on the current request's timeline, if there is one.
pub fn record_stage(
    kind: &'static str,
    name: &'static str,
    outcome: impl Into<Cow<'static, str>>,
    started: Instant,
    attempt: Option<u32>,
) {
    if let Ok(timeline) = TIMELINE.try_with(Arc::clone) {
        timeline.record(kind, name, outcome, started, attempt);
    }
}

fn millis(duration: std::time::Duration) -> f64 {
    (duration.as_secs_f64() * 1e6).round() / 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn stages_of_shared_work_are_placed_on_each_requests_time_line() {
        let early = Timeline::new(TraceId::generate());
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        let shared = Timeline::new(TraceId::generate());
        let late = {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            Timeline::new(TraceId::generate())
        };
        let started = Instant::now();
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        shared.record("dependency", "coupons", "success", started, Some(1));
        early.record_from(&shared);
        late.record_from(&shared);
        let on_early = &early.stages()[0];
        let on_late = &late.stages()[0];
        assert_eq!((on_early.started_ms, on_early.elapsed_ms), (15.0, 20.0));
        assert_eq!((on_late.started_ms, on_late.elapsed_ms), (0.0, 20.0));
        assert_eq!(on_early.name, "coupons");
        assert_eq!(on_early.attempt, Some(1));
    }

    #[tokio::test(start_paused = true)]
    async fn stages_are_recorded_only_inside_a_scope_and_bounded() {
        record_stage("part", "product", "source", Instant::now(), None);
        let timeline = Timeline::new(TraceId::generate());
        let inner = Arc::clone(&timeline);
        timeline
            .clone()
            .scope(async move {
                let started = Instant::now();
                tokio::time::sleep(std::time::Duration::from_millis(12)).await;
                record_stage("dependency", "coupons", "timeout", started, Some(1));
                for _ in 0..100 {
                    record_stage("l2", "rate", "miss", Instant::now(), None);
                }
                assert!(Arc::ptr_eq(&Timeline::current().unwrap(), &inner));
            })
            .await;
        let stages = timeline.stages();
        assert_eq!(stages.len(), MAX_STAGES);
        assert_eq!(stages[0].name, "coupons");
        assert_eq!(stages[0].elapsed_ms, 12.0);
        assert_eq!(stages[0].attempt, Some(1));
    }
}
