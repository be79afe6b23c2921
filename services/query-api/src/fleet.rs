//! This instance's part in what the fleet shares in Redis: its heartbeat in the registry of live
//! instances, and the fleet-wide token buckets of the external APIs' quotas
//! (`[resilience.fleet]`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use rebate_cache::Clock;
use rebate_guard::{FleetGrant, FleetTokens};
use rebate_redis_tier::RedisTier;
use rebate_resilience::{RateConfig, Ticker};
use tokio_util::sync::CancellationToken;

/// The fleet's buckets and registry on the shared Redis, as one instance sees them.
#[derive(Debug)]
pub struct Fleet {
    tier: Arc<RedisTier>,
    /// This instance's name in the registry: `observability.instance_id` (else `host-pid`) and
    /// a random suffix, so that two instances given one name (or run in one process, as tests
    /// do) are still counted apart.
    instance: String,
    /// Live instances at the last heartbeat that reached Redis, and this instance's place among
    /// them: kept while Redis is away, so the share an instance falls back to is cut for the
    /// fleet it last saw.
    live: AtomicU32,
    rank: AtomicU32,
    /// The hosts' wall clock, which the fleet's instances read alike (NTP keeps them within
    /// milliseconds, against turns of 1/per_second): the turns of a share are cut on it.
    clock: Arc<dyn Clock>,
    /// The guards' ticker, which the share's callers read.
    ticker: Arc<dyn Ticker>,
}

impl Fleet {
    pub fn new(
        tier: Arc<RedisTier>,
        instance: &str,
        clock: Arc<dyn Clock>,
        ticker: Arc<dyn Ticker>,
    ) -> Self {
        Self {
            tier,
            instance: registry_name(instance),
            live: AtomicU32::new(1),
            rank: AtomicU32::new(0),
            clock,
            ticker,
        }
    }

    /// Records this instance in the registry and learns how many are alive and its place among
    /// them. Errors leave the last figures in place.
    pub async fn beat(&self, expire_after: Duration) {
        match self.tier.heartbeat(&self.instance, expire_after).await {
            Ok(beat) => {
                self.rank.store(beat.rank, Ordering::Release);
                let live = beat.live;
                let before = self.live.swap(live, Ordering::AcqRel);
                if before != live {
                    tracing::info!(live, instance = %self.instance, "live instances in the fleet changed");
                }
            }
            Err(error) => {
                tracing::debug!(%error, "heartbeat not recorded; keeping the last count of live instances");
            }
        }
    }
}

/// This instance's name in the fleet's shared lists: its configured id (else `host-pid`) and a
/// random suffix, so that two instances given one id, or run in one process as tests do, are
/// still counted apart.
pub fn registry_name(instance_id: &str) -> String {
    format!("{instance_id}#{:08x}", rand::random::<u32>())
}

#[async_trait]
impl FleetTokens for Fleet {
    async fn take(&self, bucket: &str, rate: RateConfig, want: u32) -> Result<FleetGrant, String> {
        self.tier
            .take_tokens(bucket, rate.per_second, rate.burst, want)
            .await
            .map(|grant| FleetGrant {
                granted: grant.granted,
                retry_after: grant.retry_after,
            })
            .map_err(|error| error.to_string())
    }

    fn live_instances(&self) -> u32 {
        self.live.load(Ordering::Acquire).max(1)
    }

    fn rank(&self) -> u32 {
        self.rank.load(Ordering::Acquire)
    }

    fn clock_offset_nanos(&self) -> i64 {
        let wall = self.clock.now().as_millis().saturating_mul(1_000_000);
        let ticker = i64::try_from(self.ticker.now_nanos()).unwrap_or(i64::MAX);
        wall.saturating_sub(ticker)
    }
}

/// Beats every `every` until `shutdown`; an instance that stops beating is gone for the others
/// after `expire_after`.
pub async fn keep_beating(
    fleet: Arc<Fleet>,
    every: Duration,
    expire_after: Duration,
    shutdown: CancellationToken,
) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => fleet.beat(expire_after).await,
            () = shutdown.cancelled() => return,
        }
    }
}
