//! The hot items, learned from traffic (`[hot_keys]`).
//!
//! Every item the API answers (one in `sample_every`, counted for as many) goes into a bounded
//! heavy-hitter sketch (`rebate-hotkeys`);
//! its counts halve every `half_life_secs`, so the list follows what is hot now. With Redis,
//! each instance publishes its top `publish_top` every `publish_interval_secs` and the fleet's
//! list is the sum of the lists published within three intervals: a new instance warms the items
//! the fleet is busy with before it has seen any traffic of its own. Warm-up takes the learned
//! keys before the store's `hot_items` (the seed), and the admin API shows both lists.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rebate_domain::ItemKey;
use rebate_hotkeys::{HeavyHitters, HotKey, HotKeysConfig};
use rebate_redis_tier::RedisTier;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::config::HotKeySettings;
use crate::fleet::registry_name;

/// This instance's sketch and, with Redis, its part in the fleet's list.
#[derive(Debug)]
pub struct HotKeys {
    sketch: HeavyHitters<ItemKey>,
    settings: HotKeySettings,
    fleet: Option<FleetList>,
    /// Time since the counts last halved.
    undecayed: Mutex<Duration>,
}

#[derive(Debug)]
struct FleetList {
    tier: Arc<RedisTier>,
    /// This instance's name among the lists (unique even for instances given one id).
    instance: String,
}

/// A key with its count, as the admin API shows it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct KeyCount {
    /// `platform:item_id`.
    #[serde(serialize_with = "as_text")]
    pub key: ItemKey,
    pub count: u64,
    /// How much of `count` may be overestimated (this instance's sketch only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<u64>,
}

impl HotKeys {
    /// `settings` must have passed validation; `tier` is the shared Redis when enabled.
    pub fn new(
        settings: &HotKeySettings,
        tier: Option<&Arc<RedisTier>>,
        instance_id: &str,
    ) -> anyhow::Result<Self> {
        let sketch = HeavyHitters::new(HotKeysConfig {
            capacity: settings.capacity,
            shards: HotKeysConfig::default().shards.min(settings.capacity),
        })?;
        Ok(Self {
            sketch,
            settings: settings.clone(),
            fleet: tier.map(|tier| FleetList {
                tier: Arc::clone(tier),
                instance: registry_name(instance_id),
            }),
            undecayed: Mutex::new(Duration::ZERO),
        })
    }

    /// How long it takes a count to halve.
    pub fn half_life(&self) -> Duration {
        self.settings.half_life()
    }

    /// Counts one answered item: one in `sample_every`, at random (a per-thread sequence would
    /// always pick the same item of a client that alternates between a few).
    pub fn record(&self, key: ItemKey) {
        let every = self.settings.sample_every;
        if every > 1 && !rand::random_ratio(1, every) {
            return;
        }
        self.sketch.record(key);
    }

    /// A sketch count in answered items.
    fn answered(&self, count: u64) -> u64 {
        count.saturating_mul(u64::from(self.settings.sample_every))
    }

    /// This instance's hottest `limit` keys.
    pub fn local_top(&self, limit: usize) -> Vec<KeyCount> {
        self.sketch
            .top(limit)
            .into_iter()
            .map(|HotKey { key, count, error }| KeyCount {
                key,
                count: self.answered(count),
                error: Some(self.answered(error)),
            })
            .collect()
    }

    /// The fleet's hottest `limit` keys; `None` without Redis, an error message when Redis did
    /// not answer.
    pub async fn fleet_top(&self, limit: usize) -> Option<Result<Vec<KeyCount>, String>> {
        let fleet = self.fleet.as_ref()?;
        Some(match fleet.tier.fleet_hot_keys(limit).await {
            Ok(counts) => Ok(counts
                .into_iter()
                .filter_map(|(key, count)| {
                    let (platform, item_id) = key.split_once(':')?;
                    let key = ItemKey::parse(platform, item_id).ok()?;
                    Some(KeyCount {
                        key,
                        count,
                        error: None,
                    })
                })
                .collect()),
            Err(error) => Err(error.to_string()),
        })
    }

    /// The keys warm-up should load first: the fleet's list when Redis answers, else this
    /// instance's own.
    pub async fn learned(&self, limit: usize) -> Vec<ItemKey> {
        let counts = match self.fleet_top(limit).await {
            Some(Ok(fleet)) if !fleet.is_empty() => fleet,
            Some(Err(error)) => {
                tracing::debug!(%error, "the fleet's hot keys are out of reach; warming this instance's");
                self.local_top(limit)
            }
            _ => self.local_top(limit),
        };
        counts.into_iter().map(|count| count.key).collect()
    }

