//! The rebate query: one item's quote from four parts fetched in parallel.
//!
//! Contract: [`QueryEngine::quote`] fans out to product, rate, coupons and extras at once, each
//! through its [`PartCache`](rebate_cache::PartCache) and under its own timeout tier, every tier
//! capped by what is left of the request deadline. Each part then walks the degrade ladder
//! live → stale → template: a failed rate becomes "rate unknown" with a notice, failed coupons an
//! empty list with a notice, failed extras `null`. Only the product is indispensable: unknown or
//! delisted → [`QueryError::NotFound`], failing with nothing stale → [`QueryError::Unavailable`].
//! The engine never fails because of an optional part, and it knows nothing of HTTP.
//!
//! Under load shedding ([`QueryEngine::answer`] with a [`ShedLevel`]) it gives up the optional
//! first: level 1 serves extras from L1 only, level 2 shortens every part's timeout, level 3
//! answers from the cache tiers alone (a product nobody cached → `Unavailable { reason: Shed }`).
//!
//! # Layout
//! - [`timeout_class`]: [`TimeoutClass`], [`ClassTimeouts`], [`PartTimeouts`]: how long each
//!   part may take.
//! - [`error`]: [`DegradeReason`] (why a part is not live) and [`QueryError`] (why there is no
//!   quote).
//! - [`quote`]: [`Quote`] and its views, and [`assemble`].
//! - [`engine`]: [`QueryEngine`], the fan-out, and [`RequestBudget`], the timeouts and retries
//!   a request may spend, which an operator replaces at runtime (each request reads it once).
//! - [`rendered`]: [`RenderedQuotes`], complete quotes kept as JSON until an input changes, so a
//!   hot item costs one lookup ([`QueryEngine::answer`]).

pub mod engine;
pub mod error;
mod naive;
pub mod parts;
pub mod quote;
pub mod rendered;
pub mod timeout_class;

pub use engine::{CacheOnlyLoads, EngineConfig, EngineMode, QueryEngine, RequestBudget};
pub use error::{DegradeReason, QueryError};
pub use parts::EngineParts;
pub use quote::{DegradedPart, ItemView, Notice, PartResult, Quote, RebateView, Served, assemble};
pub use rendered::{QuoteAnswer, RenderedQuote, RenderedQuotes, RenderedStats, entity_tag};
pub use timeout_class::{ClassTimeouts, PartTimeouts, TimeoutClass, scale_timeouts};

pub use rebate_resilience::ShedLevel;
