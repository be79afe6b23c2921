//! Outbound quotas: one instance's token bucket, or a bucket the whole fleet draws from.
//!
//! An external API's contract counts the calls of every instance together. With a
//! [`FleetQuotaConfig`], the guard takes its tokens from a fleet-wide bucket ([`FleetTokens`]:
//! one atomic script per grant in Redis) instead of its own. Calls that find no token wait their
//! turn for one grant, which takes a token for each of them at once (at most `max_lease`): a small
//! batch, used the moment it arrives, so the fleet never makes more calls in a second than the
//! bucket grants (`burst + per_second`). An empty bucket is remembered until its next token, so
//! a refused call costs no round trip. When the bucket cannot be reached, the instance falls back
//! to its share: its turns on the fleet's clock ([`crate::share`]), so that the live instances
//! together stay within the quota however many they are, and asks the fleet again after
//! `retry_after_failure`.
//!
//! Cache hits never reach a quota; only the calls to the API do, so a round trip per grant costs
//! the API's latency a fraction of a millisecond.
//!
//! The same bucket serves a per-client limit that holds for the fleet ([`FleetKeyedLimiter`]):
//! one bucket per client, each grant taking `lease_ahead` tokens more for the client's next
//! requests, kept for `lease_ttl`.
//!
//! The rate changes in place: a fleet quota reads it from a [`LiveRate`] on each grant (a
//! per-client limit's buckets share one), so the next grant asks the fleet's bucket at the new
//! rate, and the instance's share follows it the next time it is used. The lease settings of a
//! [`FleetQuotaConfig`] are fixed when the quota is built.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use rebate_resilience::{KeyedSlots, LiveRate, RateConfig, Ticker, TokenBucket};
use serde::Serialize;

use crate::share::{FleetPosition, TurnShare};

/// Grants tokens of fleet-wide buckets: Redis in the service, an in-process fake in tests.
#[async_trait]
pub trait FleetTokens: Send + Sync + fmt::Debug + 'static {
    /// Takes up to `want` tokens from the fleet's bucket `bucket`, which refills at `rate`.
    /// An error means the bucket could not be reached (the caller falls back to its share).
    async fn take(&self, bucket: &str, rate: RateConfig, want: u32) -> Result<FleetGrant, String>;

    /// How many instances share the buckets, as last seen (at least 1).
    fn live_instances(&self) -> u32;

    /// This instance's place among them (from 0), as last seen: which turns of a share are its.
    fn rank(&self) -> u32 {
        0
    }

    /// What to add to the guards' ticker to read the fleet's clock (the hosts' wall clock), in
    /// nanoseconds: the turns of a share are cut on it.
    fn clock_offset_nanos(&self) -> i64 {
        0
    }

    /// [`FleetTokens::live_instances`], [`FleetTokens::rank`] and
    /// [`FleetTokens::clock_offset_nanos`] together.
    fn position(&self) -> FleetPosition {
        FleetPosition {
            live: self.live_instances().max(1),
            rank: self.rank(),
            clock_offset_nanos: self.clock_offset_nanos(),
        }
    }
}

/// Tokens taken from a fleet-wide bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FleetGrant {
    pub granted: u32,
    /// When fewer were granted than asked for: how long until the next token.
    pub retry_after: Duration,
}

/// How a dependency's quota holds for the whole fleet.
#[derive(Debug, Clone)]
pub struct FleetQuotaConfig {
    pub tokens: Arc<dyn FleetTokens>,
    /// The most tokens one grant takes, for the calls waiting at that moment (at least 1).
    pub max_lease: u32,
    /// After the fleet's bucket could not be reached, how long the instance uses its share
    /// before it asks the fleet again.
    pub retry_after_failure: Duration,
    /// Tokens a grant takes beyond the calls waiting, for the calls to come (a per-client limit,
    /// where one client's requests come one after another); 0 for an API's contract, whose
    /// tokens are used the moment they are granted.
    pub lease_ahead: u32,
    /// Unclaimed tokens of a grant are dropped after this long (their callers gave up, or the
    /// calls they were taken ahead for did not come).
    pub lease_ttl: Duration,
}

