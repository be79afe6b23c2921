//! How one part's cache is built: its L1 ([`PartCacheConfig`]) and, in the production profile,
//! the shared tier under it ([`L2Config`]); and the lifetimes of both tiers as they stand now
//! ([`TtlPolicies`]), which replace the built ones at runtime.

use std::sync::Arc;
use std::time::Duration;

use rebate_domain::PartKind;

use crate::envelope::TtlPolicy;
use crate::shared::SharedTier;

/// Construction settings of one part's cache.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PartCacheConfig {
    pub name: &'static str,
    pub part: PartKind,
    pub max_entries: u64,
    /// L1 lifetimes. With an L2 tier, an L1 copy is never fresh longer than the L2 entry.
    /// The starting value: [`PartCache::set_ttl`](crate::PartCache::set_ttl) replaces it.
    pub ttl: TtlPolicy,
    /// Upper bound for one load, whatever the callers' budgets: loads run on after their callers
    /// give up, and must not pile up behind a hung source.
    pub load_timeout: Duration,
    /// Refresh ahead ([`crate::refresh`]): a read this long before an entry stops being fresh
    /// reloads it in the background with probability 1/e, sooner ones less likely, so a key
    /// read often is reloaded before it expires. Zero turns it off. The starting value:
    /// [`PartCache::set_refresh_lead`](crate::PartCache::set_refresh_lead) replaces it.
    pub refresh_lead: Duration,
    /// A fence more than this many versions ahead of what a load found is taken for a mistyped
    /// event and lifted (logged and counted): the source would not reach it while it stands,
    /// and every read would load again. Within it, the fence stands: the event may have come
    /// just before the row, and nothing older may be cached meanwhile.
    pub max_version_gap: u64,
}

/// The shared tier under one part's L1, and how this part uses it.
#[derive(Debug, Clone)]
pub struct L2Config {
    pub tier: Arc<dyn SharedTier>,
    /// L2 lifetimes (15 min + 0–300 s by default): longer than L1's, so instances refill from L2.
    /// The starting value: [`PartCache::set_ttl`](crate::PartCache::set_ttl) replaces it.
    pub ttl: TtlPolicy,
    /// How long a rebuild lease lives: longer than a load may take, short enough that a crashed
    /// winner does not block the key for long.
    pub lease_ttl: Duration,
    /// The longest a loser waits for the winner's value. A loser holding a servable copy serves
    /// it at once instead; one without waits a few of the part's recent load times, up to this.
    pub lease_wait: Duration,
    /// How often a loser looks for the winner's value.
    pub lease_poll: Duration,
}

/// The lifetimes entries are stamped with now, both tiers' together: a load reads them once, so
/// that no entry takes L2's lifetime from one change and its L1 cap from another.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct TtlPolicies {
    pub(super) l1: TtlPolicy,
    /// `Some` exactly when the cache has a shared tier.
    pub(super) l2: Option<TtlPolicy>,
}
