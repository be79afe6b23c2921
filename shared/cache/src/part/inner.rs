//! [`Inner`]: the state a [`PartCache`](crate::PartCache) shares with the loads it spawns, and
//! the call to the source that every path of a load ends in.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use moka::sync::Cache;
use rebate_domain::ItemKey;

use super::load::{LoadFailure, Loaded, Loader, SharedLoad};
use super::settings::{L2Config, PartCacheConfig, TtlPolicies};
use super::stats::{CacheStats, bump};
use crate::clock::Clock;
use crate::envelope::{Envelope, TtlPolicy};
use crate::refresh::RefreshLead;

/// What a `PartCache` and the loads it spawns share: loads outlive their callers, so they hold it
/// through an `Arc`. `l1.rs` adds the L1 and single-flight methods, `lease.rs` the L2 path and
/// `mod.rs` the load task itself.
pub(super) struct Inner<T> {
    /// As built. Its `ttl` and `refresh_lead`, and `l2`'s `ttl`, are only where `ttl_policies`
    /// and `refresh_lead` started: read those, which change at runtime.
    pub(super) settings: PartCacheConfig,
    pub(super) l2: Option<L2Config>,
    /// Both tiers' lifetimes, replaced whole by `PartCache::set_ttl`. Read once per load (and
    /// once per L2 copy taken into L1), never on a hit: a hit judges the expiry its entry was
    /// stamped with.
    pub(super) ttl_policies: ArcSwap<TtlPolicies>,
    /// Read on every fresh hit: one relaxed atomic load.
    pub(super) refresh_lead: RefreshLead,
    pub(super) entries: Cache<ItemKey, Arc<Envelope<T>>>,
    /// Loads in flight, one per key, each with its id so that a load only ever removes its own
    /// entry. Only touched on a miss or an invalidation, never held across `.await`.
    pub(super) in_flight: Mutex<HashMap<ItemKey, (u64, SharedLoad<T>)>>,
    pub(super) next_load_id: AtomicU64,
    pub(super) loader: Arc<dyn Loader<T>>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) stats: CacheStats,
    /// How long this part's source loads take lately, and L2's round trips: what a lease
    /// loser's wait is sized from.
    pub(super) recent_loads: RecentTimes,
    pub(super) recent_l2_trips: RecentTimes,
    /// How long lease losers here waited until the winner's value arrived (waits that ran out
    /// are not times of a rebuild): the rebuild as a loser sees it, scheduling and queues
    /// included.
    pub(super) recent_winner_waits: RecentTimes,
    /// L2 copies fetched before this instant (milliseconds since the epoch; 0: none) are
    /// ignored, as absent: set by a fleet-wide resync, after which no copy from before it can be
    /// proven current. One relaxed load per L2 copy read, never on an L1 hit.
    pub(super) l2_floor_ms: AtomicU64,
    /// Bumped by every `forget_all`: a load that began before it does not leave its copy in
    /// L1 (it may have read what the instance was told to forget).
    pub(super) generation: AtomicU64,
}

/// How long something took lately, estimated as TCP estimates its retransmission timeout
/// (RFC 6298): a smoothed time and its mean deviation, so that [`RecentTimes::bound`] is above
/// nearly every recent time, and grows with them when the machine or the source slows down.
/// Successful calls only: a timeout says nothing of how long an answer takes.
#[derive(Debug, Default)]
pub(super) struct RecentTimes {
    /// Microseconds; 0 until the first sample.
    smoothed_micros: AtomicU64,
    deviation_micros: AtomicU64,
}

impl RecentTimes {
    pub(super) fn record(&self, took: Duration) {
        let sample = u64::try_from(took.as_micros()).unwrap_or(u64::MAX).max(1);
        // Racing updates may drop a sample: it is a statistic, not an account.
        let smoothed = self.smoothed_micros.load(Ordering::Relaxed);
        let (smoothed, deviation) = if smoothed == 0 {
            (sample, sample / 2)
        } else {
            let deviation = self.deviation_micros.load(Ordering::Relaxed);
            (
                smoothed - smoothed / 8 + sample / 8,
                deviation - deviation / 4 + smoothed.abs_diff(sample) / 4,
            )
        };
        self.smoothed_micros
            .store(smoothed.max(1), Ordering::Relaxed);
        self.deviation_micros.store(deviation, Ordering::Relaxed);
    }

    /// The smoothed time: what a call typically takes lately; `None` before the first sample.
    pub(super) fn typical(&self) -> Option<Duration> {
        match self.smoothed_micros.load(Ordering::Relaxed) {
            0 => None,
            smoothed => Some(Duration::from_micros(smoothed)),
        }
    }

    /// The smoothed time plus four deviations; `None` before the first sample.
    pub(super) fn bound(&self) -> Option<Duration> {
        match self.smoothed_micros.load(Ordering::Relaxed) {
            0 => None,
            smoothed => {
                let deviation = self.deviation_micros.load(Ordering::Relaxed);
                Some(Duration::from_micros(
                    smoothed.saturating_add(deviation.saturating_mul(4)),
                ))
            }
        }
    }
}

impl<T: 'static> Inner<T> {
    /// Whether an L2 copy fetched at `fetched_at` predates the last resync (see
    /// [`PartCache::set_l2_floor`](crate::PartCache::set_l2_floor)) and must be ignored.
    pub(super) fn below_l2_floor(&self, fetched_at: rebate_domain::Timestamp) -> bool {
        let floor = self.l2_floor_ms.load(Ordering::Relaxed);
        floor > 0 && u64::try_from(fetched_at.as_millis()).unwrap_or(0) < floor
    }

    /// One call to the loader, cut off at the part's load timeout.
    pub(super) async fn load_from_source(&self, key: ItemKey) -> Result<Loaded<T>, LoadFailure> {
        bump(&self.stats.source_loads);
        let timeout = self.settings.load_timeout;
        let started = tokio::time::Instant::now();
        match tokio::time::timeout(timeout, self.loader.load(key)).await {
            Ok(result) => {
                if result.is_ok() {
                    self.recent_loads.record(started.elapsed());
                }
                result
            }
            Err(_elapsed) => Err(LoadFailure::timeout(format!(
                "{} source gave no answer within {} ms",
                self.settings.name,
                timeout.as_millis()
            ))),
        }
    }

    /// A fresh envelope for a loaded value under `policy`.
    pub(super) fn stamp(&self, policy: &TtlPolicy, loaded: Loaded<T>) -> Envelope<T> {
        policy.envelope(
            loaded.value,
            loaded.version,
            self.clock.now(),
            &mut rand::rng(),
        )
    }
}
