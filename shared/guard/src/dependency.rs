//! Every call to a dependency goes through its [`DependencyGuard`] guard: circuit breaker, bulkhead,
//! outbound quota, per-attempt timeout and (for idempotent upstream reads) budgeted retries.
//!
//! Refusals are instant and typed ([`FailureKind::BreakerOpen`], [`FailureKind::BulkheadFull`],
//! [`FailureKind::Quota`], and before a load joins a call [`FailureKind::HotItem`] from the
//! optional per-item limit, [`HotItemLimit`]), so the part degrades to stale data or template
//! text with the reason in the answer instead of waiting. The guard's own refusals are never
//! recorded as the dependency's failures.
//!
//! Its values change in place ([`DependencyGuard::reconfigure`],
//! [`DependencyGuard::reconfigure_hot_items`]): each part keeps its state (the breaker's state
//! and window, the calls in flight, the tokens held, the retry budget's savings) and reads the
//! new values at its next decision, one relaxed atomic load each.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use rebate_cache::{FailureKind, ItemKey, LoadContext, LoadFailure};
use rebate_resilience::{
    BreakerConfig, BreakerSnapshot, BreakerState, Bulkhead, BulkheadSnapshot, CircuitBreaker,
    RateConfig, RestartOnly, RetryBudget, RetryConfig, Ticker,
};
use rebate_telemetry::record_stage;
use serde::Serialize;
use tokio::time::Instant;
use tracing::Instrument;

use crate::hot::{HotItemConfig, HotItemLimit, HotItemSnapshot};
use crate::quota::{FleetQuotaConfig, Quota, QuotaSnapshot};

/// How one dependency is protected.
#[derive(Debug, Clone)]
pub struct DependencyConfig {
    pub breaker: BreakerConfig,
    /// Concurrent calls allowed; the next one fails at once.
    pub max_concurrent: u32,
    /// Outbound quota (external APIs); `None` for our own stores.
    pub quota: Option<RateConfig>,
    /// With a quota: draw it from the fleet's bucket instead of this instance's own.
    pub fleet_quota: Option<FleetQuotaConfig>,
    /// Retries of idempotent reads; `None` never retries.
    pub retry: Option<RetryConfig>,
    /// Each attempt's own timeout (or the part's, if shorter), measured from the attempt's start
    /// so that a load shared by later callers is not cut off by its starter's deadline; `None`
    /// when the client enforces its own (Redis commands).
    pub timeout: Option<Duration>,
}

/// How one attempt ended, or why none was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallOutcome {
    Success,
    Error,
    Timeout,
    /// Refused by the guard itself: no call was made.
    BreakerOpen,
    BulkheadFull,
    Quota,
    /// The item's own share of loads was spent ([`HotItemLimit`]): no call was made.
    HotItem,
}

impl CallOutcome {
    pub const fn as_str(self) -> &'static str {
        match self {
            CallOutcome::Success => "success",
            CallOutcome::Error => "error",
            CallOutcome::Timeout => "timeout",
            CallOutcome::BreakerOpen => "breaker_open",
            CallOutcome::BulkheadFull => "bulkhead_full",
            CallOutcome::Quota => "quota",
            CallOutcome::HotItem => "hot_item",
        }
    }
}

/// Told of every attempt a guard makes or refuses, with how long it took (zero for refusals):
/// dependency metrics hang off it.
pub trait CallObserver: Send + Sync + fmt::Debug + 'static {
    fn observe(&self, dependency: &'static str, outcome: CallOutcome, elapsed: Duration);
}

