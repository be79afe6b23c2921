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
//! - [`clock`]: [`Clock`], [`SystemClock`], [`ManualClock`].
//! - [`envelope`]: [`Envelope`] and [`TtlPolicy`] (jitter).
//! - [`part`]: [`PartCache`], [`Loader`], [`CacheOutcome`], [`LoadFailure`].

pub mod clock;
pub mod envelope;
pub mod part;

pub use clock::{Clock, ManualClock, SystemClock};
pub use envelope::{Envelope, PolicyError, TtlPolicy};
pub use part::{
    CacheOutcome, CacheStats, CacheStatsSnapshot, FailureKind, LoadFailure, Loaded, Loader,
    PartCache, PartCacheSettings,
};

pub use rebate_domain::ItemKey;
