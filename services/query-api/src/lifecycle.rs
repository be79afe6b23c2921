//! Where this instance is in its life: starting, serving or draining. Readiness reads it, so a
//! load balancer sends traffic only while the instance serves and stops before the drain ends.

use std::sync::atomic::{AtomicU8, Ordering};

use serde::Serialize;

/// The phases, in the only order they are entered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Built, listeners bound, not yet accepting.
    Starting = 0,
    /// Accepting and answering.
    Serving = 1,
    /// Shutdown began: in-flight requests finish, new traffic should go elsewhere.
    Draining = 2,
}

/// The current [`Phase`], shared by the server loop and the readiness probe.
#[derive(Debug, Default)]
pub struct Lifecycle {
    phase: AtomicU8,
}

impl Lifecycle {
    pub fn phase(&self) -> Phase {
        match self.phase.load(Ordering::Acquire) {
            0 => Phase::Starting,
            1 => Phase::Serving,
            _ => Phase::Draining,
        }
    }

    /// Moves forward to `phase`; never back (a late "serving" cannot undo "draining").
    pub fn enter(&self, phase: Phase) {
        self.phase.fetch_max(phase as u8, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_only_move_forward() {
        let lifecycle = Lifecycle::default();
        assert_eq!(lifecycle.phase(), Phase::Starting);
        lifecycle.enter(Phase::Serving);
        assert_eq!(lifecycle.phase(), Phase::Serving);
        lifecycle.enter(Phase::Draining);
        lifecycle.enter(Phase::Serving);
        assert_eq!(lifecycle.phase(), Phase::Draining);
    }
}
