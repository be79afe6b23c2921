//! Making duplicates and out-of-order events harmless, cheaply.
//!
//! Brokers deliver at least once and do not order across redeliveries. Both helpers here only
//! *save work*; correctness does not rest on them. The real fence is in the cache tiers, which
//! compare data versions on write, so an event that slips past (after eviction, on another
//! instance, after a restart) causes at most one redundant drop and re-warm.

use std::fmt;
use std::time::Duration;

use moka::sync::Cache;
use rebate_domain::{ItemKey, PartKind};

use crate::event::EventId;

/// Remembers recently seen event ids, bounded in count and age.
#[derive(Clone)]
pub struct Deduplicator {
    seen: Cache<EventId, ()>,
}

impl Deduplicator {
    /// Remembers at most `max_entries` ids, each for `ttl` (longer than the broker's redelivery
    /// horizon, e.g. 10 minutes).
    pub fn new(max_entries: u64, ttl: Duration) -> Self {
        Self {
            seen: Cache::builder()
                .max_capacity(max_entries)
                .time_to_live(ttl)
                .build(),
        }
    }

    /// True the first time an id is seen (and records it atomically), false for repeats.
    ///
    /// Call it before doing the work; if the work then fails and must be retried by the broker,
    /// call [`Deduplicator::forget`] so that the redelivery is not skipped.
    pub fn first_time(&self, event_id: &EventId) -> bool {
        self.seen.entry_by_ref(event_id).or_insert(()).is_fresh()
    }

    /// Forgets an id, so that its redelivery is processed again.
    pub fn forget(&self, event_id: &EventId) {
        self.seen.invalidate(event_id);
    }
}

impl fmt::Debug for Deduplicator {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("Deduplicator")
            .field("entries", &self.seen.entry_count())
            .finish()
    }
}

/// Remembers the highest data version applied per (item, part), bounded in count and age, so
/// that an event older than one already applied is skipped.
#[derive(Clone)]
pub struct VersionGate {
    highest: Cache<(ItemKey, PartKind), u64>,
}

impl VersionGate {
    pub fn new(max_entries: u64, ttl: Duration) -> Self {
        Self {
            highest: Cache::builder()
                .max_capacity(max_entries)
                .time_to_live(ttl)
                .build(),
        }
    }

    /// True unless a version at least as high was already observed for this item and part.
    /// Equal versions count as already applied.
    pub fn is_newer(&self, key: ItemKey, part: PartKind, version: u64) -> bool {
        self.highest
            .get(&(key, part))
            .is_none_or(|highest| version > highest)
    }

    /// Records that `version` was applied; call it after the work succeeded. Never lowers the
    /// recorded version, so concurrent or late calls are safe.
    pub fn observe(&self, key: ItemKey, part: PartKind, version: u64) {
        self.highest
            .entry((key, part))
            .and_upsert_with(|existing| match existing {
                Some(entry) => version.max(entry.into_value()),
                None => version,
            });
    }
}

impl fmt::Debug for VersionGate {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("VersionGate")
            .field("entries", &self.highest.entry_count())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rebate_domain::{ItemId, Platform};

    #[test]
    fn deduplicator_reports_first_sighting_only() {
        let dedupe = Deduplicator::new(1_000, Duration::from_secs(600));
        let first = EventId::parse("event-1").unwrap();
        let second = EventId::parse("event-2").unwrap();
        assert!(dedupe.first_time(&first));
        assert!(!dedupe.first_time(&first));
        assert!(dedupe.first_time(&second));
        dedupe.forget(&first);
        assert!(dedupe.first_time(&first));
    }

    #[test]
    fn version_gate_ignores_older_and_equal_versions() {
        let gate = VersionGate::new(1_000, Duration::from_secs(600));
        let key = ItemKey::new(Platform::Jd, ItemId::from_u64(7));
        let other = ItemKey::new(Platform::Pdd, ItemId::from_u64(7));
        assert!(gate.is_newer(key, PartKind::Rate, 1));
        gate.observe(key, PartKind::Rate, 5);
        assert!(!gate.is_newer(key, PartKind::Rate, 4));
        assert!(!gate.is_newer(key, PartKind::Rate, 5));
        assert!(gate.is_newer(key, PartKind::Rate, 6));
        // Other parts and other platforms are tracked separately.
        assert!(gate.is_newer(key, PartKind::Product, 1));
        assert!(gate.is_newer(other, PartKind::Rate, 1));
        // A late observation of an older version does not lower the record.
        gate.observe(key, PartKind::Rate, 3);
        assert!(!gate.is_newer(key, PartKind::Rate, 5));
    }
}