impl FleetQuotaConfig {
    /// A contract's quota: a grant for the calls waiting, used at once, kept at most 100 ms.
    pub fn for_contract(
        tokens: Arc<dyn FleetTokens>,
        max_lease: u32,
        retry_after_failure: Duration,
    ) -> Self {
        Self {
            tokens,
            max_lease,
            retry_after_failure,
            lease_ahead: 0,
            lease_ttl: Duration::from_millis(100),
        }
    }
}

/// A dependency's outbound quota.
#[derive(Debug)]
pub(crate) enum Quota {
    /// This instance's own bucket.
    Local(TokenBucket),
    Fleet(FleetQuota),
}

impl Quota {
    pub(crate) fn new(
        rate: RateConfig,
        fleet: Option<FleetQuotaConfig>,
        name: &'static str,
    ) -> Self {
        match fleet {
            None => Quota::Local(TokenBucket::new(rate)),
            Some(config) => Quota::Fleet(FleetQuota::new(
                Arc::from(name),
                Arc::new(LiveRate::new(rate)),
                config,
            )),
        }
    }

    /// Makes `rate` the quota's rate at `now_nanos`: this instance's bucket keeps the tokens it
    /// holds; a fleet quota's next grant asks at the new rate.
    pub(crate) fn set_rate(&self, rate: RateConfig, now_nanos: u64) {
        match self {
            Quota::Local(bucket) => bucket.set_rate_at(rate, now_nanos),
            Quota::Fleet(fleet) => fleet.rate.set(rate),
        }
    }

    /// The fleet quota's settings; `None` for this instance's own bucket.
    pub(crate) fn fleet_config(&self) -> Option<&FleetQuotaConfig> {
        match self {
            Quota::Local(_) => None,
            Quota::Fleet(fleet) => Some(&fleet.config),
        }
    }

    /// Takes a token for a call starting at `now_nanos`; false when the quota is spent.
    pub(crate) async fn acquire(&self, ticker: &dyn Ticker) -> bool {
        match self {
            Quota::Local(bucket) => bucket.try_acquire_at(ticker.now_nanos()).is_ok(),
            Quota::Fleet(fleet) => fleet.acquire(ticker).await.is_ok(),
        }
    }

    /// How long from `now_nanos` until a call would get a token (advisory, takes nothing).
    pub(crate) fn wait(&self, now_nanos: u64) -> Duration {
        match self {
            Quota::Local(bucket) => bucket.wait_at(now_nanos),
            Quota::Fleet(fleet) => fleet.wait(now_nanos),
        }
    }

    /// Whether a call starting now would get a token (advisory, takes nothing).
    pub(crate) fn ready(&self, now_nanos: u64) -> bool {
        match self {
            Quota::Local(bucket) => bucket.has_token_at(now_nanos),
            Quota::Fleet(fleet) => fleet.ready(now_nanos),
        }
    }

    pub(crate) fn snapshot(&self) -> QuotaSnapshot {
        match self {
            Quota::Local(bucket) => {
                let rate = bucket.rate();
                let (granted, refused) = bucket.counts();
                QuotaSnapshot {
                    scope: QuotaScope::Instance,
                    per_second: rate.per_second,
                    burst: rate.burst,
                    granted,
                    refused,
                    fleet: None,
                }
            }
            Quota::Fleet(fleet) => fleet.snapshot(),
        }
    }
}

/// Whose calls a quota counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum QuotaScope {
    Instance,
    Fleet,
}

/// A quota as the status page shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QuotaSnapshot {
    pub scope: QuotaScope,
    pub per_second: f64,
    pub burst: u32,
    /// Calls that got a token (from the fleet's bucket or, while it was away, from the share).
    pub granted: u64,
    pub refused: u64,
    pub fleet: Option<FleetSnapshot>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetSnapshot {
    /// Instances sharing the bucket, as last seen in the registry.
    pub live_instances: u32,
    /// Whether the last grant reached the fleet's bucket.
    pub reachable: bool,
    /// Round trips to the fleet's bucket.
    pub grants: u64,
    /// Calls that got a token from this instance's share while the bucket was away.
    pub granted_from_share: u64,
}

