//! [`Inner`]: the state a [`PartCache`](crate::PartCache) shares with the loads it spawns, and
//! the call to the source that every path of a load ends in.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use moka::sync::Cache;
use rebate_domain::ItemKey;

use super::load::{LoadFailure, Loaded, Loader, SharedLoad};
use super::settings::{L2Config, PartCacheConfig};
use super::stats::{CacheStats, bump};
use crate::clock::Clock;
use crate::envelope::{Envelope, TtlPolicy};

/// What a `PartCache` and the loads it spawns share: loads outlive their callers, so they hold it
/// through an `Arc`. `l1.rs` adds the L1 and single-flight methods, `lease.rs` the L2 path and
/// `mod.rs` the load task itself.
pub(super) struct Inner<T> {
    pub(super) settings: PartCacheConfig,
    pub(super) l2: Option<L2Config>,
    pub(super) entries: Cache<ItemKey, Arc<Envelope<T>>>,
    /// Loads in flight, one per key, each with its id so that a load only ever removes its own
    /// entry. Only touched on a miss or an invalidation, never held across `.await`.
    pub(super) in_flight: Mutex<HashMap<ItemKey, (u64, SharedLoad<T>)>>,
    pub(super) next_load_id: AtomicU64,
    pub(super) loader: Arc<dyn Loader<T>>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) stats: CacheStats,
}

impl<T: 'static> Inner<T> {
    /// One call to the loader, cut off at the part's load timeout.
    pub(super) async fn load_from_source(&self, key: ItemKey) -> Result<Loaded<T>, LoadFailure> {
        bump(&self.stats.source_loads);
        let timeout = self.settings.load_timeout;
        match tokio::time::timeout(timeout, self.loader.load(key)).await {
            Ok(result) => result,
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
