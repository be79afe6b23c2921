//! Connection status and counters, for readiness and metrics.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use chrono::{DateTime, Utc};
use serde::Serialize;

/// Connection state as readiness sees it: not connected means invalidations are not arriving and
/// staleness is bounded only by the L1 TTL.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BusStatus {
    /// Connected, topology declared and both consumers running.
    pub connected: bool,
    /// When `connected` last changed (None before the first attempt finished).
    pub since: Option<DateTime<Utc>>,
    /// Successful connections after the first one.
    pub reconnects: u64,
    /// The latest connection or topology error, for operators.
    pub last_error: Option<String>,
    /// What the latest reconnect did about the events published while disconnected.
    pub last_catch_up: Option<CatchUp>,
}

/// How a reconnected instance accounted for the events it missed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CatchUp {
    /// When the connection came back.
    pub at: DateTime<Utc>,
    /// How long it had been lost.
    pub disconnected_ms: u64,
    /// `replayed`: the broker kept this instance's broadcast queue, and the `backlog` events
    /// waiting in it are delivered as usual. `dropped_l1`: the queue was gone or had reached its
    /// bound, so events may be lost, and the instance dropped its L1 instead (`reason`).
    pub outcome: CatchUpOutcome,
    /// Events waiting in the broadcast queue when it reconnected (None: the queue was gone).
    pub backlog: Option<u32>,
    pub reason: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CatchUpOutcome {
    Replayed,
    DroppedL1,
}

impl CatchUpOutcome {
    pub const fn as_str(self) -> &'static str {
        match self {
            CatchUpOutcome::Replayed => "replayed",
            CatchUpOutcome::DroppedL1 => "dropped_l1",
        }
    }
}

/// Monotonic counters since start; the dead-letter breakdown shows *why* events are dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct BusStats {
    /// Deliveries handed to the handler (redeliveries included).
    pub consumed: u64,
    /// Deliveries the handler accepted.
    pub acked: u64,
    /// Deliveries republished for another attempt.
    pub retried: u64,
    /// Deliveries sent to the dead-letter queue.
    pub dead_lettered: u64,
    /// `dead_lettered` split by reason code (`retries_exhausted` or the handler's reject code).
    pub dead_lettered_by_code: BTreeMap<String, u64>,
    /// Deliveries that ran out of attempts on an incomplete failure (their effect in place, a
    /// follow-up not): acknowledged, not dead-lettered, and not counted in `acked`.
    pub abandoned: u64,
    /// `abandoned` split by the handler's code (e.g. `l2_fence_unapplied`).
    pub abandoned_by_code: BTreeMap<String, u64>,
    /// Application publishes confirmed by the broker.
    pub publish_ok: u64,
    /// Application publishes that failed (disconnected, nacked, timed out).
    pub publish_failed: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) consumed: AtomicU64,
    pub(crate) acked: AtomicU64,
    pub(crate) retried: AtomicU64,
    pub(crate) dead_lettered: AtomicU64,
    dead_lettered_by_code: Mutex<BTreeMap<String, u64>>,
    abandoned: AtomicU64,
    abandoned_by_code: Mutex<BTreeMap<String, u64>>,
    pub(crate) publish_ok: AtomicU64,
    pub(crate) publish_failed: AtomicU64,
}

pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl Counters {
    pub(crate) fn record_dead_letter(&self, code: &str) {
        bump(&self.dead_lettered);
        let mut by_code = self
            .dead_lettered_by_code
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *by_code.entry(code.to_owned()).or_default() += 1;
    }

    pub(crate) fn record_abandoned(&self, code: &str) {
        bump(&self.abandoned);
        let mut by_code = self
            .abandoned_by_code
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *by_code.entry(code.to_owned()).or_default() += 1;
    }

    pub(crate) fn snapshot(&self) -> BusStats {
        let read = |map: &Mutex<BTreeMap<String, u64>>| {
            map.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone()
        };
        BusStats {
            consumed: self.consumed.load(Ordering::Relaxed),
            acked: self.acked.load(Ordering::Relaxed),
            retried: self.retried.load(Ordering::Relaxed),
            dead_lettered: self.dead_lettered.load(Ordering::Relaxed),
            dead_lettered_by_code: read(&self.dead_lettered_by_code),
            abandoned: self.abandoned.load(Ordering::Relaxed),
            abandoned_by_code: read(&self.abandoned_by_code),
            publish_ok: self.publish_ok.load(Ordering::Relaxed),
            publish_failed: self.publish_failed.load(Ordering::Relaxed),
        }
    }
}
