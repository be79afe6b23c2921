//! [`PartView`]: a part cache with its value type erased, for the callers that treat the four
//! parts alike (a batch's L2 prefetch, invalidation, statistics, inspection, consistency checks).
//! The typed [`PartCache::get`] stays the read path; this is everything around it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rebate_domain::{ItemKey, PartKind, Timestamp};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::PartCache;
use super::stats::CacheStatsSnapshot;
use crate::envelope::{EntryMeta, Envelope, PolicyError, TtlPolicy};
use crate::shared::{SharedTier, TierEntry, TierError, TierKey};

/// What L2 holds for one key of one part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L2Entry {
    Absent,
    /// Bytes this build cannot decode as the part's envelope.
    Undecodable,
    Present(EntryMeta),
}

/// The operations on a part cache that do not need its value type.
#[async_trait]
pub trait PartView: Send + Sync + fmt::Debug {
    fn part(&self) -> PartKind;
    fn stats(&self) -> CacheStatsSnapshot;
    fn shared_tier(&self) -> Option<&Arc<dyn SharedTier>>;
    /// See [`PartCache::needs_load`].
    fn needs_load(&self, key: &ItemKey) -> bool;
    /// See [`PartCache::absorb`].
    fn absorb(&self, key: ItemKey, entry: &TierEntry) -> bool;
    /// See [`PartCache::forget_all`].
    fn forget_all(&self);
    /// See [`PartCache::refresh_ahead`].
    fn refresh_ahead(&self, key: ItemKey, horizon: Timestamp) -> bool;
    /// See [`PartCache::set_ttl`].
    fn set_ttl(&self, l1: TtlPolicy, l2: Option<TtlPolicy>) -> Result<(), PolicyError>;
    /// See [`PartCache::set_refresh_lead`].
    fn set_refresh_lead(&self, lead: Duration);
    /// See [`PartCache::set_l2_floor`].
    fn set_l2_floor(&self, floor: Timestamp);
    /// What L1 holds for `key`, fresh or not, without loading.
    fn l1_entry(&self, key: &ItemKey) -> Option<EntryMeta>;
    /// See [`PartCache::sample_keys`].
    fn sample_keys(&self, wanted: usize, visit: usize) -> Vec<ItemKey>;
    /// What L2 holds for `key` (one round trip), `Absent` without a shared tier.
    async fn l2_entry(&self, key: ItemKey) -> Result<L2Entry, TierError>;
    /// See [`PartCache::invalidate_to`].
    async fn invalidate_to(
        &self,
        key: ItemKey,
        version: u64,
        fence_for: Duration,
        through_l2: bool,
    ) -> Result<(), TierError>;
}

#[async_trait]
impl<T> PartView for PartCache<T>
where
    T: Serialize + DeserializeOwned + Send + Sync + 'static,
{
    fn part(&self) -> PartKind {
        PartCache::part(self)
    }

    fn stats(&self) -> CacheStatsSnapshot {
        PartCache::stats(self)
    }

    fn shared_tier(&self) -> Option<&Arc<dyn SharedTier>> {
        PartCache::shared_tier(self)
    }

    fn needs_load(&self, key: &ItemKey) -> bool {
        PartCache::needs_load(self, key)
    }

    fn absorb(&self, key: ItemKey, entry: &TierEntry) -> bool {
        PartCache::absorb(self, key, entry)
    }

    fn forget_all(&self) {
        PartCache::forget_all(self);
    }

    fn refresh_ahead(&self, key: ItemKey, horizon: Timestamp) -> bool {
        PartCache::refresh_ahead(self, key, horizon)
    }

    fn set_ttl(&self, l1: TtlPolicy, l2: Option<TtlPolicy>) -> Result<(), PolicyError> {
        PartCache::set_ttl(self, l1, l2)
    }

    fn set_refresh_lead(&self, lead: Duration) {
        PartCache::set_refresh_lead(self, lead);
    }

    fn set_l2_floor(&self, floor: Timestamp) {
        PartCache::set_l2_floor(self, floor);
    }

    fn l1_entry(&self, key: &ItemKey) -> Option<EntryMeta> {
        self.peek(key).map(|envelope| envelope.meta())
    }

    fn sample_keys(&self, wanted: usize, visit: usize) -> Vec<ItemKey> {
        PartCache::sample_keys(self, wanted, visit)
    }

    async fn l2_entry(&self, key: ItemKey) -> Result<L2Entry, TierError> {
        let Some(tier) = PartCache::shared_tier(self) else {
            return Ok(L2Entry::Absent);
        };
        let tier_key = TierKey {
            item: key,
            part: PartCache::part(self),
        };
        let entry = tier
            .get_many(&[tier_key])
            .await?
            .into_iter()
            .next()
            .flatten();
        Ok(match entry {
            None => L2Entry::Absent,
            Some(entry) => match Envelope::<T>::decode(&entry.bytes) {
                // What the part would do with it: a copy from before the last resync is absent.
                Ok(envelope) if self.inner.below_l2_floor(envelope.fetched_at) => L2Entry::Absent,
                Ok(envelope) => L2Entry::Present(envelope.meta()),
                Err(_) => L2Entry::Undecodable,
            },
        })
    }

    async fn invalidate_to(
        &self,
        key: ItemKey,
        version: u64,
        fence_for: Duration,
        through_l2: bool,
    ) -> Result<(), TierError> {
        PartCache::invalidate_to(self, key, version, fence_for, through_l2).await
    }
}
