//! Protection that costs almost nothing on the hot path.
//!
//! Every guard here is a handful of atomics and takes no lock and allocates nothing per call —
//! except [`KeyedLimiter`], whose per-client buckets live in [`KeyedSlots`], a bounded map (a
//! shard's read lock per call, an insert per new client):
//! - [`CircuitBreaker`]: a rolling window of failure buckets, open → half-open with slow-start
//!   probes, cool-downs that grow on repeated trips;
//! - [`Bulkhead`]: a bound on concurrent calls that fails at once when full;
//! - [`RetryBudget`] and [`Backoff`]: retries capped per request and as a share of all calls;
//! - [`TokenBucket`] (GCRA) for outbound quotas, [`KeyedLimiter`] for per-client edge limits;
//! - [`LoadShedder`]: three levels of shedding from measured load, with hysteresis and dwell;
//!   [`RequestClass`]: which requests give way first at each level.
//!
//! Time comes from a [`Ticker`], so tests move it by hand instead of sleeping.

mod breaker;
mod bulkhead;
mod class;
mod keyed;
mod quota;
mod retry;
mod shedder;
mod ticker;

pub use breaker::{
    BreakerConfig, BreakerOpen, BreakerPermit, BreakerSnapshot, BreakerState, CircuitBreaker,
};
pub use bulkhead::{Bulkhead, BulkheadFull, BulkheadPermit, BulkheadSnapshot};
pub use class::RequestClass;
pub use keyed::{KeyedSlots, Slot};
pub use quota::{KeyedLimiter, QuotaExceeded, RateConfig, TokenBucket};
pub use retry::{Backoff, Jitter, RetryBudget, RetryConfig};
pub use shedder::{
    Admission, AdmissionTicket, LevelController, LoadShedder, ShedConfig, ShedLevel, ShedSnapshot,
};
pub use ticker::{ManualTicker, MonotonicTicker, Ticker};