/// Why an attempt failed, and whether trying again could help.
#[derive(Debug, Clone)]
pub struct AttemptFailure {
    pub failure: LoadFailure,
    /// Transient (a 5xx, a reset connection): another attempt may succeed. The guard marks its
    /// own attempt timeout permanent (the time another try would need is already spent); a
    /// caller decides for the failures it reports.
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
pub struct DependencyGuard {
    name: &'static str,
    breaker: CircuitBreaker,
    bulkhead: Bulkhead,
    quota: Option<Quota>,
    hot_items: Option<HotItemLimit>,
    /// The retry budget, which holds the per-request allowance and the back-off too.
    retry: Option<RetryBudget>,
    /// The attempt timeout in nanoseconds; [`NO_TIMEOUT`] when the client enforces its own.
    timeout_nanos: AtomicU64,
    ticker: Arc<dyn Ticker>,
    counters: Counters,
    refusals: Refusals,
    observer: Option<Arc<dyn CallObserver>>,
    /// Held by a reconfiguration, so that concurrent ones apply whole, one after the other.
    reconfiguring: Mutex<()>,
}

/// `timeout_nanos` of a guard without an attempt timeout.
const NO_TIMEOUT: u64 = u64::MAX;

/// The details of the guard's own refusals, built once: refusing must cost no allocation, since
/// an open breaker refuses every call.
#[derive(Debug)]
struct Refusals {
    breaker_open: Arc<str>,
    /// Names the bound, so it is rebuilt when the bound changes; a full bulkhead's refusal
    /// takes the read lock (no call that gets a slot does).
    bulkhead_full: RwLock<Arc<str>>,
    quota: Arc<str>,
}

fn bulkhead_full(name: &str, max_concurrent: u32) -> Arc<str> {
    format!("{name}: all {max_concurrent} slots for concurrent calls taken").into()
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
    rejected_hot_item: AtomicU64,
}

impl fmt::Debug for DependencyGuard {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("DependencyGuard")
            .field("name", &self.name)
            .field("breaker", &self.breaker.state())
            .field("in_flight", &self.bulkhead.in_flight())
            .finish_non_exhaustive()
    }
}

impl DependencyGuard {
    pub fn new(name: &'static str, settings: DependencyConfig, ticker: Arc<dyn Ticker>) -> Self {
        Self {
            name,
            breaker: CircuitBreaker::new(name, settings.breaker, Arc::clone(&ticker)),
            bulkhead: Bulkhead::new(name, settings.max_concurrent),
            quota: settings
                .quota
                .map(|rate| Quota::new(rate, settings.fleet_quota, name)),
            hot_items: None,
            retry: settings.retry.as_ref().map(RetryBudget::new),
            timeout_nanos: AtomicU64::new(timeout_nanos(settings.timeout)),
            ticker,
            counters: Counters::default(),
            refusals: Refusals {
                breaker_open: format!("{name}: circuit breaker open").into(),
                bulkhead_full: RwLock::new(bulkhead_full(name, settings.max_concurrent)),
                quota: format!("{name}: outbound quota spent").into(),
            },
            observer: None,
            reconfiguring: Mutex::new(()),
        }
    }

