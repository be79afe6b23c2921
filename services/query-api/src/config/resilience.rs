//! `[resilience]`: breaker defaults, a section per dependency, retries, shedding and the
//! per-client limit; validated with the rest of the configuration and turned into the guards'
//! runtime configurations (`crate::protection` builds the guards from them).

use std::time::Duration;

use rebate_guard::HotItemConfig;
use rebate_resilience::{
    BreakerConfig, ClassWait, RateConfig, RequestClass, RetryConfig, ShedConfig, WaitConfig,
};
use serde::{Deserialize, Serialize};

use super::{ConfigError, ensure_in, invalid};

/// `[resilience]`: breaker defaults, one section per dependency, retries, shedding and the
/// per-client limit.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResilienceSettings {
    pub breaker: BreakerDefaults,
    pub mysql: DependencySettings,
    pub redis: DependencySettings,
    pub coupons: DependencySettings,
    pub extras: DependencySettings,
    pub retry: RetrySettings,
    pub shedding: SheddingSettings,
    pub admission_wait: AdmissionWaitSettings,
    pub client_limit: ClientLimitSettings,
    pub fleet: FleetSettings,
}

/// `[resilience.admission_wait]`: which deferrable classes wait for admission when the service
/// is over its limit, how many at once and for how long (`rebate_resilience::AdmissionQueue`).
/// Page requests never wait: their section has no keys.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AdmissionWaitSettings {
    /// Prefetches waiting at once (0: refused at once when over the limit).
    pub prefetch_max_waiters: u32,
    /// The longest a prefetch waits before its 503.
    pub prefetch_max_wait_ms: u64,
    /// List requests waiting at once (0: admitted at once, at their level, as without a wait).
    pub list_max_waiters: u32,
    pub list_max_wait_ms: u64,
}

impl AdmissionWaitSettings {
    /// The queue's configuration.
    pub fn wait_config(&self) -> WaitConfig {
        let class = |max_waiters: u32, max_wait_ms: u64| ClassWait {
            max_waiters,
            max_wait: Duration::from_millis(max_wait_ms),
        };
        WaitConfig::default()
            .with(
                RequestClass::Prefetch,
                class(self.prefetch_max_waiters, self.prefetch_max_wait_ms),
            )
            .with(
                RequestClass::List,
                class(self.list_max_waiters, self.list_max_wait_ms),
            )
    }

    /// Whether any class waits.
    pub fn any(&self) -> bool {
        self.prefetch_max_waiters > 0 || self.list_max_waiters > 0
    }

    fn validate(&self) -> Result<(), ConfigError> {
        self.wait_config()
            .validate()
            .map_err(|reason| invalid("resilience.admission_wait", reason))
    }
}

/// `[resilience.fleet]`: what holds for the fleet rather than for each instance.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetSettings {
    /// The external APIs' quotas are fleet-wide, drawn from token buckets in Redis.
    pub quotas: bool,
    /// The most tokens one grant takes, for the calls waiting at that moment.
    pub max_lease: u32,
    /// After the fleet's bucket could not be reached, how long to use this instance's share.
    pub retry_after_failure_ms: u64,
    /// How often the instance records itself in the registry of live instances; three missed
    /// beats and the others count it as gone.
    pub heartbeat_ms: u64,
}

impl FleetSettings {
    /// How many missed beats make an instance gone.
    pub const MISSED_BEATS: u32 = 3;

    pub fn heartbeat(&self) -> Duration {
        Duration::from_millis(self.heartbeat_ms)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        ensure_in("resilience.fleet.max_lease", self.max_lease, 1..=100)?;
        ensure_in(
            "resilience.fleet.retry_after_failure_ms",
            self.retry_after_failure_ms,
            100..=60_000,
        )?;
        ensure_in(
            "resilience.fleet.heartbeat_ms",
            self.heartbeat_ms,
            100..=60_000,
        )
    }
}

/// The breaker settings every dependency starts from.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BreakerDefaults {
    pub window_secs: u64,
    pub buckets: u32,
    pub failure_ratio: f64,
    pub min_calls: u32,
    pub cool_down_ms: u64,
    pub max_cool_down_ms: u64,
    pub probe_stages: u32,
}

