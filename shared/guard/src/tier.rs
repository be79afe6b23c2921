//! [`GuardedTier`]: the L2 tier behind Redis's [`DependencyGuard`].

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rebate_cache::{FenceOutcome, LoadFailure, SharedTier, TierEntry, TierError, TierKey};

use crate::dependency::{AttemptFailure, DependencyGuard};

/// The shared L2 tier behind the Redis dependency's guard: while its breaker is open, cache
/// reads and leases skip L2 at once (straight to the source) instead of paying a command timeout
/// per miss. Writes — version-fenced values and invalidation tombstones — and lease releases go to
/// the tier directly: they are off the request path, and an invalidation fence must reach Redis
/// whenever Redis answers, whatever the breaker last saw.
#[derive(Debug)]
pub struct GuardedTier {
    tier: Arc<dyn SharedTier>,
    guard: Arc<DependencyGuard>,
}

impl GuardedTier {
    pub fn new(tier: Arc<dyn SharedTier>, guard: Arc<DependencyGuard>) -> Self {
        Self { tier, guard }
    }

    async fn guarded<T, Fut>(&self, call: impl FnMut() -> Fut) -> Result<T, TierError>
    where
        Fut: Future<Output = Result<T, TierError>>,
    {
        let mut call = call;
        self.guard
            .call(|| {
                let future = call();
                async move {
                    future.await.map_err(|error| {
                        AttemptFailure::permanent(match &error {
                            TierError::Timeout(_) => LoadFailure::timeout(error.to_string()),
                            TierError::Backend(_) => LoadFailure::error(error.to_string()),
                        })
                    })
                }
            })
            .await
            // The tier treats every error alike (skip L2); the detail keeps what happened.
            .map_err(|failure| TierError::Backend(failure.detail.to_string()))
    }
}

#[async_trait]
impl SharedTier for GuardedTier {
    async fn get_many(&self, keys: &[TierKey]) -> Result<Vec<Option<TierEntry>>, TierError> {
        self.guarded(|| self.tier.get_many(keys)).await
    }

    async fn put_fenced(
        &self,
        key: TierKey,
        entry: &TierEntry,
        ttl: Duration,
    ) -> Result<FenceOutcome, TierError> {
        self.tier.put_fenced(key, entry, ttl).await
    }

    async fn put_fence(
        &self,
        key: TierKey,
        entry: &TierEntry,
        ttl: Duration,
    ) -> Result<FenceOutcome, TierError> {
        self.tier.put_fence(key, entry, ttl).await
    }

    async fn try_lease(&self, key: TierKey, token: u64, ttl: Duration) -> Result<bool, TierError> {
        self.guarded(|| self.tier.try_lease(key, token, ttl)).await
    }

    async fn release_lease(&self, key: TierKey, token: u64) -> Result<(), TierError> {
        self.tier.release_lease(key, token).await
    }

    /// Forwarded whole: the trait's default would split it into two guarded round trips.
    async fn lease_and_read(
        &self,
        key: TierKey,
        token: u64,
        ttl: Duration,
    ) -> Result<(bool, Option<TierEntry>), TierError> {
        self.guarded(|| self.tier.lease_and_read(key, token, ttl))
            .await
    }

    /// Readiness asks the tier itself, whatever the breaker thinks.
    async fn ping(&self) -> Result<(), TierError> {
        self.tier.ping().await
    }
}
