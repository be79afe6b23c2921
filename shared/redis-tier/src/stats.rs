//! Lock-free counters of what the tier did, for the status page, metrics and tests.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) round_trips: AtomicU64,
    pub(crate) gets: AtomicU64,
    pub(crate) hits: AtomicU64,
    pub(crate) misses: AtomicU64,
    pub(crate) corrupt: AtomicU64,
    pub(crate) fenced_writes: AtomicU64,
    pub(crate) stale_writes_refused: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) timeouts: AtomicU64,
}

impl Counters {
    pub(crate) fn add(counter: &AtomicU64, amount: u64) {
        counter.fetch_add(amount, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> RedisTierStats {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        RedisTierStats {
            round_trips: read(&self.round_trips),
            gets: read(&self.gets),
            hits: read(&self.hits),
            misses: read(&self.misses),
            corrupt: read(&self.corrupt),
            fenced_writes: read(&self.fenced_writes),
            stale_writes_refused: read(&self.stale_writes_refused),
            errors: read(&self.errors),
            timeouts: read(&self.timeouts),
        }
    }
}

/// Totals since the tier was connected. Each counter is read on its own, so a snapshot taken
/// under load may be off by the operations in flight.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RedisTierStats {
    /// Requests sent to Redis: one per pipeline (one per node for a cluster batch), script call
    /// or command made for a caller. Not counted: a `NOSCRIPT` reload, the client's own
    /// redirects, and slot-map refreshes, which run in the background.
    pub round_trips: u64,
    /// Keys looked up by `get_many` (a batch of 50 counts 50).
    pub gets: u64,
    /// Keys found with a valid entry.
    pub hits: u64,
    /// Keys absent or corrupt; `hits + misses == gets` for batches that did not fail.
    pub misses: u64,
    /// Stored values that did not decode and were treated as absent (also counted as misses).
    pub corrupt: u64,
    /// Fenced writes that stored their value.
    pub fenced_writes: u64,
    /// Fenced writes refused because the key held a newer version.
    pub stale_writes_refused: u64,
    /// Operations that failed with [`rebate_cache::TierError::Backend`].
    pub errors: u64,
    /// Operations that failed with [`rebate_cache::TierError::Timeout`].
    pub timeouts: u64,
}
