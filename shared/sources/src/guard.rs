//! Every call to a dependency goes through its [`Dependency`] guard: circuit breaker, bulkhead,
//! outbound quota, per-attempt timeout and (for idempotent upstream reads) budgeted retries.
//!
//! Refusals are instant and typed ([`FailureKind::BreakerOpen`], [`FailureKind::BulkheadFull`],
//! [`FailureKind::Quota`]), so the part degrades to stale data or template text with the reason
//! in the answer instead of waiting. The guard's own refusals are never recorded as the
//! dependency's failures.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use rebate_cache::{
    FailureKind, FenceOutcome, LoadContext, LoadFailure, SharedTier, TierEntry, TierError, TierKey,
};
use rebate_resilience::{
    Backoff, BreakerConfig, BreakerSnapshot, Bulkhead, BulkheadSnapshot, CircuitBreaker,
    RateConfig, RetryBudget, RetryConfig, Ticker, TokenBucket,
};
use serde::Serialize;
use tokio::time::Instant;

/// How one dependency is protected.
#[derive(Debug, Clone)]
pub struct DependencySettings {
    pub breaker: BreakerConfig,
    /// Concurrent calls allowed; the next one fails at once.
    pub max_concurrent: u32,
    /// Outbound quota (external APIs); `None` for our own stores.
    pub quota: Option<RateConfig>,
    /// Retries of idempotent reads; `None` never retries.
    pub retry: Option<RetryConfig>,
    /// Each attempt's own timeout, further capped by the request's deadline; `None` when the
    /// client enforces its own (Redis commands).
    pub timeout: Option<Duration>,
}

/// Why an attempt failed, and whether trying again could help.
#[derive(Debug, Clone)]
pub struct AttemptFailure {
    pub failure: LoadFailure,
    /// Transient (a 5xx, a reset connection): another attempt may succeed. Timeouts are never
    /// retried: the time they would need is already spent.
    pub retryable: bool,
}

impl AttemptFailure {
    pub fn transient(failure: LoadFailure) -> Self {
        Self {
            failure,
            retryable: true,
        }
    }

    pub fn permanent(failure: LoadFailure) -> Self {
        Self {
            failure,
            retryable: false,
        }
    }
}

impl From<LoadFailure> for AttemptFailure {
    fn from(failure: LoadFailure) -> Self {
        Self::permanent(failure)
    }
}

/// One dependency's guard. Share it (`Arc`) between every caller of that dependency.
pub struct Dependency {
    name: &'static str,
    breaker: CircuitBreaker,
    bulkhead: Bulkhead,
    quota: Option<(RateConfig, TokenBucket)>,
    retry: Option<(RetryConfig, RetryBudget, Backoff)>,
    timeout: Option<Duration>,
    ticker: Arc<dyn Ticker>,
    counters: Counters,
}

#[derive(Debug, Default)]
struct Counters {
    attempts: AtomicU64,
    successes: AtomicU64,
    failures: AtomicU64,
    timeouts: AtomicU64,
    rejected_breaker: AtomicU64,
    rejected_bulkhead: AtomicU64,
    rejected_quota: AtomicU64,
}

impl fmt::Debug for Dependency {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("Dependency")
            .field("name", &self.name)
            .field("breaker", &self.breaker.state())
            .field("in_flight", &self.bulkhead.in_flight())
            .finish_non_exhaustive()
    }
}

