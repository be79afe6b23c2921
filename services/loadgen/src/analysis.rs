//! Pure arithmetic over the timelines the chaos suite and the soak record: when a phase
//! recovered, when the concurrency limit came back, how the shed level moved, how fast RSS grew.
//! Kept apart from the code that produces the timelines so that every definition is tested on
//! hand-made data.

use serde::Serialize;

/// One second of a load's figures (by scheduled time, from the measured start).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SecondPoint {
    /// Start of the second, seconds from the measured start.
    pub at_s: f64,
    pub requests: u64,
    /// HTTP 200 ÷ logical requests of that second (`None` when none were scheduled).
    pub answered_share: Option<f64>,
    pub p99_ms: Option<f64>,
}

/// What counts as "back to the baseline" for one second.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Tolerance {
    /// P99 at most `p99_factor` × the baseline P99 …
    pub p99_factor: f64,
    /// … or the baseline P99 plus this many ms, whichever is larger (a 2 ms baseline doubled is
    /// still noise on a 2-core machine).
    pub p99_slack_ms: f64,
    /// Answered share at least the baseline's minus this (0.01 = one point).
    pub answered_drop: f64,
    /// This many consecutive seconds within the tolerance.
    pub consecutive: usize,
}

impl Tolerance {
    pub const DEFAULT: Self = Self {
        p99_factor: 2.0,
        p99_slack_ms: 10.0,
        answered_drop: 0.01,
        consecutive: 3,
    };

    /// Whether one second is within the tolerance of the baseline.
    pub fn within(
        &self,
        point: &SecondPoint,
        baseline_p99_ms: f64,
        baseline_answered: f64,
    ) -> bool {
        let p99_bound =
            (baseline_p99_ms * self.p99_factor).max(baseline_p99_ms + self.p99_slack_ms);
        let p99_ok = point.p99_ms.is_some_and(|p99| p99 <= p99_bound);
        let answered_ok = point
            .answered_share
            .is_some_and(|share| share >= baseline_answered - self.answered_drop);
        p99_ok && answered_ok
    }
}

/// Seconds from `fault_end_s` to the start of the first second at or after it that begins a
/// run of `tolerance.consecutive` seconds within the tolerance of the baseline. `None` when no
/// such run starts before the points end (not recovered within the recovery window).
pub fn recovery_time(
    points: &[SecondPoint],
    fault_end_s: f64,
    baseline_p99_ms: f64,
    baseline_answered: f64,
    tolerance: &Tolerance,
) -> Option<f64> {
    let after: Vec<&SecondPoint> = points
        .iter()
        .filter(|point| point.at_s + 1e-9 >= fault_end_s)
        .collect();
    let needed = tolerance.consecutive.max(1);
    (0..after.len()).find_map(|start| {
        let run = after.get(start..start + needed)?;
        run.iter()
            .all(|point| tolerance.within(point, baseline_p99_ms, baseline_answered))
            .then(|| (after[start].at_s - fault_end_s).max(0.0))
    })
}

/// One sample of the service's status page.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct StatusPoint {
    /// Seconds from the phase's measured start.
    pub at_s: f64,
    pub level: Option<u8>,
    pub concurrency_limit: Option<f64>,
    pub in_flight: Option<f64>,
    pub load: Option<f64>,
    /// The standing in-flight count the shedder compared with its limit.
    pub standing_in_flight: Option<f64>,
    /// The runtime queue delay the shedder last measured, ms (tells a queue-driven level from
    /// an in-flight-driven one).
    pub queue_delay_ms: Option<f64>,
    /// The API listener's accept queue at the service's last reading: connections waiting to
    /// be accepted and the wait they stood for, ms (part of `queue_delay_ms`; absent where the
    /// service cannot read it or does not count it).
    pub accept_queued: Option<f64>,
    pub accept_wait_ms: Option<f64>,
    /// The share of the interval the runtime's workers were busy (tells CPU saturation from
    /// requests waiting on a dependency).
    pub worker_busy: Option<f64>,
    /// Completions per second in the shedder's last interval, and the mean rate of admissions
    /// over about a second (what its level-3 hold compares).
    pub throughput_rps: Option<f64>,
    pub mean_offered_rps: Option<f64>,
    /// The rate the shedder learned as saturated, rps.
    pub saturated_rps: Option<f64>,
    /// The highest rate the shedder saw served with spare capacity (the saturated rate's floor).
    pub served_rps: Option<f64>,
    /// The service's VmRSS, bytes.
    pub rss_bytes: Option<u64>,
    /// The Redis and MySQL breakers' states (`closed`, `open`, `half_open`): a stall at level 0
    /// is read against them.
    pub redis_breaker: Option<&'static str>,
    pub mysql_breaker: Option<&'static str>,
}