    /// One step of upkeep, `elapsed` after the last: the counts halve for every half-life that
    /// has passed, and the instance's list replaces its last one in the fleet's.
    ///
    /// Whole halvings only: counts are integers rounded down, so a small factor every interval
    /// (0.977 for 10 s of a 5-minute half-life) would take one off every count below 43 each
    /// time instead of 2.3 %.
    async fn maintain_once(&self, elapsed: Duration) {
        let half_life = self.settings.half_life();
        let halvings = {
            let mut undecayed = self
                .undecayed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            *undecayed += elapsed;
            let halvings = undecayed.as_secs() / half_life.as_secs().max(1);
            *undecayed -= half_life * u32::try_from(halvings).unwrap_or(u32::MAX);
            halvings
        };
        if halvings > 0 {
            let factor = 0.5f64
                .powi(i32::try_from(halvings).unwrap_or(i32::MAX))
                .max(f64::MIN_POSITIVE);
            if let Err(error) = self.sketch.decay(factor) {
                tracing::warn!(%error, "hot keys not decayed");
            }
        }
        let Some(fleet) = &self.fleet else {
            return;
        };
        let counts: Vec<(String, u64)> = self
            .sketch
            .top(self.settings.publish_top)
            .into_iter()
            .filter(|hot| hot.count > 0)
            .map(|hot| (hot.key.to_string(), self.answered(hot.count)))
            .collect();
        let ttl = self.settings.publish_interval() * 3;
        if let Err(error) = fleet
            .tier
            .publish_hot_keys(&fleet.instance, &counts, ttl)
            .await
        {
            tracing::debug!(%error, "hot keys not published; the fleet's list keeps the last one until it expires");
        }
    }
}

fn as_text<S: serde::Serializer>(key: &ItemKey, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_str(key)
}

/// Decays and publishes every `publish_interval_secs` until `shutdown`.
pub async fn maintain(hot_keys: Arc<HotKeys>, shutdown: CancellationToken) {
    let every = hot_keys.settings.publish_interval();
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is immediate: nothing to publish yet.
    ticks.tick().await;
    loop {
        tokio::select! {
            _ = ticks.tick() => hot_keys.maintain_once(every).await,
            () = shutdown.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: u64) -> ItemKey {
        ItemKey::parse("jd", &id.to_string()).unwrap()
    }

    fn settings() -> HotKeySettings {
        HotKeySettings {
            enabled: true,
            capacity: 64,
            sample_every: 1,
            half_life_secs: 60,
            publish_interval_secs: 10,
            publish_top: 16,
        }
    }

    #[tokio::test]
    async fn counts_follow_traffic_and_fade_by_the_half_life() {
        let hot_keys = HotKeys::new(&settings(), None, "test").unwrap();
        for (id, times) in [(100_001, 40), (100_002, 10), (100_003, 20)] {
            for _ in 0..times {
                hot_keys.record(key(id));
            }
        }
        let top: Vec<(ItemKey, u64)> = hot_keys
            .local_top(2)
            .into_iter()
            .map(|count| (count.key, count.count))
            .collect();
        assert_eq!(top, vec![(key(100_001), 40), (key(100_003), 20)]);
        assert_eq!(hot_keys.learned(3).await[2], key(100_002));
        hot_keys.maintain_once(Duration::from_secs(50)).await;
        assert_eq!(hot_keys.local_top(1)[0].count, 40, "not yet a half-life");
        hot_keys.maintain_once(Duration::from_secs(10)).await;
        assert_eq!(
            hot_keys.local_top(1)[0].count,
            20,
            "halved after a half-life"
        );
        hot_keys.maintain_once(Duration::from_secs(130)).await;
        assert_eq!(
            hot_keys.local_top(1)[0].count,
            5,
            "twice more, with 10 s carried over"
        );
        assert!(hot_keys.fleet_top(10).await.is_none());
    }

    #[tokio::test]
    async fn a_sample_counts_for_every_item_it_stands_for() {
        let sampled = HotKeys::new(
            &HotKeySettings {
                sample_every: 4,
                ..settings()
            },
            None,
            "test",
        )
        .unwrap();
        for _ in 0..8_000 {
            sampled.record(key(100_001));
        }
        sampled.record(key(100_002));
        let top = sampled.local_top(2);
        assert_eq!(top[0].key, key(100_001));
        // 2,000 draws expected, standard deviation about 39, counted four times each.
        assert!((7_200..=8_800).contains(&top[0].count), "{top:?}");
        assert_eq!(top[0].count % 4, 0);
    }
}
