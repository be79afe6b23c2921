//! Protection that costs almost nothing on the hot path.
//!
//! Every guard here is a handful of atomics and takes no lock and allocates nothing per call —
//! except [`KeyedLimiter`], whose per-client buckets live in [`KeyedSlots`], a bounded map (a
//! shard's read lock per call, an insert per new client), and [`AdmissionQueue`] for the
//! requests that actually wait (its no-wait path is atomics too):
//! - [`CircuitBreaker`]: a rolling window of failure buckets, open → half-open with slow-start
//!   probes, cool-downs that grow on repeated trips;
//! - [`Bulkhead`]: a bound on concurrent calls that fails at once when full;
//! - [`RetryBudget`] and [`Backoff`]: retries capped per request and as a share of all calls;
//! - [`TokenBucket`] (GCRA) for outbound quotas, [`KeyedLimiter`] for per-client edge limits;
//! - [`LoadShedder`]: three levels of shedding from measured load, with hysteresis and dwell;
//!   [`RequestClass`]: which requests give way first at each level;
//! - [`AdmissionQueue`]: a bounded wait, in class order, for the requests that can afford one
//!   when the service is at its limit (atomics while nobody waits; one mutex for those who do).
//!
//! Time comes from a [`Ticker`], so tests move it by hand instead of sleeping.
//!
//! Every guard can be reconfigured while calls go through it, keeping its state (`reconfigure`,
//! [`Bulkhead::resize`], [`TokenBucket::set_rate_at`], [`KeyedLimiter::set_rate`]): calls read
//! each tunable with one relaxed atomic load, and what can only change at a restart is kept and
//! named in the [`RestartOnly`] answer (see `live.rs`).

mod breaker;
mod bulkhead;
mod class;
mod keyed;
mod live;
mod quota;
mod retry;
mod shedder;
mod ticker;
mod waiting;

pub use breaker::{
    BreakerConfig, BreakerOpen, BreakerPermit, BreakerSnapshot, BreakerState, CircuitBreaker,
};
pub use bulkhead::{Bulkhead, BulkheadFull, BulkheadPermit, BulkheadSnapshot};
pub use class::RequestClass;
pub use keyed::{KeyedSlots, Slot};
pub use live::RestartOnly;
pub use quota::{KeyedLimiter, LiveRate, QuotaExceeded, RateConfig, TokenBucket};
pub use retry::{Backoff, Jitter, RetryBudget, RetryConfig};
pub use shedder::{
    Admission, AdmissionTicket, LevelController, LoadShedder, ShedConfig, ShedLevel, ShedSnapshot,
};
pub use ticker::{ManualTicker, MonotonicTicker, Ticker};
pub use waiting::{
    AdmissionQueue, AdmissionQueueSnapshot, ClassQueueSnapshot, ClassWait, MAX_CONFIGURED_WAIT,
    MAX_CONFIGURED_WAITERS, QueueFull, Turn, WAIT_BUCKETS_SECONDS, WaitConfig, WaitOutcome, Waiter,
};