    /// Applies `config` to the running guard; each part keeps its state and takes the new
    /// values at its next decision:
    /// - the breaker's thresholds, slow-call limit, cool-downs and probe stages
    ///   ([`CircuitBreaker::reconfigure`]: its state, deadline and window are kept);
    /// - the bulkhead's bound (`max_concurrent`, [`Bulkhead::resize`]: the calls in flight keep
    ///   their slots, and above the new bound new calls are refused until enough end);
    /// - the quota's rate: this instance's bucket keeps the tokens it holds; a fleet quota asks
    ///   the fleet's bucket at the new rate from its next grant;
    /// - the retry budget, the retries per request and the back-off
    ///   ([`RetryBudget::reconfigure`]);
    /// - the attempt timeout, for the attempts that start after the change.
    ///
    /// Restart-only, kept and named in the answer when `config` asks for another: the breaker's
    /// `buckets` (a fixed array); whether the guard has a quota, draws it from the fleet, or
    /// retries at all (`quota`, `fleet_quota`, `retry`: they give the guard its parts, which a
    /// new guard would have to be built with); a fleet quota's lease settings and fleet handle
    /// (`fleet_quota.max_lease`, `.retry_after_failure`, `.lease_ahead`, `.lease_ttl`,
    /// `.tokens`). `config` should have passed the same validation as the one the guard was
    /// built with.
    pub fn reconfigure(&self, config: DependencyConfig) -> RestartOnly {
        let _reconfiguring = self
            .reconfiguring
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut restart_only = RestartOnly::default();
        restart_only.nest("breaker", self.breaker.reconfigure(config.breaker));
        self.resize_bulkhead(config.max_concurrent);
        let fleet_asked = config
            .fleet_quota
            .as_ref()
            .filter(|_| config.quota.is_some());
        let fleet_in_force = self.quota.as_ref().and_then(Quota::fleet_config);
        restart_only.note("quota", &self.quota.is_some(), &config.quota.is_some());
        restart_only.note(
            "fleet_quota",
            &fleet_in_force.is_some(),
            &fleet_asked.is_some(),
        );
        if let (Some(in_force), Some(asked)) = (fleet_in_force, fleet_asked) {
            note_fleet_settings(&mut restart_only, in_force, asked);
        }
        if let (Some(quota), Some(rate)) = (&self.quota, config.quota) {
            quota.set_rate(rate, self.ticker.now_nanos());
        }
        restart_only.note("retry", &self.retry.is_some(), &config.retry.is_some());
        if let (Some(budget), Some(retry)) = (&self.retry, &config.retry) {
            budget.reconfigure(retry);
        }
        self.timeout_nanos
            .store(timeout_nanos(config.timeout), Ordering::Relaxed);
        restart_only
    }

    /// Applies `config` to the per-item limit ([`HotItemLimit::reconfigure`]: every item keeps
    /// its tokens; `max_items` is restart-only). A guard built without a per-item limit keeps
    /// having none: `hot_items` is named in the answer.
    pub fn reconfigure_hot_items(&self, config: HotItemConfig) -> RestartOnly {
        let mut restart_only = RestartOnly::default();
        match &self.hot_items {
            Some(limit) => restart_only.nest("hot_items", limit.reconfigure(config)),
            None => restart_only.fields.push("hot_items".to_owned()),
        }
        restart_only
    }

    /// Resizes the bulkhead and its refusal's text together.
    fn resize_bulkhead(&self, max_concurrent: u32) {
        let mut refusal = self
            .refusals
            .bulkhead_full
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        self.bulkhead.resize(max_concurrent);
        *refusal = bulkhead_full(self.name, self.bulkhead.max());
    }