impl Dependency {
    pub fn new(name: &'static str, settings: DependencySettings, ticker: Arc<dyn Ticker>) -> Self {
        Self {
            name,
            breaker: CircuitBreaker::new(name, settings.breaker, Arc::clone(&ticker)),
            bulkhead: Bulkhead::new(name, settings.max_concurrent),
            quota: settings.quota.map(|rate| (rate, TokenBucket::new(rate))),
            retry: settings
                .retry
                .map(|config| (config, RetryBudget::new(&config), Backoff::from(&config))),
            timeout: settings.timeout,
            ticker,
            counters: Counters::default(),
        }
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn breaker(&self) -> &CircuitBreaker {
        &self.breaker
    }

    /// Runs `attempt` under the guard, retrying transient failures while the request's
    /// allowance, the global budget and the deadline allow.
    pub async fn call<T, F, Fut>(&self, mut attempt: F) -> Result<T, LoadFailure>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, AttemptFailure>>,
    {
        let context = LoadContext::current();
        let deadline = context.as_ref().and_then(LoadContext::deadline);
        let mut retries = 0u32;
        loop {
            let budget = self.attempt_budget(deadline)?;
            let failure = match self.attempt_once(budget, &mut attempt, retries == 0).await {
                Ok(value) => return Ok(value),
                Err(failure) => failure,
            };
            let Some(delay) = self.retry_delay(&failure, retries, context.as_ref(), deadline)
            else {
                return Err(failure.failure);
            };
            retries += 1;
            tracing::debug!(dependency = self.name, retry = retries, ?delay, failure = %failure.failure, "retrying");
            tokio::time::sleep(delay).await;
        }
    }

    /// The time one attempt may take: the dependency's timeout capped by the deadline.
    fn attempt_budget(&self, deadline: Option<Instant>) -> Result<Option<Duration>, LoadFailure> {
        let left = deadline.map(|deadline| deadline.saturating_duration_since(Instant::now()));
        if left.is_some_and(|left| left.is_zero()) {
            return Err(LoadFailure::timeout(format!(
                "{}: the request deadline passed before the call",
                self.name
            )));
        }
        Ok(match (self.timeout, left) {
            (Some(timeout), Some(left)) => Some(timeout.min(left)),
            (timeout, left) => timeout.or(left),
        })
    }

    async fn attempt_once<T, F, Fut>(
        &self,
        budget: Option<Duration>,
        attempt: &mut F,
        first: bool,
    ) -> Result<T, AttemptFailure>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, AttemptFailure>>,
    {
        let counters = &self.counters;
        let permit = self.breaker.try_acquire().map_err(|open| {
            bump(&counters.rejected_breaker);
            AttemptFailure::permanent(LoadFailure::new(FailureKind::BreakerOpen, open.to_string()))
        })?;
        let _slot = self.bulkhead.try_acquire().map_err(|full| {
            bump(&counters.rejected_bulkhead);
            AttemptFailure::permanent(LoadFailure::new(
                FailureKind::BulkheadFull,
                full.to_string(),
            ))
        })?;
        if let Some((_, bucket)) = &self.quota {
            bucket
                .try_acquire_at(self.ticker.now_nanos())
                .map_err(|exceeded| {
                    bump(&counters.rejected_quota);
                    AttemptFailure::permanent(LoadFailure::new(
                        FailureKind::Quota,
                        format!("{} quota spent: {exceeded}", self.name),
                    ))
                })?;
        }
        if first && let Some((_, budget, _)) = &self.retry {
            budget.deposit();
        }
        bump(&counters.attempts);
        let outcome = match budget {
            Some(budget) => match tokio::time::timeout(budget, attempt()).await {
                Ok(outcome) => outcome,
                Err(_elapsed) => Err(AttemptFailure::permanent(LoadFailure::timeout(format!(
                    "{} did not answer within {} ms",
                    self.name,
                    budget.as_millis()
                )))),
            },
            None => attempt().await,
        };
        match &outcome {
            Ok(_) => {
                bump(&counters.successes);
                permit.success();
            }
            Err(failure) if failure.failure.kind == FailureKind::Timeout => {
                bump(&counters.timeouts);
                // Cut short by the caller's deadline, before even the slow-call threshold: that
                // says nothing about the dependency, so the breaker does not hear of it.
                let cut_by_caller = budget.is_some_and(|budget| {
                    self.timeout.is_none_or(|timeout| budget < timeout)
                        && budget < self.breaker.config().slow_call
                });
                if cut_by_caller {
                    drop(permit);
                } else {
                    permit.failure();
                }
            }
            Err(_) => {
                bump(&counters.failures);
                permit.failure();
            }
        }
        outcome
    }

    /// How long to wait before retrying `failure`, or `None` when it must not be retried.
    fn retry_delay(
        &self,
        failure: &AttemptFailure,
        retries: u32,
        context: Option<&LoadContext>,
        deadline: Option<Instant>,
    ) -> Option<Duration> {
        let (config, budget, backoff) = self.retry.as_ref()?;
        if !failure.retryable || retries >= config.max_per_request {
            return None;
        }
        let delay = backoff.delay(retries + 1);
        // A retry that could not even start before the deadline is pointless.
        if deadline.is_some_and(|deadline| Instant::now() + delay >= deadline) {
            return None;
        }
        if context.is_some_and(|context| !context.take_retry()) {
            return None;
        }
        budget.try_withdraw().then_some(delay)
    }

    pub fn snapshot(&self) -> DependencySnapshot {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let counters = &self.counters;
        DependencySnapshot {
            name: self.name,
            breaker: self.breaker.snapshot(),
            bulkhead: self.bulkhead.snapshot(),
            quota: self.quota.as_ref().map(|(rate, bucket)| {
                let (granted, refused) = bucket.counts();
                QuotaSnapshot {
                    per_second: rate.per_second,
                    burst: rate.burst,
                    granted,
                    refused,
                }
            }),
            retry: self.retry.as_ref().map(|(config, budget, _)| {
                let (first_attempts, retries, refused) = budget.counts();
                RetrySnapshot {
                    max_per_request: config.max_per_request,
                    ratio: config.ratio,
                    first_attempts,
                    retries,
                    refused,
                }
            }),
            timeout_ms: self.timeout.map(|timeout| timeout.as_millis() as u64),
            attempts: read(&counters.attempts),
            successes: read(&counters.successes),
            failures: read(&counters.failures),
            timeouts: read(&counters.timeouts),
            rejected_breaker: read(&counters.rejected_breaker),
            rejected_bulkhead: read(&counters.rejected_bulkhead),
            rejected_quota: read(&counters.rejected_quota),
        }
    }
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// A dependency's guards and counters, for the admin status (and metrics).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DependencySnapshot {
    pub name: &'static str,
    pub breaker: BreakerSnapshot,
    pub bulkhead: BulkheadSnapshot,
    pub quota: Option<QuotaSnapshot>,
    pub retry: Option<RetrySnapshot>,
    pub timeout_ms: Option<u64>,
    /// Calls made (first attempts and retries).
    pub attempts: u64,
    pub successes: u64,
    pub failures: u64,
    pub timeouts: u64,
    pub rejected_breaker: u64,
    pub rejected_bulkhead: u64,
    pub rejected_quota: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QuotaSnapshot {
    pub per_second: f64,
    pub burst: u32,
    pub granted: u64,
    pub refused: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RetrySnapshot {
    pub max_per_request: u32,
    pub ratio: f64,
    pub first_attempts: u64,
    pub retries: u64,
    pub refused: u64,
}

/// The shared L2 tier behind the Redis dependency's guard: while its breaker is open, cache
/// reads skip L2 at once (straight to the source) instead of paying a command timeout per miss.
#[derive(Debug)]
pub struct GuardedTier {
    tier: Arc<dyn SharedTier>,
    guard: Arc<Dependency>,
}

impl GuardedTier {
    pub fn new(tier: Arc<dyn SharedTier>, guard: Arc<Dependency>) -> Self {
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
        self.guarded(|| self.tier.put_fenced(key, entry, ttl)).await
    }

    async fn try_lease(&self, key: TierKey, token: u64, ttl: Duration) -> Result<bool, TierError> {
        self.guarded(|| self.tier.try_lease(key, token, ttl)).await
    }

    async fn release_lease(&self, key: TierKey, token: u64) -> Result<(), TierError> {
        self.guarded(|| self.tier.release_lease(key, token)).await
    }

    /// Readiness asks the tier itself, whatever the breaker thinks.
    async fn ping(&self) -> Result<(), TierError> {
        self.tier.ping().await
    }
}
