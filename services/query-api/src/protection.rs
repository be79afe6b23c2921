//! The service's protection: a guard per dependency, the load shedder (with the deferrable
//! classes' admission queue beside it) and the per-client limiter, built once from
//! `[resilience]` (`crate::config::resilience`) and shared by the edge, the loaders and the
//! admin status.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use rebate_guard::{
    CallObserver, DependencyConfig, DependencyGuard, DependencySnapshot, FleetKeyedLimiter,
    FleetQuotaConfig, FleetTokens, QuotaScope,
};
use rebate_resilience::{
    AdmissionQueue, AdmissionQueueSnapshot, KeyedLimiter, LoadShedder, RequestClass, ShedLevel,
    ShedSnapshot, Ticker,
};
use serde::Serialize;

use crate::config::ResilienceSettings;
use crate::config::resilience::{LimitScope, SheddingSettings};

/// Every guard of the running service.
#[derive(Debug)]
pub struct Protection {
    pub mysql: Arc<DependencyGuard>,
    pub redis: Arc<DependencyGuard>,
    pub coupons: Arc<DependencyGuard>,
    pub extras: Arc<DependencyGuard>,
    /// `None` when shedding is disabled.
    pub shedder: Option<LoadShedder>,
    /// Where requests of the deferrable classes wait for admission while the service is over
    /// its limit (`[resilience.admission_wait]`); `None` when shedding is off or no class waits.
    pub admission_queue: Option<AdmissionQueue>,
    pub clients: Option<ClientLimiter>,
    /// Level 3's `Retry-After` range in seconds, packed (min in the high half) so a rule set
    /// swaps both at once.
    retry_after_secs: AtomicU64,
    /// Requests refused outright by their class's place at the shed level, per class (lowest
    /// first, as [`RequestClass::ALL`]).
    refused_by_class: [AtomicU64; 3],
    /// The settings in force (a rule set replaces them, `Protection::reconfigure`).
    settings: ArcSwap<ResilienceSettings>,
    /// The fleet's quota handle the external APIs' guards were built with, for their new
    /// configurations.
    fleet_quota: Option<FleetQuotaConfig>,
}

fn pack(min: u32, max: u32) -> u64 {
    (u64::from(min) << 32) | u64::from(max)
}

/// The per-client token buckets and how a client is identified.
#[derive(Debug)]
pub struct ClientLimiter {
    pub limiter: ClientBuckets,
    pub trusted_proxy_hops: u32,
}

/// Where the clients' buckets live (`resilience.client_limit.scope`).
#[derive(Debug)]
pub enum ClientBuckets {
    /// This instance's: a client gets the limit from every instance it reaches.
    Instance(KeyedLimiter),
    /// The fleet's, in Redis, leased ahead in small batches.
    Fleet(FleetKeyedLimiter),
}

/// How long tokens leased ahead for a client stay usable.
const CLIENT_LEASE_TTL: Duration = Duration::from_secs(1);

impl ClientBuckets {
    /// Takes a token of `key`'s bucket, or says how long until one may be there.
    pub async fn try_acquire(&self, key: &str) -> Result<(), Duration> {
        match self {
            ClientBuckets::Instance(limiter) => limiter
                .try_acquire(key)
                .map_err(|exceeded| exceeded.retry_after),
            // Boxed: its Redis round trip is a large future, and this one is part of every
            // request's, in the instance scope too.
            ClientBuckets::Fleet(limiter) => Box::pin(limiter.try_acquire(key)).await,
        }
    }

    /// The instance's buckets, which answer without waiting (`None` for the fleet's, which may
    /// wait on Redis).
    pub fn instance(&self) -> Option<&KeyedLimiter> {
        match self {
            ClientBuckets::Instance(limiter) => Some(limiter),
            ClientBuckets::Fleet(_) => None,
        }
    }

    /// Clients tracked (approximate) and requests refused since start.
    pub fn stats(&self) -> (u64, u64) {
        match self {
            ClientBuckets::Instance(limiter) => limiter.stats(),
            ClientBuckets::Fleet(limiter) => limiter.stats(),
        }
    }

