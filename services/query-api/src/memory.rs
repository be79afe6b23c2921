//! What the process's memory holds: the allocator's own counters and the resident set.
//!
//! The service allocates through jemalloc (the `jemalloc` feature, on by default): it returns
//! freed pages to the system on a decay timer instead of keeping them in per-thread arenas, and
//! its counters tell live data (`allocated`) from pages it holds for reuse (`active`,
//! `resident`). A resident set that grows while `allocated` stays flat is fragmentation or
//! retention, not a leak; one that grows with `allocated` is data something keeps. Without the
//! feature only the resident set is reported.

use serde::Serialize;

#[cfg(feature = "jemalloc")]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// One reading of the process's memory. Every field is in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct MemoryStats {
    /// `"jemalloc"`, or `"system"` when built without the `jemalloc` feature.
    pub allocator: &'static str,
    /// The resident set as the kernel counts it (`VmRSS`); `None` off Linux.
    pub rss_bytes: Option<u64>,
    /// Allocator counters; `None` for the system allocator, which keeps none worth reading.
    #[serde(flatten)]
    pub heap: Option<HeapStats>,
}

/// jemalloc's view of the heap (`stats.*` after an epoch advance).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct HeapStats {
    /// Bytes the program holds: live allocations.
    pub allocated_bytes: u64,
    /// Bytes in pages that hold at least one live allocation (≥ allocated).
    pub active_bytes: u64,
    /// Bytes of allocator pages that are resident, metadata included (≈ the heap's share of RSS).
    pub resident_bytes: u64,
    /// Bytes of the allocator's own bookkeeping.
    pub metadata_bytes: u64,
    /// Bytes mapped but released to the system (not resident), kept for reuse of address space.
    pub retained_bytes: u64,
}

impl MemoryStats {
    /// Reads the counters now. Cheap enough for a scrape (an epoch advance is one mutex).
    pub fn read() -> Self {
        Self {
            allocator: if cfg!(feature = "jemalloc") {
                "jemalloc"
            } else {
                "system"
            },
            rss_bytes: resident_set_bytes(),
            heap: heap_stats(),
        }
    }
}

#[cfg(feature = "jemalloc")]
fn heap_stats() -> Option<HeapStats> {
    use tikv_jemalloc_ctl::{epoch, stats};
    // The counters are cached per epoch; advancing refreshes them.
    epoch::advance().ok()?;
    Some(HeapStats {
        allocated_bytes: stats::allocated::read().ok()? as u64,
        active_bytes: stats::active::read().ok()? as u64,
        resident_bytes: stats::resident::read().ok()? as u64,
        metadata_bytes: stats::metadata::read().ok()? as u64,
        retained_bytes: stats::retained::read().ok()? as u64,
    })
}

#[cfg(not(feature = "jemalloc"))]
fn heap_stats() -> Option<HeapStats> {
    None
}

/// `VmRSS` from `/proc/self/status` (the kernel states it in kB, so no page size is needed).
fn resident_set_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_counters_describe_this_process() {
        let kept: Vec<u8> = vec![7; 8 << 20];
        let stats = MemoryStats::read();
        assert!(stats.rss_bytes.is_some_and(|rss| rss > 0));
        if cfg!(feature = "jemalloc") {
            let heap = stats.heap.expect("jemalloc keeps counters");
            assert!(heap.allocated_bytes >= kept.len() as u64);
            assert!(heap.active_bytes >= heap.allocated_bytes);
            assert!(heap.resident_bytes >= heap.active_bytes);
        } else {
            assert!(stats.heap.is_none());
        }
        drop(kept);
    }
}
