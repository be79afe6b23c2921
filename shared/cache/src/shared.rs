//! The contract of the shared (L2) tier that sits between every instance's L1 and the sources.
//!
//! The tier stores opaque bytes at a data version. Writes are *version-fenced* on the server: a
//! write carrying an older version than the stored one is refused, so a slow rebuild can never
//! put back a value that an invalidation or a newer rebuild already replaced. Per-key *leases*
//! let one instance in the whole fleet rebuild a key while the others wait for its value.
//!
//! Failure of the tier is never fatal to a request: callers treat every [`TierError`] as a miss.

use std::fmt::Debug;
use std::time::Duration;

use async_trait::async_trait;
use rebate_domain::{ItemKey, PartKind};

/// One part of one item in the shared tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TierKey {
    pub item: ItemKey,
    pub part: PartKind,
}

/// A stored value: its data version and the encoded envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierEntry {
    pub version: u64,
    pub bytes: Vec<u8>,
}

/// What a fenced write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceOutcome {
    /// Stored (the key was absent, or held the same or an older version).
    Written,
    /// Refused: the key holds a newer version, which is kept.
    Stale { current: u64 },
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum TierError {
    #[error("shared tier timed out after {0:?}")]
    Timeout(Duration),
    #[error("shared tier failed: {0}")]
    Backend(String),
}

#[async_trait]
pub trait SharedTier: Send + Sync + Debug + 'static {
    /// The entries of `keys`, in order, `None` where absent, in one round trip.
    async fn get_many(&self, keys: &[TierKey]) -> Result<Vec<Option<TierEntry>>, TierError>;

    /// Stores `entry` for `ttl` unless the key holds a newer version.
    async fn put_fenced(
        &self,
        key: TierKey,
        entry: &TierEntry,
        ttl: Duration,
    ) -> Result<FenceOutcome, TierError>;

    /// Writes an invalidation fence (a tombstone `entry`) for `ttl` unless the key holds its
    /// version or a newer one: an entry at the fence's version already holds the changed data
    /// (a rebuild that read the new row got there first), and covering it would only make every
    /// instance reload it. L1 keeps an equal version the same way.
    async fn put_fence(
        &self,
        key: TierKey,
        entry: &TierEntry,
        ttl: Duration,
    ) -> Result<FenceOutcome, TierError>;

    /// Takes the rebuild lease of `key` for `ttl` if nobody holds it. `token` identifies the
    /// holder so that only it can release the lease; an expired lease frees itself.
    async fn try_lease(&self, key: TierKey, token: u64, ttl: Duration) -> Result<bool, TierError>;

    /// Releases the lease if `token` still holds it (compare-and-delete).
    async fn release_lease(&self, key: TierKey, token: u64) -> Result<(), TierError>;

    /// Takes the rebuild lease of `key` (as [`SharedTier::try_lease`]) and then reads its entry:
    /// for a reader that expects a miss (it holds a fence no copy has reached yet). A rebuild
    /// that ended before the lease was taken shows in the entry, so a winner need not read
    /// again. A backend that can sends the two in one round trip; this default sends them one
    /// after the other, and gives the lease back when the read fails. A wrapper around another
    /// tier forwards it, or its callers pay the default's two round trips.
    async fn lease_and_read(
        &self,
        key: TierKey,
        token: u64,
        ttl: Duration,
    ) -> Result<(bool, Option<TierEntry>), TierError> {
        lease_then_read(self, key, token, ttl).await
    }

    /// A cheap round trip that proves the tier answers (readiness).
    async fn ping(&self) -> Result<(), TierError>;
}

/// [`SharedTier::lease_and_read`] as two round trips, the lease's and then the read's; the lease
/// goes back when the read fails. The trait's default, and what a backend that cannot send the
/// two together (Redis Cluster: the keys live in different slots) calls.
///
/// # Errors
/// The lease's or the read's error.
pub async fn lease_then_read<S: SharedTier + ?Sized>(
    tier: &S,
    key: TierKey,
    token: u64,
    ttl: Duration,
) -> Result<(bool, Option<TierEntry>), TierError> {
    let won = tier.try_lease(key, token, ttl).await?;
    match tier.get_many(&[key]).await {
        Ok(mut entries) => Ok((won, entries.pop().flatten())),
        Err(error) => {
            if won {
                // Best effort: it expires on its own otherwise.
                let _ = tier.release_lease(key, token).await;
            }
            Err(error)
        }
    }
}
