//! [`MemoryTier`]: an in-process [`SharedTier`] with the same fencing and lease semantics as the
//! Redis tier. For unit tests of the cache and engine (several "instances" in one process share
//! one), and for benchmarks; the integration tests use real Redis.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::shared::{FenceOutcome, SharedTier, TierEntry, TierError, TierKey};

#[derive(Debug, Default)]
pub struct MemoryTier {
    entries: Mutex<HashMap<TierKey, (TierEntry, Instant)>>,
    leases: Mutex<HashMap<TierKey, (u64, Instant)>>,
    failing: AtomicBool,
    round_trips: AtomicU64,
}

impl MemoryTier {
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes every call fail, as an unreachable Redis would.
    pub fn set_failing(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }

    /// Calls made so far; one per trait method call, like one Redis round trip.
    pub fn round_trips(&self) -> u64 {
        self.round_trips.load(Ordering::SeqCst)
    }

    pub fn version_of(&self, key: TierKey) -> Option<u64> {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries.get(&key).map(|(entry, _)| entry.version)
    }

    /// Stores `entry` unless a live entry's version and the incoming one satisfy `refuse`.
    fn put_unless(
        &self,
        key: TierKey,
        entry: &TierEntry,
        ttl: Duration,
        refuse: impl Fn(u64, u64) -> bool,
    ) -> Result<FenceOutcome, TierError> {
        self.begin()?;
        let now = Instant::now();
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((current, expires)) = entries.get(&key)
            && *expires > now
            && refuse(current.version, entry.version)
        {
            return Ok(FenceOutcome::Stale {
                current: current.version,
            });
        }
        entries.insert(key, (entry.clone(), now + ttl));
        Ok(FenceOutcome::Written)
    }

    /// The unexpired entry of `key`.
    fn entry(&self, key: TierKey) -> Option<TierEntry> {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries
            .get(&key)
            .filter(|(_, expires)| *expires > Instant::now())
            .map(|(entry, _)| entry.clone())
    }

    /// Takes `key`'s lease for `token` unless an unexpired one is held.
    fn take_lease(&self, key: TierKey, token: u64, ttl: Duration) -> bool {
        let now = Instant::now();
        let mut leases = self.leases.lock().unwrap_or_else(PoisonError::into_inner);
        match leases.get(&key) {
            Some((_, expires)) if *expires > now => false,
            _ => {
                leases.insert(key, (token, now + ttl));
                true
            }
        }
    }

    fn begin(&self) -> Result<(), TierError> {
        self.round_trips.fetch_add(1, Ordering::SeqCst);
        if self.failing.load(Ordering::SeqCst) {
            return Err(TierError::Backend("memory tier set to fail".to_owned()));
        }
        Ok(())
    }
}

#[async_trait]
impl SharedTier for MemoryTier {
    async fn get_many(&self, keys: &[TierKey]) -> Result<Vec<Option<TierEntry>>, TierError> {
        self.begin()?;
        Ok(keys.iter().map(|&key| self.entry(key)).collect())
    }

    async fn put_fenced(
        &self,
        key: TierKey,
        entry: &TierEntry,
        ttl: Duration,
    ) -> Result<FenceOutcome, TierError> {
        self.put_unless(key, entry, ttl, |current, incoming| current > incoming)
    }

    async fn put_fence(
        &self,
        key: TierKey,
        entry: &TierEntry,
        ttl: Duration,
    ) -> Result<FenceOutcome, TierError> {
        self.put_unless(key, entry, ttl, |current, incoming| current >= incoming)
    }

    async fn try_lease(&self, key: TierKey, token: u64, ttl: Duration) -> Result<bool, TierError> {
        self.begin()?;
        Ok(self.take_lease(key, token, ttl))
    }

    async fn release_lease(&self, key: TierKey, token: u64) -> Result<(), TierError> {
        self.begin()?;
        let mut leases = self.leases.lock().unwrap_or_else(PoisonError::into_inner);
        if leases.get(&key).is_some_and(|(holder, _)| *holder == token) {
            leases.remove(&key);
        }
        Ok(())
    }

    /// One round trip, as on a single Redis server.
    async fn lease_and_read(
        &self,
        key: TierKey,
        token: u64,
        ttl: Duration,
    ) -> Result<(bool, Option<TierEntry>), TierError> {
        self.begin()?;
        let won = self.take_lease(key, token, ttl);
        Ok((won, self.entry(key)))
    }

    async fn ping(&self) -> Result<(), TierError> {
        self.begin()
    }
}