/// One dependency: its slow-call threshold, concurrency bound, optional breaker overrides,
/// optional outbound quota and whether its reads are retried.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DependencySettings {
    /// A success slower than this counts as a failure for the breaker.
    pub slow_call_ms: u64,
    /// Concurrent calls; the next one degrades at once.
    pub max_concurrent: u32,
    pub min_calls: Option<u32>,
    pub failure_ratio: Option<f64>,
    pub cool_down_ms: Option<u64>,
    /// Outbound quota in calls per second (external APIs), and its burst.
    pub quota_per_sec: Option<f64>,
    pub quota_burst: Option<u32>,
    /// Retry transient failures (idempotent upstream reads only).
    #[serde(default)]
    pub retry: bool,
    /// Each item's own limit on loads toward this API (external APIs only): loads per second
    /// per item (0: off), its burst, and how many items are tracked at once.
    pub hot_item_per_sec: Option<f64>,
    pub hot_item_burst: Option<u32>,
    pub hot_item_max_items: Option<u64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetrySettings {
    pub max_per_request: u32,
    pub ratio: f64,
    pub max_saved: u32,
    pub base_backoff_ms: u64,
    pub max_backoff_ms: u64,
}

fn enabled() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SheddingSettings {
    pub enabled: bool,
    /// Optional throughput cap (0: none; overload is seen from queueing and latency).
    pub capacity_rps: u32,
    /// The standing runtime queue delay that counts as full load (CoDel's target).
    pub queue_delay_target_ms: u64,
    /// How often the queue-delay probe runs.
    pub queue_probe_ms: u64,
    /// Count the wait in the API listener's kernel accept queue (Linux) in the queue delay.
    #[serde(default = "enabled")]
    pub accept_queue: bool,
    pub max_in_flight: u32,
    pub min_in_flight: u32,
    pub adaptive: bool,
    pub thresholds: [f64; 3],
    pub hysteresis: f64,
    pub min_dwell_ms: u64,
    pub interval_ms: u64,
    /// Level 2 multiplies each tier's timeout by its factor.
    pub core_timeout_factor: f64,
    pub normal_timeout_factor: f64,
    pub edge_timeout_factor: f64,
    /// Level 3 answers misses 503 with a `Retry-After` drawn uniformly from this range.
    pub retry_after_min_secs: u32,
    pub retry_after_max_secs: u32,
    /// A level (0–3) held whatever the load, as `POST /admin/v1/shed-level` pins one; unset:
    /// follow the load. Meant for live rules (a sale's first minutes at level 1).
    #[serde(default)]
    pub pinned_level: Option<u8>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientLimitSettings {
    pub enabled: bool,
    pub per_sec: f64,
    pub burst: u32,
    /// Clients tracked at once; beyond it the least recently seen start over.
    pub max_clients: u64,
    pub idle_secs: u64,
    /// Proxies in front of the service that append to `X-Forwarded-For`; the client address is
    /// the entry this many places from the right. 0 ignores the header (use the peer address).
    pub trusted_proxy_hops: u32,
    /// Whose requests a client's bucket counts: this instance's, or the fleet's (in Redis).
    pub scope: LimitScope,
    /// With `scope = "fleet"`: tokens a grant takes beyond the request that asked, for the
    /// client's next requests.
    pub lease_ahead: u32,
}

/// Where a limit's buckets live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitScope {
    Instance,
    Fleet,
}

/// The four guarded dependencies, with their config section names.
const DEPENDENCIES: [(&str, &str); 4] = [
    ("mysql", "resilience.mysql"),
    ("redis", "resilience.redis"),
    ("coupons", "resilience.coupons"),
    ("extras", "resilience.extras"),
];

impl ResilienceSettings {
    pub(crate) fn dependency(&self, name: &str) -> &DependencySettings {
        match name {
            "mysql" => &self.mysql,
            "redis" => &self.redis,
            "coupons" => &self.coupons,
            _ => &self.extras,
        }
    }