    /// Reports every attempt and refusal to `observer` (metrics).
    pub fn with_observer(mut self, observer: Arc<dyn CallObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Limits each item's loads through this guard ([`HotItemLimit`]; loaders ask
    /// [`DependencyGuard::admit_item`] before a load joins a call).
    pub fn with_hot_items(mut self, config: HotItemConfig) -> Self {
        self.hot_items = Some(HotItemLimit::new(
            self.name,
            config,
            Arc::clone(&self.ticker),
        ));
        self
    }

    fn observe(&self, outcome: CallOutcome, elapsed: Duration) {
        if let Some(observer) = &self.observer {
            observer.observe(self.name, outcome, elapsed);
        }
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn breaker(&self) -> &CircuitBreaker {
        &self.breaker
    }

    /// Whether a call started now would get past the breaker and the quota (advisory, and
    /// without taking anything): a caller about to take a shared rebuild lease for this
    /// dependency asks first, so that an instance that would be refused does not hold the
    /// lease other instances wait on, nor spend round trips on it.
    pub fn ready(&self) -> bool {
        self.breaker.state() != BreakerState::Open
            && self
                .quota
                .as_ref()
                .is_none_or(|quota| quota.ready(self.ticker.now_nanos()))
    }

    /// Takes a token of `key`'s own bucket for one load, before the load joins a call (and so
    /// before the call takes a quota token): a refused load makes no call, takes nothing from
    /// the quota and is not the dependency's failure. Without a per-item limit every load passes.
    pub fn admit_item(&self, key: ItemKey) -> Result<(), LoadFailure> {
        let Some(limit) = &self.hot_items else {
            return Ok(());
        };
        limit.admit(key).inspect_err(|_| {
            bump(&self.counters.rejected_hot_item);
            self.observe(CallOutcome::HotItem, Duration::ZERO);
            record_stage(
                "dependency",
                self.name,
                CallOutcome::HotItem.as_str(),
                Instant::now(),
                None,
            );
        })
    }

    /// Whether a load of `key` would pass its per-item limit now (advisory, takes nothing).
    pub fn item_ready(&self, key: ItemKey) -> bool {
        self.hot_items.as_ref().is_none_or(|limit| limit.ready(key))
    }

    /// Whether the breaker would let a call through now (advisory, takes nothing).
    pub fn breaker_allows(&self) -> bool {
        self.breaker.state() != BreakerState::Open
    }

    /// How long until the outbound quota has a token (zero when it has one, or there is none):
    /// a batch of loads waits that long for its call rather than being refused.
    pub fn wait_for_quota(&self) -> Duration {
        self.quota
            .as_ref()
            .map_or(Duration::ZERO, |quota| quota.wait(self.ticker.now_nanos()))
    }

    /// Runs `attempt` under the guard, retrying transient failures while the request's
    /// allowance, the global budget and the deadline allow.
    pub async fn call<T, F, Fut>(&self, mut attempt: F) -> Result<T, LoadFailure>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, AttemptFailure>>,
    {
        let context = LoadContext::current();
        let budget = self.attempt_budget(context.as_ref());
        let mut retries = 0u32;
        loop {
            let failure = match self.attempt_once(budget, &mut attempt, retries + 1).await {
                Ok(value) => return Ok(value),
                Err(failure) => failure,
            };
            let Some(delay) = self.retry_delay(&failure, retries, budget, context.as_ref()) else {
                return Err(failure.failure);
            };
            retries += 1;
            tracing::debug!(dependency = self.name, retry = retries, ?delay, failure = %failure.failure, "retrying");
            tokio::time::sleep(delay).await;
        }
    }

    /// The time one attempt may take: the dependency's timeout, shortened to the part's timeout at
    /// the request's shed level. Measured from the attempt's start, not from the request's: a
    /// load shared by later callers must not be cut off by its starter's deadline.
    fn attempt_budget(&self, context: Option<&LoadContext>) -> Option<Duration> {
        match (
            self.timeout(),
            context.and_then(LoadContext::attempt_timeout),
        ) {
            (Some(timeout), Some(part)) => Some(timeout.min(part)),
            (timeout, part) => timeout.or(part),
        }
    }

    /// The attempt timeout in force.
    fn timeout(&self) -> Option<Duration> {
        match self.timeout_nanos.load(Ordering::Relaxed) {
            NO_TIMEOUT => None,
            nanos => Some(Duration::from_nanos(nanos)),
        }
    }

    /// One attempt (`number` 1 is the first) in its own `dependency` span, recorded on the
    /// request's timeline whatever its outcome, refusals included.
    async fn attempt_once<T, F, Fut>(
        &self,
        budget: Option<Duration>,
        attempt: &mut F,
        number: u32,
    ) -> Result<T, AttemptFailure>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, AttemptFailure>>,
    {
        let span = tracing::debug_span!(
            "dependency",
            dependency = self.name,
            attempt = number,
            outcome = tracing::field::Empty,
        );
        let started = Instant::now();
        let result = self
            .guarded_attempt(budget, attempt, number == 1)
            .instrument(span.clone())
            .await;
        let outcome = match &result {
            Ok(_) => CallOutcome::Success,
            Err(failure) => match failure.failure.kind {
                FailureKind::Timeout => CallOutcome::Timeout,
                FailureKind::BreakerOpen => CallOutcome::BreakerOpen,
                FailureKind::BulkheadFull => CallOutcome::BulkheadFull,
                FailureKind::Quota => CallOutcome::Quota,
                FailureKind::HotItem => CallOutcome::HotItem,
                FailureKind::Error | FailureKind::Shed => CallOutcome::Error,
            },
        };
        span.record("outcome", outcome.as_str());
        record_stage(
            "dependency",
            self.name,
            outcome.as_str(),
            started,
            Some(number),
        );
        result
    }

    async fn guarded_attempt<T, F, Fut>(
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
        let refusals = &self.refusals;
        let permit = self.breaker.try_acquire().map_err(|_| {
            bump(&counters.rejected_breaker);
            self.observe(CallOutcome::BreakerOpen, Duration::ZERO);
            AttemptFailure::permanent(LoadFailure::new(
                FailureKind::BreakerOpen,
                Arc::clone(&refusals.breaker_open),
            ))
        })?;
        let _slot = self.bulkhead.try_acquire().map_err(|_| {
            bump(&counters.rejected_bulkhead);
            self.observe(CallOutcome::BulkheadFull, Duration::ZERO);
            let detail = refusals
                .bulkhead_full
                .read()
                .unwrap_or_else(PoisonError::into_inner);
            AttemptFailure::permanent(LoadFailure::new(
                FailureKind::BulkheadFull,
                Arc::clone(&detail),
            ))
        })?;
        if let Some(quota) = &self.quota
            && !quota.acquire(self.ticker.as_ref()).await
        {
            bump(&counters.rejected_quota);
            self.observe(CallOutcome::Quota, Duration::ZERO);
            return Err(AttemptFailure::permanent(LoadFailure::new(
                FailureKind::Quota,
                Arc::clone(&refusals.quota),
            )));
        }
        if first && let Some(budget) = &self.retry {
            budget.deposit();
        }
        bump(&counters.attempts);
        let started = Instant::now();
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
        let call_outcome = match &outcome {
            Ok(_) => {
                bump(&counters.successes);
                permit.success();
                CallOutcome::Success
            }
            Err(failure) => {
                permit.failure();
                if failure.failure.kind == FailureKind::Timeout {
                    bump(&counters.timeouts);
                    CallOutcome::Timeout
                } else {
                    bump(&counters.failures);
                    CallOutcome::Error
                }
            }
        };
        self.observe(call_outcome, started.elapsed());
        outcome
    }

    /// How long to wait before retrying `failure`, or `None` when it must not be retried: not
    /// transient, no retries configured, the request's allowance or the global budget spent, or
    /// no time left before the request's deadline for the back-off and another attempt.
    fn retry_delay(
        &self,
        failure: &AttemptFailure,
        retries: u32,
        budget: Option<Duration>,
        context: Option<&LoadContext>,
    ) -> Option<Duration> {
        let global = self.retry.as_ref()?;
        if !failure.retryable || retries >= global.max_per_request() {
            return None;
        }
        let delay = global.backoff().delay(retries + 1);
        let deadline = context.and_then(LoadContext::deadline);
        // The retry must be able to start before the deadline; it may then take its own budget,
        // capped by the load's timeout like any attempt.
        let earliest_end = Instant::now() + delay + budget.unwrap_or_default().min(delay);
        if deadline.is_some_and(|deadline| earliest_end >= deadline) {
            return None;
        }
        // The request's allowance first (shared by its parts), then the process-wide budget; a
        // refusal by the budget gives the request its retry back.
        if context.is_some_and(|context| !context.take_retry()) {
            return None;
        }
        if !global.try_withdraw() {
            if let Some(context) = context {
                context.refund_retry();
            }
            return None;
        }
        Some(delay)
    }

    pub fn snapshot(&self) -> DependencySnapshot {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let counters = &self.counters;
        let config = self.breaker.config();
        DependencySnapshot {
            name: self.name,
            breaker: self.breaker.snapshot(),
            breaker_thresholds: BreakerThresholds {
                window_ms: millis(config.window),
                buckets: config.buckets,
                failure_ratio: config.failure_ratio,
                min_calls: config.min_calls,
                slow_call_ms: millis(config.slow_call),
                cool_down_ms: millis(config.cool_down),
                max_cool_down_ms: millis(config.max_cool_down),
                probe_stages: config.probe_stages,
            },
            bulkhead: self.bulkhead.snapshot(),
            quota: self.quota.as_ref().map(Quota::snapshot),
            hot_items: self.hot_items.as_ref().map(HotItemLimit::snapshot),
            retry: self.retry.as_ref().map(|budget| {
                let config = budget.config();
                let (first_attempts, retries, refused) = budget.counts();
                RetrySnapshot {
                    max_per_request: config.max_per_request,
                    ratio: config.ratio,
                    first_attempts,
                    retries,
                    refused,
                }
            }),
            timeout_ms: self.timeout().map(millis),
            attempts: read(&counters.attempts),
            successes: read(&counters.successes),
            failures: read(&counters.failures),
            timeouts: read(&counters.timeouts),
            rejected_breaker: read(&counters.rejected_breaker),
            rejected_bulkhead: read(&counters.rejected_bulkhead),
            rejected_quota: read(&counters.rejected_quota),
            rejected_hot_item: read(&counters.rejected_hot_item),
        }
    }
}

fn timeout_nanos(timeout: Option<Duration>) -> u64 {
    timeout.map_or(NO_TIMEOUT, |timeout| {
        u64::try_from(timeout.as_nanos()).map_or(NO_TIMEOUT - 1, |nanos| nanos.min(NO_TIMEOUT - 1))
    })
}

/// Notes each lease setting of a fleet quota that `asked` would change.
fn note_fleet_settings(
    restart_only: &mut RestartOnly,
    in_force: &FleetQuotaConfig,
    asked: &FleetQuotaConfig,
) {
    restart_only.note(
        "fleet_quota.max_lease",
        &in_force.max_lease,
        &asked.max_lease,
    );
    restart_only.note(
        "fleet_quota.retry_after_failure",
        &in_force.retry_after_failure,
        &asked.retry_after_failure,
    );
    restart_only.note(
        "fleet_quota.lease_ahead",
        &in_force.lease_ahead,
        &asked.lease_ahead,
    );
    restart_only.note(
        "fleet_quota.lease_ttl",
        &in_force.lease_ttl,
        &asked.lease_ttl,
    );
    restart_only.note(
        "fleet_quota.tokens",
        &true,
        &Arc::ptr_eq(&in_force.tokens, &asked.tokens),
    );
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// A dependency's guards and counters, for the admin status (and metrics).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DependencySnapshot {
    pub name: &'static str,
    /// Live state: window counts, observed failure ratio, trips, cool-down left, probe stage.
    pub breaker: BreakerSnapshot,
    /// The configuration the live state is judged against.
    pub breaker_thresholds: BreakerThresholds,
    pub bulkhead: BulkheadSnapshot,
    pub quota: Option<QuotaSnapshot>,
    /// The per-item limit on loads, when the dependency has one.
    pub hot_items: Option<HotItemSnapshot>,
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
    /// Loads refused by the per-item limit (no call made).
    pub rejected_hot_item: u64,
}

/// A breaker's configuration, in the units of the config file.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BreakerThresholds {
    pub window_ms: u64,
    pub buckets: u32,
    pub failure_ratio: f64,
    pub min_calls: u32,
    pub slow_call_ms: u64,
    pub cool_down_ms: u64,
    pub max_cool_down_ms: u64,
    pub probe_stages: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RetrySnapshot {
    pub max_per_request: u32,
    pub ratio: f64,
    pub first_attempts: u64,
    pub retries: u64,
    pub refused: u64,
}
