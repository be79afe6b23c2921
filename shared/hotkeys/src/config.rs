//! How large the sketch is and how many locks it is split over.

use serde::Serialize;

/// The largest capacity accepted: a million counters take some 150 MiB with their index, far
/// more than any top list the service reads needs.
pub const MAX_CAPACITY: usize = 1_000_000;

/// The size of a [`HeavyHitters`](crate::HeavyHitters) sketch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct HotKeysConfig {
    /// Counters kept in all (1 to [`MAX_CAPACITY`]), split evenly over the shards and rounded up
    /// to a multiple of `shards`. A key with more than `shards / capacity` of its shard's draws
    /// (decay aside) is always tracked, so this is what decides how rare a key may be and still
    /// be found; keep it well above the longest top list read.
    pub capacity: usize,
    /// Independent tables, each behind its own lock, so that the request threads recording at
    /// the same time rarely meet on one lock. A power of two (a key's shard is its hash masked),
    /// at most `capacity`.
    pub shards: usize,
}

impl Default for HotKeysConfig {
    /// 4096 counters over 16 shards: 256 a shard, every key with more than 1/256 of its shard's
    /// draws tracked; 16 locks for a handful of worker threads.
    fn default() -> Self {
        Self {
            capacity: 4096,
            shards: 16,
        }
    }
}

/// Why a [`HotKeysConfig`] was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HotKeysConfigError {
    #[error("hot keys: capacity must be at least 1")]
    ZeroCapacity,
    #[error("hot keys: capacity must be at most {MAX_CAPACITY}, got {0}")]
    CapacityTooLarge(usize),
    #[error("hot keys: shards must be at least 1")]
    ZeroShards,
    #[error("hot keys: shards must be a power of two, got {0}")]
    ShardsNotPowerOfTwo(usize),
    #[error("hot keys: shards ({shards}) must not exceed capacity ({capacity})")]
    MoreShardsThanCapacity { shards: usize, capacity: usize },
}

impl HotKeysConfig {
    /// The first value out of range, if any.
    pub fn validate(&self) -> Result<(), HotKeysConfigError> {
        if self.capacity == 0 {
            return Err(HotKeysConfigError::ZeroCapacity);
        }
        if self.capacity > MAX_CAPACITY {
            return Err(HotKeysConfigError::CapacityTooLarge(self.capacity));
        }
        if self.shards == 0 {
            return Err(HotKeysConfigError::ZeroShards);
        }
        if !self.shards.is_power_of_two() {
            return Err(HotKeysConfigError::ShardsNotPowerOfTwo(self.shards));
        }
        if self.shards > self.capacity {
            return Err(HotKeysConfigError::MoreShardsThanCapacity {
                shards: self.shards,
                capacity: self.capacity,
            });
        }
        Ok(())
    }

    /// Counters in each shard: `capacity / shards`, rounded up.
    pub(crate) fn capacity_per_shard(&self) -> usize {
        self.capacity.div_ceil(self.shards)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(capacity: usize, shards: usize) -> HotKeysConfig {
        HotKeysConfig { capacity, shards }
    }

    #[test]
    fn the_default_is_valid() {
        assert_eq!(HotKeysConfig::default().validate(), Ok(()));
        assert_eq!(HotKeysConfig::default().capacity_per_shard(), 256);
    }

    #[test]
    fn each_value_out_of_range_is_named() {
        assert_eq!(
            config(0, 1).validate(),
            Err(HotKeysConfigError::ZeroCapacity)
        );
        assert_eq!(
            config(MAX_CAPACITY + 1, 16).validate(),
            Err(HotKeysConfigError::CapacityTooLarge(MAX_CAPACITY + 1))
        );
        assert_eq!(config(8, 0).validate(), Err(HotKeysConfigError::ZeroShards));
        assert_eq!(
            config(8, 3).validate(),
            Err(HotKeysConfigError::ShardsNotPowerOfTwo(3))
        );
        assert_eq!(
            config(8, 16).validate(),
            Err(HotKeysConfigError::MoreShardsThanCapacity {
                shards: 16,
                capacity: 8
            })
        );
    }

    #[test]
    fn the_limits_themselves_are_accepted() {
        assert_eq!(config(1, 1).validate(), Ok(()));
        assert_eq!(config(MAX_CAPACITY, 1).validate(), Ok(()));
        assert_eq!(config(16, 16).validate(), Ok(()));
    }

    #[test]
    fn capacity_is_split_rounding_up() {
        assert_eq!(config(100, 16).capacity_per_shard(), 7);
        assert_eq!(config(1, 1).capacity_per_shard(), 1);
    }
}