    pub fn breaker_config(&self, dependency: &DependencySettings) -> BreakerConfig {
        let defaults = &self.breaker;
        let cool_down =
            Duration::from_millis(dependency.cool_down_ms.unwrap_or(defaults.cool_down_ms));
        BreakerConfig {
            window: Duration::from_secs(defaults.window_secs),
            buckets: defaults.buckets,
            failure_ratio: dependency.failure_ratio.unwrap_or(defaults.failure_ratio),
            min_calls: dependency.min_calls.unwrap_or(defaults.min_calls),
            slow_call: Duration::from_millis(dependency.slow_call_ms),
            cool_down,
            max_cool_down: Duration::from_millis(defaults.max_cool_down_ms),
            probe_stages: defaults.probe_stages,
        }
    }

    pub fn retry_config(&self) -> RetryConfig {
        let retry = &self.retry;
        RetryConfig {
            max_per_request: retry.max_per_request,
            ratio: retry.ratio,
            max_saved: retry.max_saved,
            base_backoff: Duration::from_millis(retry.base_backoff_ms),
            max_backoff: Duration::from_millis(retry.max_backoff_ms),
        }
    }

    pub(crate) fn quota(dependency: &DependencySettings) -> Option<RateConfig> {
        dependency.quota_per_sec.map(|per_second| RateConfig {
            per_second,
            // A tenth of a second's worth unless set: burst + rate stays near the contract.
            burst: dependency
                .quota_burst
                .unwrap_or_else(|| ((per_second / 10.0).ceil() as u32).max(1)),
        })
    }

    /// The per-item limit on loads, `None` when off (`hot_item_per_sec` unset or 0).
    pub(crate) fn hot_items(dependency: &DependencySettings) -> Option<HotItemConfig> {
        let per_second = dependency.hot_item_per_sec.filter(|rate| *rate != 0.0)?;
        Some(HotItemConfig {
            rate: RateConfig {
                per_second,
                burst: dependency.hot_item_burst.unwrap_or(1),
            },
            max_items: dependency
                .hot_item_max_items
                .unwrap_or(Self::HOT_ITEM_MAX_ITEMS),
        })
    }

    /// Items tracked by a per-item limit unless set: at the default quota (45 calls a second of
    /// up to 40 items) about 1,800 items load in a second and are kept for their bucket's
    /// refill (3 s), so this leaves room several times over for a few MiB.
    const HOT_ITEM_MAX_ITEMS: u64 = 16_384;

    fn validate_hot_items(
        field: &'static str,
        dependency: &DependencySettings,
    ) -> Result<(), ConfigError> {
        let set = dependency.hot_item_per_sec.is_some()
            || dependency.hot_item_burst.is_some()
            || dependency.hot_item_max_items.is_some();
        if !set {
            return Ok(());
        }
        if !matches!(field, "resilience.coupons" | "resilience.extras") {
            return Err(invalid(
                field,
                "hot_item_* limits loads of the external APIs (coupons, extras) only; the store's \
                 loads are bounded by store.max_concurrent_loads",
            ));
        }
        let Some(per_second) = dependency.hot_item_per_sec else {
            return Err(invalid(
                field,
                "hot_item_burst / hot_item_max_items are set without hot_item_per_sec",
            ));
        };
        if per_second == 0.0 {
            return Ok(());
        }
        if let Some(config) = Self::hot_items(dependency) {
            config
                .rate
                .validate()
                .map_err(|reason| invalid(field, format!("hot_item: {reason}")))?;
            if !(1..=10_000_000).contains(&config.max_items) {
                return Err(invalid(
                    field,
                    format!(
                        "hot_item_max_items {} is outside 1..=10000000",
                        config.max_items
                    ),
                ));
            }
        }
        Ok(())
    }

