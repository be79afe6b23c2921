//! A canary: a version on some instances for an observation window, judged on their figures
//! against the rest of the fleet's over the same seconds — or, with no other instance, against
//! the canary instances' own window before the change.
//!
//! [`judge`] is the whole decision, a pure function of the figures and the margins
//! (`[rules.canary]`): it rolls back as soon as the figures break a margin on enough traffic,
//! and promotes only once the window is over.

use serde::{Deserialize, Serialize};

use crate::config::CanarySettings;
use crate::rules::window::Figures;

/// What a `POST /admin/v1/rules` body may ask of a rollout: a number of instances or named
/// ones, and the observation window.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolloutRequest {
    /// How many instances take the canary (chosen among the live ones).
    #[serde(default)]
    pub canary: Option<u32>,
    /// The canary instances by id (instead of `canary`).
    #[serde(default)]
    pub instances: Option<Vec<String>>,
    /// The observation window (default `rules.canary.observe_secs`).
    #[serde(default)]
    pub observe_secs: Option<u64>,
}

/// A canary as stored with its version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rollout {
    pub instances: Vec<String>,
    pub observe_secs: u64,
    /// When the canary began (Unix ms).
    pub started_at_ms: i64,
}

impl Rollout {
    pub fn ends_at_ms(&self) -> i64 {
        self.started_at_ms.saturating_add(
            i64::try_from(self.observe_secs.saturating_mul(1000)).unwrap_or(i64::MAX),
        )
    }

    pub fn includes(&self, instance: &str) -> bool {
        self.instances.iter().any(|id| id == instance)
    }
}

/// An instance's own figures for a canary under way: since the canary began, and over as long
/// a span before it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CanaryFigures {
    pub version: u64,
    pub during: Figures,
    pub before: Figures,
}

/// What an instance reports every poll (`rule_instances.report`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceReport {
    pub applied_version: u64,
    pub applied_at_ms: i64,
    #[serde(default)]
    pub canary: Option<CanaryFigures>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Promote,
    RollBack,
    /// Not yet: the window is still open and nothing is wrong so far.
    Wait,
}

/// What the canary was compared with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Baseline {
    /// The other instances over the same seconds.
    Fleet,
    /// The canary instances' own span before the change.
    Before,
}

/// A decision and the figures it was made on, as the history shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub decision: Decision,
    /// `auto`, or the operator's `promote` / `abort`.
    pub by: String,
    pub reasons: Vec<String>,
    pub baseline: Baseline,
    pub canary_instances: Vec<String>,
    pub baseline_instances: Vec<String>,
    pub canary: Summary,
    pub reference: Summary,
    pub decided_at_ms: i64,
}

/// The figures a verdict compares, per side.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub requests: u64,
    pub success_ratio: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_shed_level: u8,
    pub trips_per_instance: f64,
}

impl Summary {
    pub fn of(figures: &Figures, instances: usize) -> Self {
        Self {
            requests: figures.requests,
            success_ratio: figures.success_ratio(),
            p99_ms: figures.p99_ms(),
            max_shed_level: figures.max_shed_level,
            trips_per_instance: figures.trips as f64 / instances.max(1) as f64,
        }
    }
}