/// A breaker state as the status page names it, or `None` for anything else.
pub fn breaker_state(name: &str) -> Option<&'static str> {
    ["closed", "open", "half_open"]
        .into_iter()
        .find(|state| *state == name)
}

/// The median of the concurrency limit sampled in `[from_s, to_s)`.
pub fn median_limit(points: &[StatusPoint], from_s: f64, to_s: f64) -> Option<f64> {
    let mut limits: Vec<f64> = points
        .iter()
        .filter(|point| point.at_s >= from_s && point.at_s < to_s)
        .filter_map(|point| point.concurrency_limit)
        .collect();
    if limits.is_empty() {
        return None;
    }
    limits.sort_by(f64::total_cmp);
    Some(limits[limits.len() / 2])
}

/// Seconds from `from_s` until the concurrency limit is within `band` (0.2 = ±20 %) of
/// `reference` and stays there for `hold_s` (every sample in that time within the band).
/// `None` when that never happens among the samples.
pub fn limit_recovery(
    points: &[StatusPoint],
    from_s: f64,
    reference: f64,
    band: f64,
    hold_s: f64,
) -> Option<f64> {
    let after: Vec<(f64, f64)> = points
        .iter()
        .filter(|point| point.at_s >= from_s)
        .filter_map(|point| point.concurrency_limit.map(|limit| (point.at_s, limit)))
        .collect();
    let within = |limit: f64| (limit - reference).abs() <= band * reference.abs();
    let last_at = after.last()?.0;
    (0..after.len()).find_map(|start| {
        let (begin, _) = after[start];
        if begin + hold_s > last_at + 1e-9 {
            return None;
        }
        after[start..]
            .iter()
            .take_while(|(at, _)| *at <= begin + hold_s + 1e-9)
            .all(|(_, limit)| within(*limit))
            .then_some(begin - from_s)
    })
}

/// How the shed level moved around an overload that started at `overload_s` and ended at
/// `drop_s`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LevelMoves {
    /// Highest level sampled before the overload.
    pub max_before: Option<u8>,
    /// Seconds from the overload's start to the first sample at level 3.
    pub to_level_3_s: Option<f64>,
    /// Seconds from the load's drop to the first sample at level 0 after it, from which it
    /// stays at 0 to the end of the samples.
    pub to_level_0_s: Option<f64>,
    /// Level changes between consecutive samples from the overload's start on.
    pub changes: usize,
    /// Rises of the level after it had first fallen from its peak (flapping: a level left and
    /// entered again), from the overload's start on.
    pub rises_after_a_fall: usize,
}

