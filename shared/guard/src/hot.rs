//! The per-item limit on a dependency's loads: one viral item cannot spend its whole quota.
//!
//! Contract: a [`HotItemLimit`] gives every item its own token bucket (`per_second`, `burst`) of
//! loads toward one dependency, checked before the load asks for the dependency's quota. An item
//! whose bucket is empty is refused at once with [`FailureKind::HotItem`]: no call, no quota
//! token, no breaker outcome (it says nothing about the dependency's health), and the part
//! degrades as it does for a spent quota — stale if a copy is servable, else template text. The
//! limit counts *loads*, not requests: above the loader the part cache's single flight joins
//! concurrent readers of an item into one load, and a load's retries (within the request's
//! allowance and the global budget) belong to it.
//!
//! Memory is bounded: at most `max_items` items are tracked ([`KeyedLimiter`] over a bounded
//! S3-FIFO map), and an item is forgotten once its bucket would be full again (`burst /
//! per_second`, at least a second), so forgetting it loses nothing. Buckets are this instance's:
//! with L2 and its rebuild leases one instance rebuilds a key for the fleet, so the fleet's cost
//! of a viral item stays near one instance's limit; a bucket in Redis would put a round trip on
//! every load.
//!
//! The rate changes in place ([`HotItemLimit::reconfigure`]): every item's bucket keeps its
//! tokens and refills at the new rate, and items are kept for the new refill time.
//! `max_items` sizes the map and is restart-only.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rebate_cache::{FailureKind, ItemKey, LoadFailure};
use rebate_resilience::{KeyedLimiter, RateConfig, RestartOnly, Ticker};
use serde::Serialize;

/// How many loads each item may cause toward one dependency.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HotItemConfig {
    /// Each item's sustained loads per second and the burst above it (after a quiet spell).
    pub rate: RateConfig,
    /// Items tracked at once; beyond it the least used start over with a full bucket.
    pub max_items: u64,
}

impl HotItemConfig {
    /// How long an unused item is kept: until its bucket would be full again, at least a second.
    pub fn idle(&self) -> Duration {
        let refill = f64::from(self.rate.burst.max(1)) / self.rate.per_second;
        Duration::from_secs_f64(refill.clamp(1.0, 86_400.0))
    }
}

/// One dependency's per-item buckets; see the module documentation.
#[derive(Debug)]
pub struct HotItemLimit {
    /// The configuration in force, for the snapshot; only [`Self::reconfigure`] takes the lock
    /// (loads read the buckets' rate, lock-free).
    config: Mutex<HotItemConfig>,
    buckets: KeyedLimiter,
    refusal: Arc<str>,
}

impl HotItemLimit {
    /// `config.rate` must have passed [`RateConfig::validate`].
    pub fn new(dependency: &'static str, config: HotItemConfig, ticker: Arc<dyn Ticker>) -> Self {
        Self {
            buckets: KeyedLimiter::new(config.rate, config.max_items, config.idle(), ticker),
            config: Mutex::new(config),
            refusal: format!("{dependency}: this item's own share of loads is spent (hot item)")
                .into(),
        }
    }

    /// Applies `config.rate` to every item, in place: each item's bucket keeps the tokens it
    /// holds (at most the new burst) and refills at the new rate from now, and an unused item
    /// is kept until its bucket would be full at the new rate. `max_items` is restart-only (it
    /// sizes the map): kept, and named in the answer when `config` asks for another.
    pub fn reconfigure(&self, config: HotItemConfig) -> RestartOnly {
        let mut in_force = self.config.lock().unwrap_or_else(PoisonError::into_inner);
        let mut restart_only = RestartOnly::default();
        restart_only.note("max_items", &in_force.max_items, &config.max_items);
        let config = HotItemConfig {
            max_items: in_force.max_items,
            ..config
        };
        self.buckets.set_rate(config.rate);
        self.buckets.set_idle(config.idle());
        *in_force = config;
        restart_only
    }

    /// Takes a token of `key`'s bucket for one load, or refuses it (instant, allocation-free).
    pub fn admit(&self, key: ItemKey) -> Result<(), LoadFailure> {
        with_key_text(key, |text| self.buckets.try_acquire(text))
            .map_err(|_| LoadFailure::new(FailureKind::HotItem, Arc::clone(&self.refusal)))
    }

    /// Whether a load of `key` would be admitted now (advisory, takes nothing).
    pub fn ready(&self, key: ItemKey) -> bool {
        with_key_text(key, |text| self.buckets.has_token(text))
    }

    pub fn snapshot(&self) -> HotItemSnapshot {
        let (items_tracked, refused) = self.buckets.stats();
        let config = *self.config.lock().unwrap_or_else(PoisonError::into_inner);
        HotItemSnapshot {
            per_second: config.rate.per_second,
            burst: config.rate.burst,
            max_items: config.max_items,
            items_tracked,
            refused,
        }
    }
}

/// A per-item limit as the status page shows it (never which items: that is the hot keys' page).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HotItemSnapshot {
    pub per_second: f64,
    pub burst: u32,
    pub max_items: u64,
    /// Items with a bucket now (approximate).
    pub items_tracked: u64,
    /// Loads refused because their item's bucket was empty.
    pub refused: u64,
}

