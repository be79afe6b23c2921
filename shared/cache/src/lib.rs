//! Read-through cache for the parts of a quote.
//!
//! Contract: [`PartCache::get`] answers from L1 while an entry is fresh; otherwise it joins or
//! starts the *single* load for that key (concurrent callers share it) and waits for it no longer
//! than the caller's budget. When the load fails or the budget runs out, a stale copy is served if
//! one is still inside its stale window; only then does the caller see a failure. The load itself
//! runs in its own task under the part's load timeout, so a caller that gives up does not waste
//! it: the next caller finds the value cached. Every envelope records its data version, when it
//! was fetched and until when it is fresh and servable; TTLs are jittered on every write so that
//! entries written together do not expire together. Freshness is judged on an injected
//! [`Clock`], never on moka's own clock, so tests move time instead of sleeping.
//!
//! This crate knows nothing of HTTP, SQL or upstream APIs: it sees a [`Loader`] and an
//! [`ItemKey`].
//!
//! # Layout
//! - [`bloom`]: [`ItemFilter`], the Bloom filter gate against unknown ids.
//! - [`clock`]: [`Clock`], [`SystemClock`], [`ManualClock`].
//! - [`context`]: [`LoadContext`], the starting request's deadline and retry allowance.
//! - [`envelope`]: [`Envelope`] and [`TtlPolicy`] (jitter).
//! - [`part`]: [`PartCache`], [`Loader`], [`CacheOutcome`], [`LoadFailure`]; [`PartView`], a
//!   part cache with its value type erased.
//! - [`refresh`]: [`refresh_due`], when a read refreshes an entry ahead of its expiry (XFetch),
//!   and [`RefreshLead`], how far ahead, replaceable at runtime.
//! - [`shared`]: [`SharedTier`], the contract of the L2 tier (version-fenced writes, leases).
//! - [`memory`]: [`MemoryTier`], an in-process L2 for unit tests and benchmarks.

pub mod bloom;
pub mod clock;
pub mod context;
pub mod envelope;
pub mod memory;
pub mod part;
pub mod refresh;
pub mod shared;

pub use bloom::{BuildReport, FilterError, FilterStats, ItemFilter};
pub use clock::{Clock, ManualClock, SystemClock};
pub use context::LoadContext;
pub use envelope::{EntryMeta, Envelope, Jitter, PolicyError, TtlPolicy};
pub use memory::MemoryTier;
pub use part::{
    CacheOutcome, CacheStats, CacheStatsSnapshot, FailureKind, L2Config, L2Entry, LoadFailure,
    Loaded, Loader, PartCache, PartCacheConfig, PartView,
};
pub use refresh::{RefreshLead, refresh_due};
pub use shared::{FenceOutcome, SharedTier, TierEntry, TierError, TierKey, lease_then_read};

pub use rebate_domain::ItemKey;
