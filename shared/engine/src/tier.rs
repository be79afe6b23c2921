//! Timeout tiers: core parts may take longest, optional ones least.

use std::time::Duration;

use rebate_domain::{PartKind, PerPart};
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

/// Each part's timeout, resolved from its tier (or its own override) at start.
pub type PartTimeouts = PerPart<Duration>;

/// The default timeout of each tier. A part may override its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeoutTiers {
    pub core: Duration,
    pub normal: Duration,
    pub edge: Duration,
}

impl Tier {
    /// The conventional tier of each part: product and rate core, coupons normal, extras edge.
    pub const fn conventional(part: PartKind) -> Self {
        match part {
            PartKind::Product | PartKind::Rate => Tier::Core,
            PartKind::Coupons => Tier::Normal,
            PartKind::Extras => Tier::Edge,
        }
    }
}

impl TimeoutTiers {
    pub fn timeout(&self, tier: Tier) -> Duration {
        match tier {
            Tier::Core => self.core,
            Tier::Normal => self.normal,
            Tier::Edge => self.edge,
        }
    }

    /// Each part at its conventional tier's timeout.
    pub fn part_timeouts(&self) -> PartTimeouts {
        PerPart::from_fn(|part| self.timeout(Tier::conventional(part)))
    }
}

/// Every timeout multiplied by its part's conventional tier's factor (shed level 2), never below
/// 1 ms.
pub fn scale_timeouts(timeouts: &PartTimeouts, core: f64, normal: f64, edge: f64) -> PartTimeouts {
    timeouts.map(|part, timeout| {
        let factor = match Tier::conventional(part) {
            Tier::Core => core,
            Tier::Normal => normal,
            Tier::Edge => edge,
        };
        timeout
            .mul_f64(factor.clamp(0.0, 1.0))
            .max(Duration::from_millis(1))
    })
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
