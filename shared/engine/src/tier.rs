//! Timeout tiers: core parts may take longest, optional ones least.

use std::time::Duration;

use serde::Deserialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// Without it there is no answer (product) or no point (rate).
    Core,
    /// Makes the answer better (coupons).
    Normal,
    /// Nice to have (extras).
    Edge,
}

/// The default timeout of each tier. A part may override its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeoutTiers {
    pub core: Duration,
    pub normal: Duration,
    pub edge: Duration,
}

impl TimeoutTiers {
    pub fn timeout(&self, tier: Tier) -> Duration {
        match tier {
            Tier::Core => self.core,
            Tier::Normal => self.normal,
            Tier::Edge => self.edge,
        }
    }
}

impl Default for TimeoutTiers {
    fn default() -> Self {
        Self {
            core: Duration::from_millis(1000),
            normal: Duration::from_millis(500),
            edge: Duration::from_millis(250),
        }
    }
}
