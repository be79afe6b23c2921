//! The level policy: the [`ShedLevel`] a load calls for, up at once, down one level at a time,
//! only below the level's threshold minus the hysteresis and after the dwell.

use std::time::Duration;

use super::ShedLevel;
use crate::ticker::saturating_nanos;

pub(super) fn validate_levels(thresholds: [f64; 3], hysteresis: f64) -> Result<(), String> {
    if !thresholds
        .iter()
        .all(|threshold| threshold.is_finite() && *threshold > 0.0)
    {
        return Err(format!(
            "thresholds must be finite and > 0, got {thresholds:?}"
        ));
    }
    if !(thresholds[0] < thresholds[1] && thresholds[1] < thresholds[2]) {
        return Err(format!(
            "thresholds must be strictly increasing, got {thresholds:?}"
        ));
    }
    if !(hysteresis.is_finite() && hysteresis >= 0.0 && hysteresis < thresholds[0]) {
        return Err(format!(
            "hysteresis must be in [0, thresholds[0] = {}), got {hysteresis}",
            thresholds[0]
        ));
    }
    Ok(())
}

/// The level state machine alone, without clocks or atomics, so its rules can be tested (and
/// reused) with any load sequence.
#[derive(Debug, Clone)]
pub struct LevelController {
    thresholds: [f64; 3],
    hysteresis: f64,
    min_dwell_nanos: u64,
    level: ShedLevel,
    /// When `level` was entered, in ticker nanoseconds (0 = at construction).
    since_nanos: u64,
}

impl LevelController {
    /// Starts at [`ShedLevel::Normal`]. The thresholds and hysteresis must satisfy
    /// [`ShedConfig::validate`](super::ShedConfig::validate).
    pub fn new(thresholds: [f64; 3], hysteresis: f64, min_dwell: Duration) -> Self {
        debug_assert!(
            validate_levels(thresholds, hysteresis).is_ok(),
            "{:?}",
            validate_levels(thresholds, hysteresis)
        );
        Self::with_rules(thresholds, hysteresis, saturating_nanos(min_dwell))
    }

    /// The shedder's controller for one evaluation, from its live rules. Unchecked: rules read
    /// while a reconfiguration stores them may mix two valid sets, which the transition rule
    /// takes without failing (for that one evaluation).
    pub(super) fn with_rules(thresholds: [f64; 3], hysteresis: f64, min_dwell_nanos: u64) -> Self {
        Self {
            thresholds,
            hysteresis,
            min_dwell_nanos,
            level: ShedLevel::Normal,
            since_nanos: 0,
        }
    }

    /// Feeds one load ratio (1.0 = at capacity) measured at `now_nanos`. NaN and negative loads
    /// count as 0.
    pub fn observe(&mut self, load: f64, now_nanos: u64) -> ShedLevel {
        let (level, since_nanos) = self.step(self.level, self.since_nanos, load, now_nanos);
        self.level = level;
        self.since_nanos = since_nanos;
        level
    }

    pub fn level(&self) -> ShedLevel {
        self.level
    }

    /// The transition rule, on state passed in so the shedder can keep it in an atomic.
    /// Returns the new level and when it was entered.
    pub(super) fn step(
        &self,
        current: ShedLevel,
        since_nanos: u64,
        load: f64,
        now_nanos: u64,
    ) -> (ShedLevel, u64) {
        let load = sanitize_load(load);
        let reached = self.level_reached_by(load);
        if reached > current {
            // Protection never waits.
            return (reached, now_nanos);
        }
        if current == ShedLevel::Normal {
            return (current, since_nanos);
        }
        let leave_below = self.threshold_of(current) - self.hysteresis;
        let held_nanos = now_nanos.saturating_sub(since_nanos);
        if load < leave_below && held_nanos >= self.min_dwell_nanos {
            return (current.lower(), now_nanos);
        }
        (current, since_nanos)
    }

    /// The highest level whose threshold `load` reaches.
    fn level_reached_by(&self, load: f64) -> ShedLevel {
        let reached = self
            .thresholds
            .iter()
            .take_while(|threshold| load >= **threshold)
            .count();
        ShedLevel::ALL[reached]
    }

    fn threshold_of(&self, level: ShedLevel) -> f64 {
        debug_assert!(level > ShedLevel::Normal);
        self.thresholds[usize::from(level.as_u8()) - 1]
    }
}