/// `platform:item_id` on the stack: 6 + 1 + 20 bytes at most, so a load allocates nothing to be
/// looked up (only an item seen for the first time stores its key).
fn with_key_text<R>(key: ItemKey, read: impl FnOnce(&str) -> R) -> R {
    let mut buffer = [0u8; 32];
    let platform = key.platform.as_str().as_bytes();
    let id = key.item_id.as_str().as_bytes();
    let colon = platform.len();
    let end = colon + 1 + id.len();
    buffer[..colon].copy_from_slice(platform);
    buffer[colon] = b':';
    buffer[colon + 1..end].copy_from_slice(id);
    // Platform names and item ids are ASCII, so this cannot fail.
    read(std::str::from_utf8(&buffer[..end]).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use rebate_resilience::ManualTicker;

    use super::*;

    fn item(id: &str) -> ItemKey {
        ItemKey::parse("taobao", id).unwrap()
    }

    fn limit(ticker: &ManualTicker) -> HotItemLimit {
        HotItemLimit::new(
            "coupons",
            HotItemConfig {
                rate: RateConfig {
                    per_second: 1.0,
                    burst: 3,
                },
                max_items: 1_000,
            },
            Arc::new(ticker.clone()),
        )
    }

    #[test]
    fn an_item_gets_its_burst_then_its_rate_and_others_are_untouched() {
        let ticker = ManualTicker::new();
        let limit = limit(&ticker);
        let viral = item("100001");
        for _ in 0..3 {
            limit.admit(viral).unwrap();
        }
        let refused = limit.admit(viral).unwrap_err();
        assert_eq!(refused.kind, FailureKind::HotItem);
        assert!(!limit.ready(viral));
        assert!(limit.ready(item("100002")), "another item is not limited");
        limit.admit(item("100002")).unwrap();
        ticker.advance(Duration::from_secs(1));
        assert!(limit.ready(viral));
        limit.admit(viral).unwrap();
        assert!(limit.admit(viral).is_err());
        let snapshot = limit.snapshot();
        assert_eq!((snapshot.items_tracked, snapshot.refused), (2, 2));
    }

    #[test]
    fn one_item_reloaded_a_hundred_times_a_second_for_ten_seconds_loads_its_burst_and_one_a_second()
    {
        let ticker = ManualTicker::new();
        let limit = limit(&ticker);
        let viral = item("100001");
        let mut admitted = 0;
        for _ in 0..1_000 {
            admitted += usize::from(limit.admit(viral).is_ok());
            ticker.advance(Duration::from_millis(10));
        }
        // The burst at 0 s, then one at each of 1 s … 9 s (the last reload is at 9.99 s).
        assert_eq!(admitted, 3 + 9);
    }

    #[test]
    fn a_new_rate_keeps_each_items_tokens_and_its_idle_time_follows() {
        let ticker = ManualTicker::new();
        let limit = limit(&ticker);
        let viral = item("100001");
        let warm = item("100002");
        for _ in 0..3 {
            limit.admit(viral).unwrap();
        }
        limit.admit(warm).unwrap();
        let slower = HotItemConfig {
            rate: RateConfig {
                per_second: 0.1,
                burst: 2,
            },
            max_items: 50,
        };
        assert_eq!(limit.reconfigure(slower).fields, ["max_items"]);
        let snapshot = limit.snapshot();
        assert_eq!(
            (snapshot.per_second, snapshot.burst, snapshot.max_items),
            (0.1, 2, 1_000)
        );
        assert!(limit.admit(viral).is_err(), "it held no token");
        limit
            .admit(warm)
            .expect("it held two, capped at the new burst of 2");
        limit.admit(warm).unwrap();
        assert!(limit.admit(warm).is_err());

        // At 0.1 a second, an empty bucket is full again after 20 s: the items are kept that
        // long (not the 3 s of the old rate), so a forgotten item cannot start full early.
        ticker.advance(Duration::from_secs(10));
        assert!(limit.ready(viral));
        limit.admit(viral).unwrap();
        assert!(!limit.ready(viral));
        assert_eq!(limit.snapshot().items_tracked, 2);
    }

    #[test]
    fn keys_are_the_platform_and_the_id() {
        assert_eq!(
            with_key_text(item("12345678901234567890"), str::to_owned),
            "taobao:12345678901234567890"
        );
        let jd = ItemKey::parse("jd", "7").unwrap();
        assert_eq!(with_key_text(jd, str::to_owned), "jd:7");
    }

    #[test]
    fn an_item_is_kept_until_its_bucket_would_be_full_again() {
        let config = |per_second, burst| HotItemConfig {
            rate: RateConfig { per_second, burst },
            max_items: 10,
        };
        assert_eq!(config(1.0, 3).idle(), Duration::from_secs(3));
        assert_eq!(
            config(100.0, 3).idle(),
            Duration::from_secs(1),
            "at least 1 s"
        );
        assert_eq!(config(0.5, 2).idle(), Duration::from_secs(4));
    }
}
