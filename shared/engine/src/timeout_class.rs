//! Timeout classes: core parts may take longest, optional ones least. ("Tier" is kept for the
//! cache levels, L1 and L2.)

use std::time::Duration;

use rebate_domain::{PartKind, PerPart};
use serde::Deserialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimeoutClass {
    /// Without it there is no answer (product) or no point (rate).
    Core,
    /// Makes the answer better (coupons).
    Normal,
    /// Nice to have (extras).
    Edge,
}

/// Each part's timeout, resolved from its timeout class (or its own override) at start.
pub type PartTimeouts = PerPart<Duration>;

/// The default timeout of each class. A part may override its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassTimeouts {
    pub core: Duration,
    pub normal: Duration,
    pub edge: Duration,
}

impl TimeoutClass {
    /// The conventional class of each part: product and rate core, coupons normal, extras edge.
    pub const fn conventional(part: PartKind) -> Self {
        match part {
            PartKind::Product | PartKind::Rate => TimeoutClass::Core,
            PartKind::Coupons => TimeoutClass::Normal,
            PartKind::Extras => TimeoutClass::Edge,
        }
    }
}

impl ClassTimeouts {
    pub fn timeout(&self, class: TimeoutClass) -> Duration {
        match class {
            TimeoutClass::Core => self.core,
            TimeoutClass::Normal => self.normal,
            TimeoutClass::Edge => self.edge,
        }
    }

    /// Each part at its conventional class's timeout.
    pub fn part_timeouts(&self) -> PartTimeouts {
        PerPart::from_fn(|part| self.timeout(TimeoutClass::conventional(part)))
    }
}

/// Every timeout multiplied by its part's conventional class's factor (shed level 2), never below
/// 1 ms.
pub fn scale_timeouts(timeouts: &PartTimeouts, core: f64, normal: f64, edge: f64) -> PartTimeouts {
    timeouts.map(|part, timeout| {
        let factor = match TimeoutClass::conventional(part) {
            TimeoutClass::Core => core,
            TimeoutClass::Normal => normal,
            TimeoutClass::Edge => edge,
        };
        timeout
            .mul_f64(factor.clamp(0.0, 1.0))
            .max(Duration::from_millis(1))
    })
}

impl Default for ClassTimeouts {
    fn default() -> Self {
        Self {
            core: Duration::from_millis(1000),
            normal: Duration::from_millis(500),
            edge: Duration::from_millis(250),
        }
    }
}