/// NaN and negative loads count as 0 (`max` returns the other operand when one is NaN).
pub(super) fn sanitize_load(load: f64) -> f64 {
    load.max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SECOND: u64 = 1_000_000_000;
    const DWELL: Duration = Duration::from_secs(2);

    fn default_controller() -> LevelController {
        LevelController::new([0.70, 0.85, 1.00], 0.05, DWELL)
    }

    /// Feeds `(load, nanos)` pairs and returns every level change as `(nanos, level)`, starting
    /// with the initial level at nanos 0.
    fn changes(
        controller: &mut LevelController,
        inputs: impl IntoIterator<Item = (f64, u64)>,
    ) -> Vec<(u64, ShedLevel)> {
        let mut history = vec![(0, controller.level())];
        for (load, now_nanos) in inputs {
            let before = controller.level();
            let after = controller.observe(load, now_nanos);
            if after != before {
                history.push((now_nanos, after));
            }
        }
        history
    }

    fn levels(changes: &[(u64, ShedLevel)]) -> Vec<ShedLevel> {
        changes.iter().map(|(_, level)| *level).collect()
    }

    use ShedLevel::{CacheOnly, DropExtras, Normal, ShortTimeouts};

    #[test]
    fn a_rising_load_walks_up_through_every_level_in_order() {
        let mut controller = default_controller();
        let ramp = (0..=24_u32).map(|step| {
            (
                f64::from(step) * 0.05,
                SECOND + u64::from(step) * SECOND / 10,
            )
        });
        assert_eq!(
            levels(&changes(&mut controller, ramp)),
            [Normal, DropExtras, ShortTimeouts, CacheOnly]
        );
    }

    #[test]
    fn a_falling_load_walks_down_one_level_at_a_time_in_order() {
        let mut controller = default_controller();
        controller.observe(1.2, SECOND);
        let dwell = saturating_nanos(DWELL);
        let ramp = (1..=24_u32).map(|step| {
            (
                1.2 - f64::from(step) * 0.05,
                SECOND + u64::from(step) * dwell,
            )
        });
        assert_eq!(
            levels(&changes(&mut controller, ramp)),
            [CacheOnly, ShortTimeouts, DropExtras, Normal]
        );
    }

    #[test]
    fn a_load_that_collapses_still_steps_down_one_level_per_dwell() {
        let mut controller = default_controller();
        controller.observe(1.5, SECOND);
        let quiet = (1..=100).map(|step| (0.0, SECOND + step * SECOND / 10));
        let history = changes(&mut controller, quiet);
        assert_eq!(
            levels(&history),
            [CacheOnly, ShortTimeouts, DropExtras, Normal]
        );
        let at: Vec<u64> = history.iter().skip(1).map(|(nanos, _)| *nanos).collect();
        assert_eq!(at, [3 * SECOND, 5 * SECOND, 7 * SECOND]);
    }

    #[test]
    fn a_jump_goes_straight_to_the_level_it_reaches() {
        let mut controller = default_controller();
        assert_eq!(controller.observe(0.0, SECOND), Normal);
        assert_eq!(controller.observe(1.3, SECOND + 1), CacheOnly);
        let mut from_level_two = default_controller();
        assert_eq!(from_level_two.observe(0.9, SECOND), ShortTimeouts);
        assert_eq!(
            from_level_two.observe(0.7, 2 * SECOND),
            ShortTimeouts,
            "dwell"
        );
    }

    #[test]
    fn thresholds_are_inclusive_and_leaving_needs_the_hysteresis() {
        let mut controller = default_controller();
        assert_eq!(controller.observe(0.70, SECOND), DropExtras);
        assert_eq!(controller.observe(0.66, 10 * SECOND), DropExtras);
        assert_eq!(controller.observe(0.64, 10 * SECOND), Normal);
    }

    #[test]
    fn a_load_oscillating_across_a_threshold_changes_level_once() {
        let mut controller = default_controller();
        let oscillation = (0..600).map(|step| {
            let load = if step % 2 == 0 { 0.69 } else { 0.71 };
            (load, SECOND + step * SECOND / 10)
        });
        assert_eq!(
            levels(&changes(&mut controller, oscillation)),
            [Normal, DropExtras]
        );
    }

    #[test]
    fn a_wide_oscillation_leaves_a_level_only_after_the_dwell() {
        let mut controller = default_controller();
        let oscillation = (0..600).map(|step| {
            let load = if step % 2 == 0 { 0.60 } else { 0.75 };
            (load, SECOND + step * SECOND / 10)
        });
        let history = changes(&mut controller, oscillation);
        let dwell = saturating_nanos(DWELL);
        let mut drops = 0;
        // The first pair is the initial level, whose entry time the controller does not know.
        for pair in history.windows(2).skip(1) {
            let ((entered, from), (left, to)) = (pair[0], pair[1]);
            if to < from {
                drops += 1;
                let held = left - entered;
                assert!(held >= dwell, "{from:?} held {held} ns");
            }
        }
        // Over 60 s: at most one drop per dwell, each followed at once by the rise the load asks
        // for (going up never waits).
        assert!((20..=30).contains(&drops), "{drops} drops");
        assert_eq!(
            history.len() - 1,
            2 * drops + 1,
            "rises and drops alternate"
        );
    }

    #[test]
    fn nan_and_negative_loads_count_as_zero() {
        let mut controller = default_controller();
        assert_eq!(controller.observe(f64::NAN, SECOND), Normal);
        assert_eq!(controller.observe(-3.0, SECOND), Normal);
        assert_eq!(controller.observe(f64::INFINITY, SECOND), CacheOnly);
        assert_eq!(controller.observe(f64::NAN, 4 * SECOND), ShortTimeouts);
    }

    proptest! {
        #[test]
        fn the_controller_never_lags_up_skips_down_or_leaves_early(
            steps in proptest::collection::vec((-0.5f64..1.6, 0u64..3 * SECOND), 1..200),
        ) {
            let mut controller = default_controller();
            let dwell = saturating_nanos(DWELL);
            let mut now = SECOND;
            let mut entered = 0;
            for (load, advance) in steps {
                now += advance;
                let before = controller.level();
                let after = controller.observe(load, now);
                prop_assert!(after >= controller.level_reached_by(load.max(0.0)));
                if after < before {
                    prop_assert_eq!(after.as_u8() + 1, before.as_u8());
                    prop_assert!(now - entered >= dwell);
                }
                if after != before {
                    entered = now;
                }
            }
        }
    }
}