/// A quota drawn from a fleet-wide bucket; see the module documentation.
pub(crate) struct FleetQuota {
    /// The bucket's name in the fleet (an API's, or a client's).
    name: Arc<str>,
    /// Read on each grant; a per-client limit's buckets share theirs.
    rate: Arc<LiveRate>,
    config: FleetQuotaConfig,
    /// Tokens of the last grant not yet claimed by the calls that waited for it.
    pool: AtomicU32,
    /// When the pool's tokens are dropped, in ticker nanoseconds.
    pool_expires: AtomicU64,
    /// The bucket said it was empty until then: calls are refused without a round trip.
    empty_until: AtomicU64,
    /// The bucket could not be reached: the share answers until then.
    unreachable_until: AtomicU64,
    /// Calls waiting for a grant: the next grant asks for a token for each.
    waiting: AtomicU32,
    /// One grant at a time; the calls behind it take its tokens from the pool.
    granting: tokio::sync::Mutex<()>,
    /// This instance's share, cut at its first use (boxed: most quotas never use theirs).
    share: Mutex<Option<Box<TurnShare>>>,
    granted: AtomicU64,
    refused: AtomicU64,
    grants: AtomicU64,
    granted_from_share: AtomicU64,
    /// Whether the last grant reached the bucket.
    reachable: AtomicBool,
}

impl fmt::Debug for FleetQuota {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("FleetQuota")
            .field("name", &&*self.name)
            .field("rate", &self.rate.get())
            .field("max_lease", &self.config.max_lease)
            .finish_non_exhaustive()
    }
}

impl FleetQuota {
    pub(crate) fn new(name: Arc<str>, rate: Arc<LiveRate>, config: FleetQuotaConfig) -> Self {
        Self {
            name,
            share: Mutex::new(None),
            rate,
            config,
            pool: AtomicU32::new(0),
            pool_expires: AtomicU64::new(0),
            empty_until: AtomicU64::new(0),
            unreachable_until: AtomicU64::new(0),
            waiting: AtomicU32::new(0),
            granting: tokio::sync::Mutex::new(()),
            granted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            grants: AtomicU64::new(0),
            granted_from_share: AtomicU64::new(0),
            reachable: AtomicBool::new(true),
        }
    }