    pub fn shed_config(&self) -> ShedConfig {
        let shedding = &self.shedding;
        ShedConfig {
            capacity_rps: shedding.capacity_rps,
            queue_delay_target: Duration::from_millis(shedding.queue_delay_target_ms),
            queue_probe_every: Duration::from_millis(shedding.queue_probe_ms),
            max_in_flight: shedding.max_in_flight,
            min_in_flight: shedding.min_in_flight,
            adaptive: shedding.adaptive,
            thresholds: shedding.thresholds,
            hysteresis: shedding.hysteresis,
            min_dwell: Duration::from_millis(shedding.min_dwell_ms),
            interval: Duration::from_millis(shedding.interval_ms),
        }
    }

    pub fn client_rate(&self) -> RateConfig {
        RateConfig {
            per_second: self.client_limit.per_sec,
            burst: self.client_limit.burst,
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        self.fleet.validate()?;
        for (name, field) in DEPENDENCIES {
            let dependency = self.dependency(name);
            self.breaker_config(dependency)
                .validate()
                .map_err(|reason| invalid(field, reason))?;
            if !(1..=100_000).contains(&dependency.max_concurrent) {
                return Err(invalid(
                    field,
                    format!(
                        "max_concurrent {} is outside 1..=100000",
                        dependency.max_concurrent
                    ),
                ));
            }
            if dependency.quota_burst.is_some() && dependency.quota_per_sec.is_none() {
                return Err(invalid(field, "quota_burst is set without quota_per_sec"));
            }
            if let Some(rate) = Self::quota(dependency) {
                rate.validate()
                    .map_err(|reason| invalid(field, format!("quota: {reason}")))?;
            }
            Self::validate_hot_items(field, dependency)?;
        }
        for (field, retry) in [
            ("resilience.mysql.retry", self.mysql.retry),
            ("resilience.redis.retry", self.redis.retry),
        ] {
            if retry {
                return Err(invalid(
                    field,
                    "retry is only for idempotent upstream reads (coupons, extras); the store and \
                     the cache tier are never retried",
                ));
            }
        }
        if self.retry.max_saved == 0 {
            return Err(invalid(
                "resilience.retry.max_saved",
                "must be at least 1 (0 would forbid every retry; set max_per_request = 0 for that)",
            ));
        }
        self.retry_config()
            .validate()
            .map_err(|reason| invalid("resilience.retry", reason))?;
        self.shed_config()
            .validate()
            .map_err(|reason| invalid("resilience.shedding", reason))?;
        let shedding = &self.shedding;
        for (field, factor) in [
            (
                "resilience.shedding.core_timeout_factor",
                shedding.core_timeout_factor,
            ),
            (
                "resilience.shedding.normal_timeout_factor",
                shedding.normal_timeout_factor,
            ),
            (
                "resilience.shedding.edge_timeout_factor",
                shedding.edge_timeout_factor,
            ),
        ] {
            if !(factor > 0.0 && factor <= 1.0) {
                return Err(invalid(field, format!("{factor} is outside (0, 1]")));
            }
        }
        if shedding.retry_after_min_secs == 0
            || shedding.retry_after_min_secs > shedding.retry_after_max_secs
            || shedding.retry_after_max_secs > 3_600
        {
            return Err(invalid(
                "resilience.shedding.retry_after_min_secs",
                format!(
                    "need 1 ≤ retry_after_min_secs ({}) ≤ retry_after_max_secs ({}) ≤ 3600",
                    shedding.retry_after_min_secs, shedding.retry_after_max_secs
                ),
            ));
        }
        if let Some(level) = shedding.pinned_level {
            ensure_in("resilience.shedding.pinned_level", level, 0..=3)?;
        }
        self.admission_wait.validate()?;
        let client = &self.client_limit;
        self.client_rate()
            .validate()
            .map_err(|reason| invalid("resilience.client_limit", reason))?;
        ensure_in(
            "resilience.client_limit.max_clients",
            client.max_clients,
            1..=10_000_000,
        )?;
        ensure_in(
            "resilience.client_limit.idle_secs",
            client.idle_secs,
            1..=86_400,
        )?;
        ensure_in(
            "resilience.client_limit.lease_ahead",
            client.lease_ahead,
            0..=1_000,
        )?;
        if client.trusted_proxy_hops > 10 {
            return Err(invalid(
                "resilience.client_limit.trusted_proxy_hops",
                format!("{} is above 10", client.trusted_proxy_hops),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::Settings;
    use crate::config::ConfigError;

    fn refused(change: impl FnOnce(&mut Settings)) -> String {
        let mut settings = Settings::defaults().unwrap();
        change(&mut settings);
        match settings.validate() {
            Err(error @ ConfigError::Invalid { .. }) => error.to_string(),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn the_embedded_defaults_are_valid() {
        Settings::defaults().unwrap().validate().unwrap();
    }

    #[test]
    fn hot_item_limits_default_to_one_load_a_second_and_turn_off_at_zero() {
        use crate::config::ResilienceSettings;
        let mut settings = Settings::defaults().unwrap();
        let coupons = ResilienceSettings::hot_items(&settings.resilience.coupons).unwrap();
        assert_eq!(
            (
                coupons.rate.per_second,
                coupons.rate.burst,
                coupons.max_items
            ),
            (1.0, 3, 16_384)
        );
        assert!(ResilienceSettings::hot_items(&settings.resilience.extras).is_some());
        assert!(ResilienceSettings::hot_items(&settings.resilience.mysql).is_none());
        settings.resilience.coupons.hot_item_per_sec = Some(0.0);
        assert!(ResilienceSettings::hot_items(&settings.resilience.coupons).is_none());
        settings.validate().unwrap();
    }

    #[test]
    fn bad_thresholds_are_refused_naming_the_key() {
        let message = refused(|s| s.resilience.coupons.failure_ratio = Some(1.5));
        assert!(message.contains("resilience.coupons"), "{message}");
        assert!(message.contains("failure_ratio"), "{message}");

        let message = refused(|s| s.resilience.mysql.max_concurrent = 0);
        assert!(
            message.contains("resilience.mysql: max_concurrent"),
            "{message}"
        );

        let message = refused(|s| s.resilience.extras.quota_per_sec = Some(0.0));
        assert!(message.contains("resilience.extras: quota"), "{message}");

        let message = refused(|s| s.resilience.coupons.hot_item_per_sec = Some(-1.0));
        assert!(
            message.contains("resilience.coupons: hot_item"),
            "{message}"
        );

        let message = refused(|s| s.resilience.extras.hot_item_burst = Some(0));
        assert!(message.contains("resilience.extras: hot_item"), "{message}");

        let message = refused(|s| s.resilience.mysql.hot_item_per_sec = Some(1.0));
        assert!(message.contains("external APIs"), "{message}");

        let message = refused(|s| s.resilience.redis.retry = true);
        assert!(
            message.contains("only for idempotent upstream reads"),
            "{message}"
        );

        let message = refused(|s| s.resilience.retry.max_per_request = 3);
        assert!(message.contains("resilience.retry"), "{message}");

        let message = refused(|s| s.resilience.shedding.thresholds = [0.9, 0.8, 1.0]);
        assert!(message.contains("resilience.shedding"), "{message}");

        let message = refused(|s| s.resilience.shedding.core_timeout_factor = 0.0);
        assert!(message.contains("core_timeout_factor"), "{message}");

        let message = refused(|s| s.resilience.shedding.retry_after_min_secs = 10);
        assert!(message.contains("retry_after_min_secs"), "{message}");

        let message = refused(|s| s.resilience.admission_wait.prefetch_max_wait_ms = 0);
        assert!(
            message.contains("resilience.admission_wait: prefetch: max_wait"),
            "{message}"
        );

        let message = refused(|s| s.resilience.admission_wait.list_max_waiters = 100_001);
        assert!(message.contains("max_waiters"), "{message}");

        let message = refused(|s| s.resilience.admission_wait.prefetch_max_wait_ms = 1_200);
        assert!(
            message.contains("capped by the request's deadline"),
            "{message}"
        );

        let message = refused(|s| s.resilience.client_limit.burst = 0);
        assert!(message.contains("resilience.client_limit"), "{message}");

        let message = refused(|s| s.resilience.client_limit.trusted_proxy_hops = 11);
        assert!(message.contains("trusted_proxy_hops"), "{message}");
    }
}
