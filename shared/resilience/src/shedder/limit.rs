//! The adaptive concurrency limit: Gradient2, with a recovery step (see the shedder's module
//! documentation for how it follows latency).

/// Allowed ratio of short- to long-term latency before the limit shrinks (Gradient2's tolerance).
const LATENCY_TOLERANCE: f64 = 1.5;
/// Share of `√limit` the limit grows by per interval while latency is within the tolerance, on
/// top of the multiplicative step: what lifts a limit at the floor (16) off it quickly. With
/// both, the floor is back at 512 in about 6 s of baseline latency at 250 ms intervals.
const RECOVERY_STEP: f64 = 0.5;
/// Weight of one interval in the long-term latency: about 20 intervals (5 s at 250 ms) of memory.
pub(super) const LONG_LATENCY_ALPHA: f64 = 0.05;
/// Share of each new limit estimate taken per interval, so one noisy interval moves it little.
const LIMIT_SMOOTHING: f64 = 0.2;
/// The limit shrinks at most by half per estimate, so an outlier cannot collapse it.
const MIN_GRADIENT: f64 = 0.5;
/// The limit grows at most by this factor per estimate (before smoothing), reached when latency
/// is at most `LATENCY_TOLERANCE / MAX_GRADIENT` of the baseline: Envoy's adaptive concurrency
/// caps its gradient at 2 for the same reason, so that recovery is multiplicative.
const MAX_GRADIENT: f64 = 2.0;

/// The next adaptive concurrency limit (Gradient2 that recovers): shrinks when the interval's
/// latency `short` exceeds the tolerated multiple of the baseline `long`, and probes back up by
/// `√limit / 2` an interval while latency is within it.
pub(super) fn next_limit(limit: f64, short_nanos: f64, long_nanos: f64, min: f64, max: f64) -> f64 {
    let gradient = if short_nanos > 0.0 {
        (LATENCY_TOLERANCE * long_nanos / short_nanos).clamp(MIN_GRADIENT, MAX_GRADIENT)
    } else {
        MAX_GRADIENT
    };
    let next = if gradient < 1.0 {
        let estimate = limit * gradient + limit.sqrt();
        limit * (1.0 - LIMIT_SMOOTHING) + estimate * LIMIT_SMOOTHING
    } else {
        // Within the tolerance: grow by the smoothed share of the gradient's headroom (10 % an
        // interval at the baseline, 20 % well below it) plus the additive probe, so a limit an
        // incident cut returns within seconds once latency is back, however small the cut left it.
        limit * (1.0 + LIMIT_SMOOTHING * (gradient - 1.0)) + limit.sqrt() * RECOVERY_STEP
    };
    next.clamp(min, max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn the_adaptive_limit_stays_within_its_bounds(
            samples in proptest::collection::vec(0u64..10_000_000_000, 1..100),
        ) {
            let (min, max) = (16.0, 512.0);
            let mut limit = max;
            let mut long = 0.0;
            for short in samples {
                let short = short as f64;
                long = if long > 0.0 { long + LONG_LATENCY_ALPHA * (short - long) } else { short };
                limit = next_limit(limit, short, long, min, max);
                prop_assert!((min..=max).contains(&limit), "{}", limit);
            }
        }
    }
}