    /// Takes a token for a call starting now, or says how long until one may be there.
    pub(crate) async fn acquire(&self, ticker: &dyn Ticker) -> Result<(), Duration> {
        if let Some(answer) = self.answer_without_grant(ticker.now_nanos()) {
            return answer;
        }
        self.waiting.fetch_add(1, Ordering::AcqRel);
        let turn = self.granting.lock().await;
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        let now = ticker.now_nanos();
        if let Some(answer) = self.answer_without_grant(now) {
            return answer;
        }
        let waiting = 1 + self.waiting.load(Ordering::Acquire);
        let want = (waiting + self.config.lease_ahead).min(self.config.max_lease.max(1));
        self.grants.fetch_add(1, Ordering::Relaxed);
        let grant = self
            .config
            .tokens
            .take(&self.name, self.rate.get(), want)
            .await;
        // Stamped after the round trip: the pool lives from when its tokens arrive.
        let now = ticker.now_nanos();
        self.reachable.store(grant.is_ok(), Ordering::Release);
        let answer = match grant {
            Ok(grant) if grant.granted == 0 => {
                self.empty_until.store(
                    now.saturating_add(nanos(grant.retry_after)),
                    Ordering::Release,
                );
                self.refuse(grant.retry_after)
            }
            Ok(grant) => {
                self.pool_expires.store(
                    now.saturating_add(nanos(self.config.lease_ttl)),
                    Ordering::Release,
                );
                self.pool.store(grant.granted - 1, Ordering::Release);
                self.granted.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(error) => {
                tracing::debug!(dependency = &*self.name, %error, "fleet quota unreachable; using this instance's share");
                self.unreachable_until.store(
                    now.saturating_add(nanos(self.config.retry_after_failure)),
                    Ordering::Release,
                );
                self.take_share(now)
            }
        };
        drop(turn);
        answer
    }

    /// The answer a call gets without a new grant: a pooled token, the share while the bucket is
    /// away, or a refusal while it is known to be empty. `None`: a grant is needed.
    fn answer_without_grant(&self, now: u64) -> Option<Result<(), Duration>> {
        if self.take_pooled(now) {
            self.granted.fetch_add(1, Ordering::Relaxed);
            return Some(Ok(()));
        }
        if now < self.unreachable_until.load(Ordering::Acquire) {
            return Some(self.take_share(now));
        }
        let empty_until = self.empty_until.load(Ordering::Acquire);
        if now < empty_until {
            return Some(self.refuse(Duration::from_nanos(empty_until - now)));
        }
        None
    }

    /// How long from `now` until a call would get a token, as far as this instance knows (a
    /// bucket not known to be empty may have one: zero).
    fn wait(&self, now: u64) -> Duration {
        if self.pool.load(Ordering::Acquire) > 0 && now < self.pool_expires.load(Ordering::Acquire)
        {
            return Duration::ZERO;
        }
        if now < self.unreachable_until.load(Ordering::Acquire) {
            return self.with_share(now, TurnShare::wait);
        }
        Duration::from_nanos(self.empty_until.load(Ordering::Acquire).saturating_sub(now))
    }

    fn ready(&self, now: u64) -> bool {
        if self.pool.load(Ordering::Acquire) > 0 && now < self.pool_expires.load(Ordering::Acquire)
        {
            return true;
        }
        if now < self.unreachable_until.load(Ordering::Acquire) {
            return self.with_share(now, TurnShare::wait).is_zero();
        }
        now >= self.empty_until.load(Ordering::Acquire)
    }

    fn take_pooled(&self, now: u64) -> bool {
        if now >= self.pool_expires.load(Ordering::Acquire) {
            return false;
        }
        self.pool
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
                left.checked_sub(1)
            })
            .is_ok()
    }

    fn take_share(&self, now: u64) -> Result<(), Duration> {
        match self.with_share(now, TurnShare::try_acquire) {
            Ok(()) => {
                self.granted.fetch_add(1, Ordering::Relaxed);
                self.granted_from_share.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(retry_after) => self.refuse(retry_after),
        }
    }

    /// Runs `step` on this instance's share at ticker time `now` (read on the fleet's clock),
    /// the share cut for the rate and the fleet's position now: at its first use, and again
    /// when either changed (keeping the turns it had kept).
    fn with_share<R>(&self, now: u64, step: impl FnOnce(&mut TurnShare, u64) -> R) -> R {
        let position = self.config.tokens.position();
        let rate = self.rate.get();
        let fleet_now = position.fleet_time(now);
        let mut share = self.share.lock().unwrap_or_else(PoisonError::into_inner);
        let current = match share.take() {
            Some(current) if current.cut_for(rate, position) => current,
            Some(old) => Box::new(old.recut(rate, position, fleet_now)),
            None => Box::new(TurnShare::new(rate, position, fleet_now)),
        };
        let share = share.insert(current);
        step(share, fleet_now)
    }

    fn refuse(&self, retry_after: Duration) -> Result<(), Duration> {
        self.refused.fetch_add(1, Ordering::Relaxed);
        Err(retry_after)
    }

    fn snapshot(&self) -> QuotaSnapshot {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let rate = self.rate.get();
        QuotaSnapshot {
            scope: QuotaScope::Fleet,
            per_second: rate.per_second,
            burst: rate.burst,
            granted: read(&self.granted),
            refused: read(&self.refused),
            fleet: Some(FleetSnapshot {
                live_instances: self.config.tokens.live_instances().max(1),
                reachable: self.reachable.load(Ordering::Acquire),
                grants: read(&self.grants),
                granted_from_share: read(&self.granted_from_share),
            }),
        }
    }
}

/// A per-client limit that holds for the fleet: a fleet-wide bucket per key (`client:{key}`),
/// each grant leased ahead for the key's next requests. At most `max_keys` keys are tracked, each
/// forgotten after `idle` without a request (it then starts from its bucket in Redis again).
#[derive(Debug)]
pub struct FleetKeyedLimiter {
    /// Every key's rate, shared by their buckets.
    rate: Arc<LiveRate>,
    config: FleetQuotaConfig,
    buckets: KeyedSlots<FleetQuota>,
    ticker: Arc<dyn Ticker>,
    rejected: AtomicU64,
}

