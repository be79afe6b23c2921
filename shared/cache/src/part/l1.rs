//! L1 and the single-flight map. L1 is a bounded moka map of envelopes that drops an entry once
//! its stale window ends on the injected clock. Every write to it is version-fenced: an older
//! value never replaces a newer one, so a rebuild that raced a change event cannot replace the
//! event's fence. The single-flight map holds the one load in flight per key, which every
//! concurrent caller joins.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard, PoisonError};
use std::time::Duration;

use moka::ops::compute::{CompResult, Op};
use moka::sync::Cache;
use rebate_domain::ItemKey;

use super::inner::Inner;
use super::load::SharedLoad;
use super::settings::PartCacheConfig;
use super::stats::bump;
use crate::clock::Clock;
use crate::envelope::{Envelope, TtlPolicy};

/// An empty L1 for `settings`, whose entries expire on `clock`.
pub(super) fn new_entries<T: Send + Sync + 'static>(
    settings: &PartCacheConfig,
    clock: &Arc<dyn Clock>,
) -> Cache<ItemKey, Arc<Envelope<T>>> {
    Cache::builder()
        .name(settings.name)
        .max_capacity(settings.max_entries)
        .expire_after(UntilStale {
            clock: Arc::clone(clock),
        })
        .build()
}

/// Tells moka to drop an entry once its stale window ends, measured on the injected clock at
/// insert time. Freshness itself is always re-checked against the clock on read.
struct UntilStale {
    clock: Arc<dyn Clock>,
}

impl<T> moka::Expiry<ItemKey, Arc<Envelope<T>>> for UntilStale {
    fn expire_after_create(
        &self,
        _key: &ItemKey,
        envelope: &Arc<Envelope<T>>,
        _created_at: std::time::Instant,
    ) -> Option<Duration> {
        let remaining = envelope.stale_until.millis_since(self.clock.now());
        Some(Duration::from_millis(remaining))
    }

    fn expire_after_update(
        &self,
        key: &ItemKey,
        envelope: &Arc<Envelope<T>>,
        updated_at: std::time::Instant,
        _current: Option<Duration>,
    ) -> Option<Duration> {
        self.expire_after_create(key, envelope, updated_at)
    }
}