pub fn level_moves(points: &[StatusPoint], overload_s: f64, drop_s: f64) -> LevelMoves {
    let before = points
        .iter()
        .filter(|point| point.at_s < overload_s)
        .filter_map(|point| point.level)
        .max();
    let levels: Vec<(f64, u8)> = points
        .iter()
        .filter(|point| point.at_s >= overload_s)
        .filter_map(|point| point.level.map(|level| (point.at_s, level)))
        .collect();
    let to_level_3_s = levels
        .iter()
        .find(|(_, level)| *level >= 3)
        .map(|(at, _)| at - overload_s);
    let after_drop: Vec<&(f64, u8)> = levels.iter().filter(|(at, _)| *at >= drop_s).collect();
    let to_level_0_s = (0..after_drop.len())
        .find(|start| after_drop[*start..].iter().all(|(_, level)| *level == 0))
        .map(|start| (after_drop[start].0 - drop_s).max(0.0));
    let mut changes = 0;
    let mut rises_after_a_fall = 0;
    let mut fallen = false;
    for pair in levels.windows(2) {
        let (previous, next) = (pair[0].1, pair[1].1);
        if next != previous {
            changes += 1;
        }
        if next < previous {
            fallen = true;
        } else if next > previous && fallen {
            rises_after_a_fall += 1;
        }
    }
    LevelMoves {
        max_before: before,
        to_level_3_s,
        to_level_0_s,
        changes,
        rises_after_a_fall,
    }
}

