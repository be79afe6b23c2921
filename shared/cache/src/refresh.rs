//! Refresh ahead: reloading an entry shortly before it stops being fresh, so that a key read
//! often never makes a caller wait for its reload.
//!
//! The decision is XFetch's probabilistic early expiration (Vattani, Chierichetti and
//! Lowenstein, "Optimal Probabilistic Cache Stampede Prevention", VLDB 2015): a read `t` before
//! the entry stops being fresh starts a refresh with probability `exp(-t / lead)`. A key read `r`
//! times a second is refreshed about `lead × ln(r × lead)` before its expiry, so the hotter the
//! key the earlier; a key read once in a while is almost never refreshed early and simply loads on
//! its next miss. No list of hot keys is needed, and each read costs one comparison outside the
//! last few `lead`s of an entry's life.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rebate_domain::Timestamp;

/// Beyond this many `lead`s before the expiry no read refreshes (the chance there is e^-10, about
/// one in 22,000 reads), so that almost every read costs a comparison and no random draw.
const HORIZON_LEADS: f64 = 10.0;

/// Whether a read at `now` of an entry fresh until `fresh_until` should start a refresh.
/// `uniform` draws from (0, 1]; it is called only inside the horizon. A zero `lead` never
/// refreshes.
pub fn refresh_due(
    fresh_until: Timestamp,
    now: Timestamp,
    lead: Duration,
    uniform: impl FnOnce() -> f64,
) -> bool {
    if lead.is_zero() || now >= fresh_until {
        return false;
    }
    let remaining_ms = fresh_until.millis_since(now) as f64;
    let lead_ms = lead.as_secs_f64() * 1_000.0;
    if remaining_ms > lead_ms * HORIZON_LEADS {
        return false;
    }
    remaining_ms <= lead_ms * -uniform().ln()
}

/// A draw from (0, 1] for [`refresh_due`].
pub fn uniform_draw() -> f64 {
    1.0 - rand::random::<f64>()
}

/// A refresh lead that can be replaced at runtime. Every fresh hit reads it (a part cache's, and
/// the engine's kept renderings), so a read is one relaxed atomic load: the lead is a lone
/// scalar, and no other value has to be seen together with it.
#[derive(Debug)]
pub struct RefreshLead {
    /// Nanoseconds, saturated at `u64::MAX` (584 years).
    nanos: AtomicU64,
}

impl RefreshLead {
    pub fn new(lead: Duration) -> Self {
        Self {
            nanos: AtomicU64::new(saturating_nanos(lead)),
        }
    }

    pub fn get(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::Relaxed))
    }

    /// Applies from the next read on; zero turns refresh ahead off.
    pub fn set(&self, lead: Duration) {
        self.nanos.store(saturating_nanos(lead), Ordering::Relaxed);
    }
}

fn saturating_nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(millis: i64) -> Timestamp {
        Timestamp::from_millis(millis)
    }

    #[test]
    fn a_refresh_lead_reads_what_was_set_last() {
        let lead = RefreshLead::new(Duration::from_secs(1));
        assert_eq!(lead.get(), Duration::from_secs(1));
        lead.set(Duration::from_millis(1_500));
        assert_eq!(lead.get(), Duration::from_millis(1_500));
        lead.set(Duration::MAX);
        assert_eq!(lead.get(), Duration::from_nanos(u64::MAX));
    }

    #[test]
    fn nothing_is_refreshed_without_a_lead_or_after_the_expiry() {
        let lead = Duration::from_secs(1);
        assert!(!refresh_due(at(10_000), at(9_999), Duration::ZERO, || 1e-9));
        assert!(!refresh_due(at(10_000), at(10_000), lead, || 1e-9));
        assert!(!refresh_due(at(10_000), at(12_000), lead, || 1e-9));
    }

    #[test]
    fn beyond_the_horizon_no_draw_is_made() {
        let lead = Duration::from_secs(1);
        let never_drawn = || -> f64 { panic!("no draw outside the horizon") };
        assert!(!refresh_due(at(20_001), at(10_000), lead, never_drawn));
    }

    #[test]
    fn the_chance_is_exp_of_minus_time_left_over_lead() {
        let lead = Duration::from_secs(1);
        // 500 ms left: due when -ln(u) ≥ 0.5, i.e. u ≤ e^-0.5 ≈ 0.6065.
        assert!(refresh_due(at(10_000), at(9_500), lead, || 0.60));
        assert!(!refresh_due(at(10_000), at(9_500), lead, || 0.61));
        // The share of uniform draws that refresh matches exp(-t / lead).
        let draws = 10_000;
        let refreshed = (1..=draws)
            .filter(|step| {
                let uniform = f64::from(*step) / f64::from(draws);
                refresh_due(at(10_000), at(8_000), lead, || uniform)
            })
            .count();
        let expected = (-2.0f64).exp() * f64::from(draws);
        assert!(
            (refreshed as f64 - expected).abs() < 2.0,
            "{refreshed} vs {expected}"
        );
    }
}
