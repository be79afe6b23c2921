//! Where each part of a quote comes from.
//!
//! Contract: every type here implements [`rebate_cache::Loader`] for one part and maps its
//! source's answers onto it: a value with its data version, `None` when the source says the item
//! does not exist, or a [`LoadFailure`] (timeout or error) that the cache may answer with a stale
//! copy. Sources never cache; every call goes through its dependency's
//! [`DependencyGuard`](rebate_guard::DependencyGuard) (`rebate-guard`: breaker, bulkhead, quota,
//! timeout, budgeted retries of idempotent reads). Nothing here knows about HTTP *serving* or the
//! quote's shape.
//!
//! # Layout
//! - [`catalogue`]: [`CatalogLoader`] (products and rates) over a [`CatalogRepository`], behind a
//!   [`LoadLimiter`].
//! - [`upstream`]: [`CouponClient`], [`ExtrasClient`] over the external HTTP/JSON APIs (one
//!   generic [`UpstreamClient`] over each API's [`UpstreamApi`]).
//! - [`batch`]: the [`BatchConfig`] by which concurrent loads of one API are coalesced into its
//!   batch calls, and their [`BatchStats`].

pub mod batch;
pub mod catalogue;
pub mod upstream;

pub use batch::{BatchConfig, BatchStats};
pub use catalogue::{CatalogLoader, LoadLimiter};
pub use upstream::{
    CouponApi, CouponClient, ExtrasApi, ExtrasClient, UpstreamApi, UpstreamClient, UpstreamError,
    http_client,
};

pub use rebate_cache::LoadFailure;
pub use rebate_store::CatalogRepository;
