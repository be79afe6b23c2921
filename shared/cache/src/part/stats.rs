//! The counters of one part cache, and their snapshot for metrics and the admin API.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// Counters of one part cache. Relaxed atomics: they are statistics, not synchronisation.
#[derive(Debug, Default)]
pub struct CacheStats {
    pub(super) hits: AtomicU64,
    pub(super) misses: AtomicU64,
    pub(super) loads_started: AtomicU64,
    pub(super) loads_joined: AtomicU64,
    pub(super) load_failures: AtomicU64,
    pub(super) stale_served: AtomicU64,
    pub(super) not_found_cached: AtomicU64,
    pub(super) l2_hits: AtomicU64,
    pub(super) l2_misses: AtomicU64,
    pub(super) l2_errors: AtomicU64,
    pub(super) source_loads: AtomicU64,
    pub(super) leases_won: AtomicU64,
    pub(super) leases_lost: AtomicU64,
    pub(super) lease_waits_served: AtomicU64,
    pub(super) lease_waits_given_up: AtomicU64,
    pub(super) lease_losses_served_stale: AtomicU64,
    pub(super) fenced_writes_refused: AtomicU64,
    pub(super) fences_lifted: AtomicU64,
    pub(super) invalidations: AtomicU64,
    pub(super) refreshes: AtomicU64,
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
    /// Lost leases whose wait ended with the winner's value (for the caller or, after a stale
    /// answer, for the next reader).
    pub lease_waits_served: u64,
    /// Lost leases whose wait ended without the winner's value.
    pub lease_waits_given_up: u64,
    /// Lost leases answered at once with a stale copy while the winner rebuilt.
    pub lease_losses_served_stale: u64,
    pub fenced_writes_refused: u64,
    /// L1 fences lifted because a load found the source more than `max_version_gap` behind.
    pub fences_lifted: u64,
    pub invalidations: u64,
    /// Refreshes started ahead of an entry's expiry (each is also one of `loads_started`).
    pub refreshes: u64,
    pub entries: u64,
}

impl CacheStats {
    /// The counters as they stand, with L1's entry count, which only the cache knows.
    pub(super) fn snapshot(&self, entries: u64) -> CacheStatsSnapshot {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        CacheStatsSnapshot {
            hits: read(&self.hits),
            misses: read(&self.misses),
            loads_started: read(&self.loads_started),
            loads_joined: read(&self.loads_joined),
            load_failures: read(&self.load_failures),
            stale_served: read(&self.stale_served),
            not_found_cached: read(&self.not_found_cached),
            l2_hits: read(&self.l2_hits),
            l2_misses: read(&self.l2_misses),
            l2_errors: read(&self.l2_errors),
            source_loads: read(&self.source_loads),
            leases_won: read(&self.leases_won),
            leases_lost: read(&self.leases_lost),
            lease_waits_served: read(&self.lease_waits_served),
            lease_waits_given_up: read(&self.lease_waits_given_up),
            lease_losses_served_stale: read(&self.lease_losses_served_stale),
            fenced_writes_refused: read(&self.fenced_writes_refused),
            fences_lifted: read(&self.fences_lifted),
            invalidations: read(&self.invalidations),
            refreshes: read(&self.refreshes),
            entries,
        }
    }
}

pub(super) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}