/// The single-flight map.
impl<T> Inner<T>
where
    T: Send + Sync + 'static,
{
    /// Returns a fresh envelope when another caller's load completed meanwhile, else the one load
    /// in flight for `key`: joined, or made by `start` from the new load's id and registered.
    pub(super) fn join_or_start(
        &self,
        key: ItemKey,
        start: impl FnOnce(u64) -> SharedLoad<T>,
    ) -> Result<Arc<Envelope<T>>, SharedLoad<T>> {
        let mut in_flight = self.lock_in_flight();
        if let Some((_, load)) = in_flight.get(&key) {
            bump(&self.stats.loads_joined);
            return Err(load.clone());
        }
        // A load finishes by caching its value and *then* leaving `in_flight`, so a caller that
        // missed before the value landed and locks after the load left sees the value here.
        if let Some(envelope) = self.entries.get(&key)
            && envelope.is_fresh(self.clock.now())
        {
            return Ok(envelope);
        }
        bump(&self.stats.loads_started);
        let load_id = self.next_load_id.fetch_add(1, Ordering::Relaxed);
        let load = start(load_id);
        in_flight.insert(key, (load_id, load.clone()));
        Err(load)
    }

    /// Registers the load `start` makes unless one for `key` is in flight already. Returns
    /// whether it started one.
    pub(super) fn start_if_idle(
        &self,
        key: ItemKey,
        start: impl FnOnce(u64) -> SharedLoad<T>,
    ) -> bool {
        let mut in_flight = self.lock_in_flight();
        if in_flight.contains_key(&key) {
            return false;
        }
        bump(&self.stats.loads_started);
        let load_id = self.next_load_id.fetch_add(1, Ordering::Relaxed);
        let load = start(load_id);
        in_flight.insert(key, (load_id, load));
        true
    }

    /// Takes a finished load out of `in_flight`, unless it was detached (and maybe replaced by a
    /// newer load) meanwhile.
    pub(super) fn finish_load(&self, key: ItemKey, load_id: u64) {
        let mut in_flight = self.lock_in_flight();
        if in_flight.get(&key).is_some_and(|(id, _)| *id == load_id) {
            in_flight.remove(&key);
        }
    }

    /// Drops every L1 entry and detaches every load in flight.
    pub(super) fn clear(&self) {
        let mut in_flight = self.lock_in_flight();
        self.generation.fetch_add(1, Ordering::AcqRel);
        in_flight.clear();
        self.entries.invalidate_all();
    }

    /// Detaches the load in flight for `key` and puts `fence` in L1, unless L1 already holds the
    /// fence's version or newer (a copy, or the fence of an earlier event at that version): then
    /// nothing changes, and a load in flight stays joinable — it began after that copy or fence
    /// was in place, and a result below it would be refused anyway. So the same change announced
    /// twice (an operator's event and the binlog's) costs one load. Under the in-flight lock, so
    /// that a caller starting or joining a load sees either the state before the event or the
    /// fence.
    pub(super) fn hold_fence(&self, key: ItemKey, fence: &Envelope<T>) {
        let mut in_flight = self.lock_in_flight();
        if self
            .entries
            .get(&key)
            .is_some_and(|current| current.version >= fence.version)
        {
            return;
        }
        in_flight.remove(&key);
        let offered = Arc::new(fence.clone_fence());
        self.entries
            .entry(key)
            .and_compute_with(|existing| match existing {
                Some(current) if current.value().version >= fence.version => Op::Nop,
                _ => Op::Put(offered),
            });
    }

    /// A panic under the lock leaves the map consistent (each change is one insert or remove),
    /// so a poisoned lock is taken as it is.
    fn lock_in_flight(&self) -> MutexGuard<'_, HashMap<ItemKey, (u64, SharedLoad<T>)>> {
        self.in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// Version-fenced writes to L1.
impl<T> Inner<T>
where
    T: Send + Sync + 'static,
{
    /// Puts an L2 envelope into L1, never fresh for longer than L1's own (jittered) TTL as it
    /// stands now.
    pub(super) fn adopt_from_l2(&self, key: ItemKey, envelope: Envelope<T>) -> Arc<Envelope<T>> {
        let l1_policy = self.ttl_policies.load().l1;
        self.adopt_under(&l1_policy, key, envelope)
    }

    /// [`Self::adopt_from_l2`] under an L1 policy the caller read already (with the L2 policy it
    /// stamped the envelope with).
    pub(super) fn adopt_under(
        &self,
        policy: &TtlPolicy,
        key: ItemKey,
        mut envelope: Envelope<T>,
    ) -> Arc<Envelope<T>> {
        let now = self.clock.now();
        let l1_ttl = if envelope.is_not_found() {
            policy.sample_not_found(&mut rand::rng())
        } else {
            policy.sample_fresh(&mut rand::rng())
        };
        let l1_fresh_until =
            now.saturating_add_millis(u64::try_from(l1_ttl.as_millis()).unwrap_or(u64::MAX));
        envelope.fresh_until = envelope.fresh_until.min(l1_fresh_until);
        self.insert_fenced(key, envelope)
    }

    /// The version of the fence L1 holds for `key`, 0 when it holds none.
    pub(super) fn fence_version(&self, key: ItemKey) -> u64 {
        self.entries
            .get(&key)
            .filter(|envelope| envelope.tombstone)
            .map_or(0, |envelope| envelope.version)
    }

    /// Inserts unless L1 holds a newer version. Returns what the callers of this load get: the
    /// newer data L1 holds, or, when a fence refused the value, the value itself (those callers
    /// asked before the change; only later callers must not see it).
    pub(super) fn insert_fenced(&self, key: ItemKey, envelope: Envelope<T>) -> Arc<Envelope<T>> {
        let candidate = Arc::new(envelope);
        let offered = Arc::clone(&candidate);
        let result = self
            .entries
            .entry(key)
            .and_compute_with(|existing| match existing {
                Some(current) if current.value().version > offered.version => Op::Nop,
                _ => Op::Put(offered),
            });
        match result {
            CompResult::Unchanged(current) => {
                let current = current.into_value();
                if !current.tombstone {
                    bump(&self.stats.fenced_writes_refused);
                    return current;
                }
                if current.version - candidate.version > self.settings.max_version_gap {
                    return self.lift_fence(key, &current, candidate);
                }
                bump(&self.stats.fenced_writes_refused);
                uncached(candidate)
            }
            _ => candidate,
        }
    }

    /// Replaces a fence that is more than `max_version_gap` ahead of what the source has (an
    /// event with a mistyped version, say): the source will not reach it within the fence's
    /// life, and until then every read would load again. Logged once, when lifted.
    fn lift_fence(
        &self,
        key: ItemKey,
        fence: &Envelope<T>,
        loaded: Arc<Envelope<T>>,
    ) -> Arc<Envelope<T>> {
        let offered = Arc::clone(&loaded);
        let fence_version = fence.version;
        let result = self
            .entries
            .entry(key)
            .and_compute_with(|existing| match existing {
                // Only the fence seen: a newer event's fence, or data, stays.
                Some(current)
                    if current.value().tombstone && current.value().version == fence_version =>
                {
                    Op::Put(offered)
                }
                _ => Op::Nop,
            });
        match result {
            CompResult::ReplacedWith(_) => {
                bump(&self.stats.fences_lifted);
                tracing::warn!(
                    part = self.settings.name,
                    %key,
                    fence_version,
                    source_version = loaded.version,
                    max_version_gap = self.settings.max_version_gap,
                    "a change event's version is far ahead of the source's; its fence is lifted"
                );
                loaded
            }
            _ => uncached(loaded),
        }
    }
}

/// What the callers of a load get when a fence refused its value: the same data, fresh for no
/// one, so that nothing built from it is kept either (the engine keeps a quote's rendering only
/// while every part is fresh). It is what the source said — older than the fence because the
/// event ran ahead of the source — and the next caller loads again.
fn uncached<T>(refused: Arc<Envelope<T>>) -> Arc<Envelope<T>> {
    match Arc::try_unwrap(refused) {
        Ok(mut envelope) => {
            envelope.fresh_until = envelope.fetched_at;
            envelope.stale_until = envelope.fetched_at;
            Arc::new(envelope)
        }
        // Shared with nothing else by construction; keep it as it is rather than copy.
        Err(shared) => shared,
    }
}