impl FleetKeyedLimiter {
    pub fn new(
        rate: RateConfig,
        config: FleetQuotaConfig,
        max_keys: u64,
        idle: Duration,
        ticker: Arc<dyn Ticker>,
    ) -> Self {
        Self {
            rate: Arc::new(LiveRate::new(rate)),
            config,
            buckets: KeyedSlots::new(max_keys, idle),
            ticker,
            rejected: AtomicU64::new(0),
        }
    }

    /// The rate in force.
    pub fn rate(&self) -> RateConfig {
        self.rate.get()
    }

    /// Makes `rate` every key's rate: each key's next grant asks the fleet's bucket at it (the
    /// bucket in Redis keeps its state), and a key's share, while the fleet is away, follows it
    /// the next time it is used. Tokens already leased stay usable until their lease ends.
    pub fn set_rate(&self, rate: RateConfig) {
        self.rate.set(rate);
    }

    /// Takes one token of `key`'s bucket, or says how long until one may be there.
    pub async fn try_acquire(&self, key: &str) -> Result<(), Duration> {
        let bucket = self
            .buckets
            .get_or_insert_with(key, self.ticker.now_nanos(), || {
                let name = Arc::from(format!("client:{key}"));
                FleetQuota::new(name, Arc::clone(&self.rate), self.config.clone())
            });
        let verdict = bucket.acquire(self.ticker.as_ref()).await;
        if verdict.is_err() {
            self.rejected.fetch_add(1, Ordering::Relaxed);
        }
        verdict
    }

    /// Keys currently tracked (approximate) and requests refused since start.
    pub fn stats(&self) -> (u64, u64) {
        (
            self.buckets.len() as u64,
            self.rejected.load(Ordering::Relaxed),
        )
    }
}

