//! The guard every dependency call goes through: the protection step of the request path.
//!
//! Contract: a [`DependencyGuard`] admits a call only through its circuit breaker, bulkhead and
//! outbound quota (and, with a per-item limit, a load only while its item has a token), cuts
//! each attempt at the dependency's timeout, and retries idempotent reads within a shared
//! [`RetryBudget`](rebate_resilience::RetryBudget). Its own refusals are instant and typed
//! (breaker open, bulkhead full, quota, hot item), so a part degrades with the reason in the
//! answer instead of waiting, and they are never recorded as the dependency's failures. Every
//! attempt and refusal is reported to an optional [`CallObserver`] (the metrics). Its limits
//! change in place while calls go on ([`DependencyGuard::reconfigure`]), each part keeping its
//! state; what only a new guard can change is named in the answer.
//!
//! # Layout
//! - [`dependency`]: [`DependencyGuard`], its settings, snapshot and [`CallObserver`].
//! - [`hot`]: [`HotItemLimit`], each item's own bucket of loads toward a dependency, checked
//!   before the load joins a call, so one viral item cannot spend the dependency's quota.
//! - [`quota`]: the outbound quota, this instance's or drawn from a fleet-wide bucket
//!   ([`FleetTokens`], [`FleetQuotaConfig`]) with the instance's share as fallback;
//!   [`share`]: that share, the instance's turns on the fleet's clock.
//! - [`tier`]: [`GuardedTier`], the shared L2 tier behind the Redis guard.
//!
//! The guards themselves (breaker, bulkhead, token bucket, retry budget, backoff) are
//! `rebate-resilience`'s, clock-injected and free of I/O; this crate puts them in front of a call.

pub mod dependency;
pub mod hot;
pub mod quota;
pub mod share;
pub mod tier;

pub use dependency::{
    AttemptFailure, CallObserver, CallOutcome, DependencyConfig, DependencyGuard,
    DependencySnapshot,
};
pub use hot::{HotItemConfig, HotItemLimit, HotItemSnapshot};
pub use quota::{
    FleetGrant, FleetKeyedLimiter, FleetQuotaConfig, FleetTokens, QuotaScope, QuotaSnapshot,
};
pub use share::{FleetPosition, TurnShare};
pub use tier::GuardedTier;