/// Least-squares slope of `(seconds, bytes)` samples, in MiB per minute (`None` with fewer
/// than two distinct times).
pub fn slope_mib_per_minute(samples: &[(f64, u64)]) -> Option<f64> {
    if samples.len() < 2 {
        return None;
    }
    let count = samples.len() as f64;
    let mean_t = samples.iter().map(|(t, _)| t).sum::<f64>() / count;
    let mean_y = samples.iter().map(|(_, y)| *y as f64).sum::<f64>() / count;
    let (mut numerator, mut denominator) = (0.0, 0.0);
    for (t, y) in samples {
        numerator += (t - mean_t) * (*y as f64 - mean_y);
        denominator += (t - mean_t) * (t - mean_t);
    }
    if denominator <= 0.0 {
        return None;
    }
    Some(numerator / denominator * 60.0 / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn second(at_s: f64, answered: f64, p99: f64) -> SecondPoint {
        SecondPoint {
            at_s,
            requests: 100,
            answered_share: Some(answered),
            p99_ms: Some(p99),
        }
    }

    #[test]
    fn recovery_is_the_first_of_n_good_seconds_after_the_fault() {
        // Baseline P99 5 ms, 100 % answered; the fault ends at 10 s.
        let mut points: Vec<SecondPoint> = (0..10).map(|s| second(s as f64, 1.0, 5.0)).collect();
        points.push(second(10.0, 0.5, 900.0));
        points.push(second(11.0, 1.0, 14.0)); // good (≤ 5 + 10)
        points.push(second(12.0, 1.0, 40.0)); // bad: breaks the run
        points.push(second(13.0, 0.995, 9.0));
        points.push(second(14.0, 1.0, 6.0));
        points.push(second(15.0, 1.0, 5.0));
        points.push(second(16.0, 1.0, 5.0));
        let tolerance = Tolerance::DEFAULT;
        assert_eq!(
            recovery_time(&points, 10.0, 5.0, 1.0, &tolerance),
            Some(3.0)
        );
        // Never three good seconds in a row: not recovered.
        assert_eq!(
            recovery_time(&points[..14], 10.0, 5.0, 1.0, &tolerance),
            None
        );
        // Good from the first second after the fault: 0.
        let healthy: Vec<SecondPoint> = (0..20).map(|s| second(s as f64, 1.0, 5.0)).collect();
        assert_eq!(
            recovery_time(&healthy, 10.0, 5.0, 1.0, &tolerance),
            Some(0.0)
        );
    }

    #[test]
    fn the_tolerance_uses_the_larger_of_factor_and_slack_and_needs_answers() {
        let tolerance = Tolerance::DEFAULT;
        // Baseline 50 ms: 2× = 100 ms is the bound.
        assert!(tolerance.within(&second(0.0, 1.0, 99.0), 50.0, 1.0));
        assert!(!tolerance.within(&second(0.0, 1.0, 101.0), 50.0, 1.0));
        // One point of answered share may be lost, not two.
        assert!(tolerance.within(&second(0.0, 0.99, 5.0), 5.0, 1.0));
        assert!(!tolerance.within(&second(0.0, 0.98, 5.0), 5.0, 1.0));
        let empty = SecondPoint {
            at_s: 0.0,
            requests: 0,
            answered_share: None,
            p99_ms: None,
        };
        assert!(!tolerance.within(&empty, 5.0, 1.0));
    }

    fn status(at_s: f64, level: u8, limit: f64) -> StatusPoint {
        StatusPoint {
            at_s,
            level: Some(level),
            concurrency_limit: Some(limit),
            ..StatusPoint::default()
        }
    }

    #[test]
    fn the_limit_recovers_when_it_stays_in_the_band() {
        // 200 before; the lock at 10–15 s drops it to 40; it climbs back.
        let mut points = Vec::new();
        for tick in 0..40 {
            points.push(status(tick as f64 * 0.25, 0, 200.0));
        }
        let climb = [
            40.0, 60.0, 120.0, 170.0, 150.0, 175.0, 190.0, 200.0, 205.0, 198.0,
        ];
        for (index, limit) in climb.iter().enumerate() {
            points.push(status(15.0 + index as f64, 0, *limit));
        }
        for index in 0..10 {
            points.push(status(25.0 + index as f64, 0, 200.0));
        }
        assert_eq!(median_limit(&points, 0.0, 10.0), Some(200.0));
        // 170 is within 20 % of 200, but 150 right after it is not: recovery from 175 (5 s).
        assert_eq!(limit_recovery(&points, 15.0, 200.0, 0.2, 3.0), Some(5.0));
        // Never back within 1 %: None.
        let low: Vec<StatusPoint> = (0..20).map(|s| status(s as f64, 0, 100.0)).collect();
        assert_eq!(limit_recovery(&low, 0.0, 200.0, 0.01, 3.0), None);
    }

    #[test]
    fn level_moves_time_level_3_and_the_way_back_and_count_flaps() {
        // 80 % until 10 s (level 0), 150 % until 20 s, then 80 % again.
        let levels = [
            (9.75, 0),
            (10.0, 0),
            (10.25, 2),
            (10.5, 3),
            (15.0, 3),
            (20.0, 3),
            (21.0, 2),
            (22.0, 1),
            (23.0, 0),
            (24.0, 0),
        ];
        let points: Vec<StatusPoint> = levels
            .iter()
            .map(|(at, level)| status(*at, *level, 100.0))
            .collect();
        let moves = level_moves(&points, 10.0, 20.0);
        assert_eq!(moves.max_before, Some(0));
        assert_eq!(moves.to_level_3_s, Some(0.5));
        assert_eq!(moves.to_level_0_s, Some(3.0));
        assert_eq!(moves.changes, 5);
        assert_eq!(moves.rises_after_a_fall, 0);

        // Flapping: 3 → 2 → 3 during the overload, 0 → 1 → 0 after.
        let levels = [
            (10.0, 3),
            (11.0, 2),
            (12.0, 3),
            (20.0, 3),
            (21.0, 0),
            (22.0, 1),
            (23.0, 0),
        ];
        let points: Vec<StatusPoint> = levels
            .iter()
            .map(|(at, level)| status(*at, *level, 100.0))
            .collect();
        let moves = level_moves(&points, 10.0, 20.0);
        assert_eq!(moves.rises_after_a_fall, 2);
        assert_eq!(moves.to_level_0_s, Some(3.0), "from the last return to 0");
    }

    #[test]
    fn rss_slope_is_in_mib_per_minute() {
        let mib = 1024 * 1024;
        // +1 MiB every 30 s = 2 MiB/min.
        let samples: Vec<(f64, u64)> = (0..10)
            .map(|index| (index as f64 * 30.0, 100 * mib + index * mib))
            .collect();
        let slope = slope_mib_per_minute(&samples).unwrap();
        assert!((slope - 2.0).abs() < 1e-9, "{slope}");
        let flat: Vec<(f64, u64)> = (0..10).map(|index| (index as f64, 50 * mib)).collect();
        assert_eq!(slope_mib_per_minute(&flat), Some(0.0));
        assert_eq!(slope_mib_per_minute(&[(0.0, 1)]), None);
    }
}