/// One instance's share of `rate` among `live` instances: the rate divided, the burst divided
/// but at least one call (so with more instances than the burst, the fleet may make up to one
/// call per instance more in a second while the bucket is away).
fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use rebate_resilience::ManualTicker;

    use super::*;

    /// The fleet's bucket in process: one `TokenBucket` on the test's ticker, with a switch
    /// that makes it unreachable, a count of round trips and the rate the last one asked at.
    #[derive(Debug)]
    struct FakeFleet {
        bucket: TokenBucket,
        ticker: Arc<ManualTicker>,
        round_trips: AtomicU64,
        unreachable: AtomicBool,
        live: AtomicU32,
        asked_rate: Mutex<Option<RateConfig>>,
    }

    impl FakeFleet {
        fn new(rate: RateConfig, ticker: &Arc<ManualTicker>) -> Arc<Self> {
            Arc::new(Self {
                bucket: TokenBucket::new(rate),
                ticker: Arc::clone(ticker),
                round_trips: AtomicU64::new(0),
                unreachable: AtomicBool::new(false),
                live: AtomicU32::new(1),
                asked_rate: Mutex::new(None),
            })
        }

        fn asked_rate(&self) -> Option<RateConfig> {
            *self.asked_rate.lock().unwrap()
        }
    }

    #[async_trait]
    impl FleetTokens for FakeFleet {
        async fn take(
            &self,
            _bucket: &str,
            rate: RateConfig,
            want: u32,
        ) -> Result<FleetGrant, String> {
            self.round_trips.fetch_add(1, Ordering::SeqCst);
            *self.asked_rate.lock().unwrap() = Some(rate);
            // A round trip: the callers behind this one queue up meanwhile.
            tokio::task::yield_now().await;
            if self.unreachable.load(Ordering::SeqCst) {
                return Err("connection refused".to_owned());
            }
            let now = self.ticker.now_nanos();
            let mut granted = 0;
            while granted < want {
                match self.bucket.try_acquire_at(now) {
                    Ok(()) => granted += 1,
                    Err(exceeded) => {
                        return Ok(FleetGrant {
                            granted,
                            retry_after: exceeded.retry_after,
                        });
                    }
                }
            }
            Ok(FleetGrant {
                granted,
                retry_after: Duration::ZERO,
            })
        }

        fn live_instances(&self) -> u32 {
            self.live.load(Ordering::SeqCst)
        }
    }

    const RATE: RateConfig = RateConfig {
        per_second: 10.0,
        burst: 4,
    };

    fn instance(fleet: &Arc<FakeFleet>, max_lease: u32) -> Arc<Quota> {
        Arc::new(Quota::new(
            RATE,
            Some(FleetQuotaConfig::for_contract(
                Arc::clone(fleet) as Arc<dyn FleetTokens>,
                max_lease,
                Duration::from_secs(1),
            )),
            "coupons",
        ))
    }

    /// `calls` acquires at once on `quota`; how many got a token.
    async fn acquire_at_once(
        quota: &Arc<Quota>,
        ticker: &Arc<ManualTicker>,
        calls: usize,
    ) -> usize {
        let tasks: Vec<_> = (0..calls)
            .map(|_| {
                let quota = Arc::clone(quota);
                let ticker = Arc::clone(ticker);
                tokio::spawn(async move { quota.acquire(ticker.as_ref()).await })
            })
            .collect();
        let mut granted = 0;
        for task in tasks {
            granted += usize::from(task.await.unwrap());
        }
        granted
    }

    #[tokio::test]
    async fn instances_together_get_no_more_than_the_fleets_bucket() {
        let ticker = Arc::new(ManualTicker::new());
        let fleet = FakeFleet::new(RATE, &ticker);
        let instances: Vec<_> = (0..3).map(|_| instance(&fleet, 8)).collect();
        let mut granted = 0;
        // Three seconds in 100 ms steps, every instance asking five times a step.
        for _ in 0..30 {
            for quota in &instances {
                granted += acquire_at_once(quota, &ticker, 5).await;
            }
            ticker.advance(Duration::from_millis(100));
        }
        // The burst, then one token per 100 ms: 4 + 29 (the last step's refill is not asked for).
        assert_eq!(granted, 4 + 29);
        let refused: u64 = instances.iter().map(|quota| quota.snapshot().refused).sum();
        assert_eq!(refused, 3 * 30 * 5 - 33);
    }

    #[tokio::test]
    async fn calls_waiting_together_share_one_grant() {
        let ticker = Arc::new(ManualTicker::new());
        let fleet = FakeFleet::new(
            RateConfig {
                per_second: 100.0,
                burst: 100,
            },
            &ticker,
        );
        let quota = instance(&fleet, 8);
        assert_eq!(acquire_at_once(&quota, &ticker, 24).await, 24);
        let round_trips = fleet.round_trips.load(Ordering::SeqCst);
        assert!((3..24).contains(&round_trips), "{round_trips} round trips");
        // Nothing is kept for later: the pool is empty once the waiting calls took theirs.
        assert_eq!(quota.snapshot().granted, 24);
    }

    #[tokio::test]
    async fn an_empty_bucket_is_not_asked_again_before_its_next_token() {
        let ticker = Arc::new(ManualTicker::new());
        let fleet = FakeFleet::new(RATE, &ticker);
        let quota = instance(&fleet, 1);
        assert_eq!(acquire_at_once(&quota, &ticker, 4).await, 4);
        let round_trips = fleet.round_trips.load(Ordering::SeqCst);
        assert!(!quota.acquire(ticker.as_ref()).await);
        assert!(!quota.ready(ticker.now_nanos()));
        for _ in 0..10 {
            assert!(!quota.acquire(ticker.as_ref()).await);
        }
        assert_eq!(fleet.round_trips.load(Ordering::SeqCst), round_trips + 1);
        ticker.advance(Duration::from_millis(100));
        assert!(quota.ready(ticker.now_nanos()));
        assert!(quota.acquire(ticker.as_ref()).await);
    }

    #[tokio::test]
    async fn an_unreachable_bucket_leaves_each_instance_its_share() {
        let ticker = Arc::new(ManualTicker::new());
        let fleet = FakeFleet::new(
            RateConfig {
                per_second: 30.0,
                burst: 6,
            },
            &ticker,
        );
        fleet.live.store(3, Ordering::SeqCst);
        fleet.unreachable.store(true, Ordering::SeqCst);
        let quota = Arc::new(Quota::new(
            RateConfig {
                per_second: 30.0,
                burst: 6,
            },
            Some(FleetQuotaConfig::for_contract(
                Arc::clone(&fleet) as Arc<dyn FleetTokens>,
                8,
                Duration::from_secs(1),
            )),
            "coupons",
        ));
        // Its share: turns of 1/30 s dealt over three instances, so one call every 100 ms for
        // this one (rank 0: the turn it is in now), and 2 of the burst's 5 kept turns.
        assert_eq!(acquire_at_once(&quota, &ticker, 5).await, 3);
        ticker.advance(Duration::from_millis(100));
        assert_eq!(acquire_at_once(&quota, &ticker, 10).await, 1);
        assert_eq!(
            fleet.round_trips.load(Ordering::SeqCst),
            1,
            "asked once, then the share"
        );
        let snapshot = quota.snapshot();
        let fleet_state = snapshot.fleet.unwrap();
        assert!(!fleet_state.reachable);
        assert_eq!(
            (fleet_state.live_instances, fleet_state.granted_from_share),
            (3, 4)
        );
        // Back after a second: the fleet's bucket answers again.
        fleet.unreachable.store(false, Ordering::SeqCst);
        ticker.advance(Duration::from_millis(900));
        assert!(quota.acquire(ticker.as_ref()).await);
        assert_eq!(fleet.round_trips.load(Ordering::SeqCst), 2);
        assert!(quota.snapshot().fleet.unwrap().reachable);
    }

    #[tokio::test]
    async fn a_new_rate_is_asked_for_at_the_next_grant_and_the_share_follows_it() {
        let ticker = Arc::new(ManualTicker::new());
        let fleet = FakeFleet::new(RATE, &ticker);
        let quota = instance(&fleet, 1);
        assert!(quota.acquire(ticker.as_ref()).await);
        assert_eq!(fleet.asked_rate(), Some(RATE));
        let slower = RateConfig {
            per_second: 5.0,
            burst: 2,
        };
        quota.set_rate(slower, ticker.now_nanos());
        let snapshot = quota.snapshot();
        assert_eq!((snapshot.per_second, snapshot.burst), (5.0, 2));
        assert!(quota.acquire(ticker.as_ref()).await);
        assert_eq!(
            fleet.asked_rate(),
            Some(slower),
            "the next grant asks at it"
        );

        // While the fleet is away, the share (all of it, for the one instance) is cut at its
        // first use for the rate then: the turn it is in and the burst's other turn, kept.
        fleet.unreachable.store(true, Ordering::SeqCst);
        assert_eq!(acquire_at_once(&quota, &ticker, 5).await, 2);
        quota.set_rate(RATE, ticker.now_nanos());
        assert_eq!(
            quota.wait(ticker.now_nanos()),
            Duration::from_millis(100),
            "nothing kept; the next turn at 10 a second"
        );
        ticker.advance(Duration::from_millis(100));
        assert!(quota.acquire(ticker.as_ref()).await);
    }

    #[tokio::test]
    async fn every_clients_next_grant_asks_at_a_new_rate() {
        let ticker = Arc::new(ManualTicker::new());
        let fleet = FakeFleet::new(RATE, &ticker);
        let limiter = FleetKeyedLimiter::new(
            RATE,
            FleetQuotaConfig::for_contract(
                Arc::clone(&fleet) as Arc<dyn FleetTokens>,
                1,
                Duration::from_secs(1),
            ),
            100,
            Duration::from_secs(60),
            Arc::clone(&ticker) as Arc<dyn Ticker>,
        );
        assert_eq!(limiter.try_acquire("app-1").await, Ok(()));
        assert_eq!(fleet.asked_rate(), Some(RATE));
        let faster = RateConfig {
            per_second: 50.0,
            burst: 8,
        };
        limiter.set_rate(faster);
        assert_eq!(limiter.rate(), faster);
        for key in ["app-1", "h5-2"] {
            *fleet.asked_rate.lock().unwrap() = None;
            assert_eq!(limiter.try_acquire(key).await, Ok(()));
            assert_eq!(fleet.asked_rate(), Some(faster), "{key}");
        }
    }
}