    pub fn scope(&self) -> QuotaScope {
        match self {
            ClientBuckets::Instance(_) => QuotaScope::Instance,
            ClientBuckets::Fleet(_) => QuotaScope::Fleet,
        }
    }
}

impl Protection {
    /// Builds every guard; `settings` must have passed [`ResilienceSettings::validate`].
    /// `timeouts` are each dependency's attempt timeouts (the part tiers; none for Redis, whose
    /// client enforces its command timeout).
    /// With `fleet`, the quotas of the external APIs (`resilience.fleet.quotas`) and the
    /// per-client limit (`scope = "fleet"`) are drawn from the fleet's buckets.
    /// The embedded defaults' guards, 1 s attempt timeouts, on `ticker`, with no observer and
    /// no fleet: what unit tests that need a whole `Protection` use.
    #[cfg(test)]
    pub(crate) fn for_tests(ticker: Arc<dyn Ticker>) -> Self {
        let settings = crate::Settings::defaults().expect("embedded defaults");
        Self::new(
            &settings.resilience,
            DependencyTimeouts {
                mysql: Duration::from_secs(1),
                coupons: Duration::from_secs(1),
                extras: Duration::from_secs(1),
            },
            ticker,
            None,
            None,
        )
    }

    pub fn new(
        settings: &ResilienceSettings,
        timeouts: DependencyTimeouts,
        ticker: Arc<dyn Ticker>,
        observer: Option<Arc<dyn CallObserver>>,
        fleet: Option<Arc<dyn FleetTokens>>,
    ) -> Self {
        let fleet_quota = fleet
            .clone()
            .filter(|_| settings.fleet.quotas)
            .map(|tokens| {
                FleetQuotaConfig::for_contract(
                    tokens,
                    settings.fleet.max_lease,
                    Duration::from_millis(settings.fleet.retry_after_failure_ms),
                )
            });
        let guard = |name: &'static str, timeout: Option<Duration>| {
            let config = settings.dependency(name);
            let dependency = DependencyGuard::new(
                name,
                DependencyConfig {
                    breaker: settings.breaker_config(config),
                    max_concurrent: config.max_concurrent,
                    quota: ResilienceSettings::quota(config),
                    fleet_quota: fleet_quota.clone(),
                    retry: config.retry.then(|| settings.retry_config()),
                    timeout,
                },
                Arc::clone(&ticker),
            );
            // Each item's own share of the loads toward an external API, taken before its
            // quota (`rebate_guard::hot`).
            let dependency = match ResilienceSettings::hot_items(config) {
                Some(hot_items) => dependency.with_hot_items(hot_items),
                None => dependency,
            };
            Arc::new(match &observer {
                Some(observer) => dependency.with_observer(Arc::clone(observer)),
                None => dependency,
            })
        };
        let shedding = &settings.shedding;
        let client = &settings.client_limit;
        Self {
            mysql: guard("mysql", Some(timeouts.mysql)),
            redis: guard("redis", None),
            coupons: guard("coupons", Some(timeouts.coupons)),
            extras: guard("extras", Some(timeouts.extras)),
            shedder: shedding
                .enabled
                .then(|| LoadShedder::new(settings.shed_config(), Arc::clone(&ticker))),
            admission_queue: (shedding.enabled && settings.admission_wait.any()).then(|| {
                AdmissionQueue::new(settings.admission_wait.wait_config(), Arc::clone(&ticker))
            }),
            clients: client.enabled.then(|| {
                let idle = Duration::from_secs(client.idle_secs);
                let fleet = fleet.filter(|_| client.scope == LimitScope::Fleet);
                let limiter = match fleet {
                    None => ClientBuckets::Instance(KeyedLimiter::new(
                        settings.client_rate(),
                        client.max_clients,
                        idle,
                        Arc::clone(&ticker),
                    )),
                    Some(tokens) => ClientBuckets::Fleet(FleetKeyedLimiter::new(
                        settings.client_rate(),
                        FleetQuotaConfig {
                            tokens,
                            max_lease: 1 + client.lease_ahead,
                            retry_after_failure: Duration::from_millis(
                                settings.fleet.retry_after_failure_ms,
                            ),
                            lease_ahead: client.lease_ahead,
                            lease_ttl: CLIENT_LEASE_TTL,
                        },
                        client.max_clients,
                        idle,
                        Arc::clone(&ticker),
                    )),
                };
                ClientLimiter {
                    limiter,
                    trusted_proxy_hops: client.trusted_proxy_hops,
                }
            }),
            retry_after_secs: AtomicU64::new(pack(
                shedding.retry_after_min_secs,
                shedding.retry_after_max_secs,
            )),
            refused_by_class: Default::default(),
            settings: ArcSwap::from_pointee(settings.clone()),
            fleet_quota,
        }
    }

    /// Puts a rule set's values in force in every guard, keeping their state: breakers keep
    /// their state (and window, unless its length changes), bulkheads and quotas resize in
    /// place, the shedder keeps its level and measurements, waiters keep their place.
    /// `settings` must have passed [`ResilienceSettings::validate`] and differ from the file's
    /// only in live keys (`crate::rules`); whatever a guard cannot change at runtime is logged.
    pub fn reconfigure(&self, settings: &ResilienceSettings, timeouts: DependencyTimeouts) {
        for (guard, timeout) in [
            (&self.mysql, Some(timeouts.mysql)),
            (&self.redis, None),
            (&self.coupons, Some(timeouts.coupons)),
            (&self.extras, Some(timeouts.extras)),
        ] {
            let config = settings.dependency(guard.name());
            let mut kept = guard.reconfigure(DependencyConfig {
                breaker: settings.breaker_config(config),
                max_concurrent: config.max_concurrent,
                quota: ResilienceSettings::quota(config),
                fleet_quota: self.fleet_quota.clone(),
                retry: config.retry.then(|| settings.retry_config()),
                timeout,
            });
            if let Some(hot_items) = ResilienceSettings::hot_items(config) {
                kept.fields
                    .extend(guard.reconfigure_hot_items(hot_items).fields);
            }
            if !kept.is_empty() {
                tracing::warn!(dependency = guard.name(), restart_only = ?kept.fields, "these values take a restart");
            }
        }
        if let Some(shedder) = &self.shedder {
            let kept = shedder.reconfigure(&settings.shed_config());
            if !kept.is_empty() {
                tracing::warn!(restart_only = ?kept.fields, "these shedding values take a restart");
            }
            // Only a change of the rule set's pin moves the level: a version that leaves it as
            // it was must not release a level an operator pinned for a drill
            // (`PUT /admin/v1/shedding`).
            let pinned = settings.shedding.pinned_level;
            if pinned != self.settings.load().shedding.pinned_level {
                shedder.force(pinned.and_then(ShedLevel::from_u8));
            }
        }
        if let Some(queue) = &self.admission_queue {
            queue.reconfigure(settings.admission_wait.wait_config());
        }
        if let Some(clients) = &self.clients {
            match &clients.limiter {
                ClientBuckets::Instance(limiter) => limiter.set_rate(settings.client_rate()),
                ClientBuckets::Fleet(limiter) => limiter.set_rate(settings.client_rate()),
            }
        }
        let shedding = &settings.shedding;
        self.retry_after_secs.store(
            pack(shedding.retry_after_min_secs, shedding.retry_after_max_secs),
            Ordering::Relaxed,
        );
        self.settings.store(Arc::new(settings.clone()));
        self.notify_waiters();
    }

    fn retry_after_range(&self) -> (u32, u32) {
        let packed = self.retry_after_secs.load(Ordering::Relaxed);
        ((packed >> 32) as u32, packed as u32)
    }

    /// The level to serve the next request at (Normal when shedding is off).
    pub fn level(&self) -> ShedLevel {
        self.shedder
            .as_ref()
            .map_or(ShedLevel::Normal, LoadShedder::level)
    }

    /// A `Retry-After` for a shed request, jittered so that refused clients do not come back
    /// together.
    pub fn shed_retry_after(&self) -> u32 {
        let (min, max) = self.retry_after_range();
        rand::random_range(min..=max)
    }

    /// Capacity may have freed (a request ended, the level was changed): the first waiter for
    /// admission, if any, tries again. One atomic load when nobody waits.
    pub fn notify_waiters(&self) {
        if let Some(queue) = &self.admission_queue {
            queue.notify();
        }
    }

    /// Counts a request refused because its class gives way at the current level.
    pub fn count_refused(&self, class: RequestClass) {
        self.refused_by_class[class as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Requests refused by class, lowest class first.
    pub fn refused_by_class(&self) -> [(RequestClass, u64); 3] {
        RequestClass::ALL.map(|class| {
            (
                class,
                self.refused_by_class[class as usize].load(Ordering::Relaxed),
            )
        })
    }

    pub fn dependencies(&self) -> [&Arc<DependencyGuard>; 4] {
        [&self.mysql, &self.redis, &self.coupons, &self.extras]
    }

    pub fn status(&self) -> ProtectionStatus {
        let settings = self.settings.load();
        let retry_after = self.retry_after_range();
        ProtectionStatus {
            shedding: self.shedder.as_ref().map(LoadShedder::snapshot),
            admission_wait: self.admission_queue.as_ref().map(AdmissionQueue::snapshot),
            shedding_thresholds: settings.shedding.clone(),
            dependencies: self
                .dependencies()
                .iter()
                .map(|dependency| dependency.snapshot())
                .collect(),
            client_limit: self.clients.as_ref().map(|clients| {
                let (tracked, refused) = clients.limiter.stats();
                ClientLimitStatus {
                    scope: clients.limiter.scope(),
                    per_sec: settings.client_limit.per_sec,
                    burst: settings.client_limit.burst,
                    trusted_proxy_hops: clients.trusted_proxy_hops,
                    clients_tracked: tracked,
                    refused,
                }
            }),
            level2_timeout_factors: [
                settings.shedding.core_timeout_factor,
                settings.shedding.normal_timeout_factor,
                settings.shedding.edge_timeout_factor,
            ],
            shed_retry_after_secs: [retry_after.0, retry_after.1],
            refused_by_class: self
                .refused_by_class()
                .into_iter()
                .map(|(class, refused)| (class.as_str(), refused))
                .collect(),
        }
    }
}

/// The attempt timeout of each dependency that has one.
#[derive(Debug, Clone, Copy)]
pub struct DependencyTimeouts {
    pub mysql: Duration,
    pub coupons: Duration,
    pub extras: Duration,
}

impl DependencyTimeouts {
    /// The parts' timeouts: the store's is the longer of the product's and the rate's.
    pub fn of(settings: &crate::Settings) -> Self {
        let timeouts = settings.part_timeouts();
        Self {
            mysql: timeouts.product.max(timeouts.rate),
            coupons: timeouts.coupons,
            extras: timeouts.extras,
        }
    }
}

/// `GET /admin/v1/status`'s protection section: current values and the thresholds behind them.
#[derive(Debug, Serialize)]
pub struct ProtectionStatus {
    pub shedding: Option<ShedSnapshot>,
    /// The deferrable classes' admission queues: waiting now, bounds, outcomes and waits.
    pub admission_wait: Option<AdmissionQueueSnapshot>,
    /// `[resilience.shedding]` as configured.
    pub shedding_thresholds: SheddingSettings,
    pub dependencies: Vec<DependencySnapshot>,
    pub client_limit: Option<ClientLimitStatus>,
    /// Core, normal and edge timeout factors at level 2.
    pub level2_timeout_factors: [f64; 3],
    pub shed_retry_after_secs: [u32; 2],
    /// Requests refused outright because their class gives way at the level (`prefetch` from
    /// level 2), by class.
    pub refused_by_class: BTreeMap<&'static str, u64>,
}

#[derive(Debug, Serialize)]
pub struct ClientLimitStatus {
    pub scope: QuotaScope,
    pub per_sec: f64,
    pub burst: u32,
    pub trusted_proxy_hops: u32,
    pub clients_tracked: u64,
    pub refused: u64,
}