/// Judges a canary: `canary` and `reference` are the two sides' summed figures; `window_over`
/// says whether the observation window has ended. A margin broken on `min_requests` or more
/// rolls back at once; a window that ends clean promotes. Without the traffic for a verdict on
/// figures, the end of the window promotes only if `promote_without_traffic`.
pub fn judge(
    canary: &Summary,
    reference: &Summary,
    margins: &CanarySettings,
    window_over: bool,
) -> (Decision, Vec<String>) {
    let mut reasons = Vec::new();
    let enough = canary.requests >= margins.min_requests.max(1);
    if enough {
        if let (Some(mine), Some(theirs)) = (canary.success_ratio, reference.success_ratio)
            && theirs - mine > margins.max_success_drop
        {
            reasons.push(format!(
                "business success ratio {mine:.4} is more than {} below the baseline's {theirs:.4}",
                margins.max_success_drop
            ));
        }
        if let (Some(mine), Some(theirs)) = (canary.p99_ms, reference.p99_ms) {
            let limit = theirs * margins.max_p99_ratio + margins.p99_slack_ms as f64;
            if mine > limit {
                reasons.push(format!(
                    "p99 {mine:.1} ms is above {limit:.1} ms ({theirs:.1} ms × {} + {} ms)",
                    margins.max_p99_ratio, margins.p99_slack_ms
                ));
            }
        }
    }
    // Trips and shed levels count whatever the traffic: a canary that opens a breaker on a
    // trickle is as wrong as one that does on a flood.
    if canary.max_shed_level
        > reference
            .max_shed_level
            .saturating_add(margins.max_shed_level_rise)
    {
        reasons.push(format!(
            "shed level {} is above the baseline's {} by more than {}",
            canary.max_shed_level, reference.max_shed_level, margins.max_shed_level_rise
        ));
    }
    if canary.trips_per_instance - reference.trips_per_instance > margins.max_extra_trips {
        reasons.push(format!(
            "{:.1} breaker trips per instance against the baseline's {:.1} (at most {} more)",
            canary.trips_per_instance, reference.trips_per_instance, margins.max_extra_trips
        ));
    }
    if !reasons.is_empty() {
        return (Decision::RollBack, reasons);
    }
    if !window_over {
        return (Decision::Wait, reasons);
    }
    if enough {
        reasons.push("every figure held within its margin over the window".to_owned());
        return (Decision::Promote, reasons);
    }
    if margins.promote_without_traffic {
        reasons.push(format!(
            "{} requests in the window, fewer than the {} a verdict on figures needs; nothing \
             said it harms (promote_without_traffic)",
            canary.requests, margins.min_requests
        ));
        (Decision::Promote, reasons)
    } else {
        reasons.push(format!(
            "{} requests in the window, fewer than the {} a verdict needs",
            canary.requests, margins.min_requests
        ));
        (Decision::RollBack, reasons)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn margins() -> CanarySettings {
        CanarySettings {
            observe_secs: 120,
            max_observe_secs: 3600,
            min_requests: 100,
            promote_without_traffic: true,
            max_success_drop: 0.02,
            max_p99_ratio: 1.5,
            p99_slack_ms: 20,
            max_extra_trips: 0.0,
            max_shed_level_rise: 0,
        }
    }

    fn summary(requests: u64, success: f64, p99: f64) -> Summary {
        Summary {
            requests,
            success_ratio: Some(success),
            p99_ms: Some(p99),
            max_shed_level: 0,
            trips_per_instance: 0.0,
        }
    }

    #[test]
    fn a_clean_canary_waits_then_promotes() {
        let reference = summary(5000, 0.99, 30.0);
        let canary = summary(2000, 0.985, 40.0);
        assert_eq!(
            judge(&canary, &reference, &margins(), false).0,
            Decision::Wait
        );
        assert_eq!(
            judge(&canary, &reference, &margins(), true).0,
            Decision::Promote
        );
    }

    #[test]
    fn a_broken_margin_rolls_back_before_the_window_ends() {
        let reference = summary(5000, 0.99, 30.0);
        let (decision, reasons) = judge(&summary(2000, 0.60, 30.0), &reference, &margins(), false);
        assert_eq!(decision, Decision::RollBack);
        assert!(
            reasons[0].contains("business success ratio 0.6000"),
            "{reasons:?}"
        );
        let (decision, reasons) = judge(&summary(2000, 0.99, 66.0), &reference, &margins(), false);
        assert_eq!(decision, Decision::RollBack);
        assert!(reasons[0].contains("above 65.0 ms"), "{reasons:?}");
        // Within the slack: 64 ms against 30 × 1.5 + 20.
        assert_eq!(
            judge(&summary(2000, 0.99, 64.0), &reference, &margins(), false).0,
            Decision::Wait
        );
    }

    #[test]
    fn trips_and_shed_levels_count_on_any_traffic() {
        let reference = summary(5000, 0.99, 30.0);
        let mut canary = summary(3, 1.0, 1.0);
        canary.trips_per_instance = 1.0;
        assert_eq!(
            judge(&canary, &reference, &margins(), false).0,
            Decision::RollBack
        );
        let mut canary = summary(3, 1.0, 1.0);
        canary.max_shed_level = 1;
        assert_eq!(
            judge(&canary, &reference, &margins(), false).0,
            Decision::RollBack
        );
    }

    #[test]
    fn too_little_traffic_decides_by_the_setting() {
        let reference = summary(5000, 0.99, 30.0);
        // A bad ratio on 10 requests is no evidence.
        let canary = summary(10, 0.5, 300.0);
        assert_eq!(
            judge(&canary, &reference, &margins(), false).0,
            Decision::Wait
        );
        assert_eq!(
            judge(&canary, &reference, &margins(), true).0,
            Decision::Promote
        );
        let strict = CanarySettings {
            promote_without_traffic: false,
            ..margins()
        };
        assert_eq!(
            judge(&canary, &reference, &strict, true).0,
            Decision::RollBack
        );
    }
}
