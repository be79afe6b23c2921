//! Retries that cannot become a storm.
//!
//! A retry is allowed only for idempotent reads, only while the request's own allowance lasts
//! (at most two per request, counted by the caller) and only while the process-wide
//! [`RetryBudget`] has a token: every first attempt deposits `ratio` of a token, every retry
//! withdraws a whole one, so retries never exceed `ratio` of calls, however hard a dependency
//! fails. The back-off between attempts grows exponentially with jitter ([`Backoff`]).
//!
//! The budget also holds the per-request allowance and the back-off in force, so that one
//! [`RetryBudget::reconfigure`] changes every retry knob under running calls.

use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use rand::Rng;
use serde::Serialize;

use crate::live::lock;
use crate::ticker::saturating_nanos;

/// The retry knobs of one dependency.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RetryConfig {
    /// Retries one request may spend across all its calls; 0 disables retries.
    pub max_per_request: u32,
    /// Retries allowed per first attempt, process-wide (0.1 = at most 10 % extra calls).
    pub ratio: f64,
    /// Tokens a quiet spell may save up for a later burst of retries.
    pub max_saved: u32,
    /// The first back-off; each further retry doubles it.
    pub base_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            max_per_request: 2,
            ratio: 0.1,
            max_saved: 10,
            base_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(100),
        }
    }
}

impl RetryConfig {
    pub fn validate(&self) -> Result<(), String> {
        if self.max_per_request > 2 {
            return Err(format!(
                "max_per_request must be 0, 1 or 2, got {}",
                self.max_per_request
            ));
        }
        if !(self.ratio.is_finite() && (0.0..=1.0).contains(&self.ratio)) {
            return Err(format!("ratio must be in [0, 1], got {}", self.ratio));
        }
        if self.base_backoff.is_zero() || self.base_backoff > self.max_backoff {
            return Err(format!(
                "base_backoff must be > 0 and ≤ max_backoff ({:?} > {:?})",
                self.base_backoff, self.max_backoff
            ));
        }
        Ok(())
    }
}

/// Milli-tokens, so a 10 % ratio deposits 100 per call without floating point on the hot path.
const TOKEN: i64 = 1_000;

/// The process-wide share of calls that may be retries, with the per-request allowance and the
/// back-off in force.
#[derive(Debug)]
pub struct RetryBudget {
    /// The configuration in force, for [`Self::config`]; only [`Self::reconfigure`] takes the
    /// lock (while it stores the atomics below, which calls read).
    config: Mutex<RetryConfig>,
    /// Milli-tokens a first attempt deposits.
    deposit: AtomicI64,
    /// The most milli-tokens the balance saves.
    cap: AtomicI64,
    max_per_request: AtomicU32,
    base_backoff_nanos: AtomicU64,
    max_backoff_nanos: AtomicU64,
    balance: AtomicI64,
    first_attempts: AtomicU64,
    retries: AtomicU64,
    refused: AtomicU64,
}

impl RetryBudget {
    /// Starts empty: the first retries are earned by first attempts.
    pub fn new(config: &RetryConfig) -> Self {
        let budget = Self {
            config: Mutex::new(*config),
            deposit: AtomicI64::new(0),
            cap: AtomicI64::new(0),
            max_per_request: AtomicU32::new(0),
            base_backoff_nanos: AtomicU64::new(0),
            max_backoff_nanos: AtomicU64::new(0),
            balance: AtomicI64::new(0),
            first_attempts: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        };
        budget.store(config);
        budget
    }

    /// Applies `config` from the next call on: the ratio (what a first attempt deposits), the
    /// tokens saved at most (the balance is cut to the new cap at once), the retries a request
    /// may spend and the back-off. The balance saved and the counts are kept.
    pub fn reconfigure(&self, config: &RetryConfig) {
        let mut in_force = lock(&self.config);
        self.store(config);
        let cap = self.cap.load(Ordering::Relaxed);
        self.balance.fetch_min(cap, Ordering::Relaxed);
        *in_force = *config;
    }

    fn store(&self, config: &RetryConfig) {
        let relaxed = Ordering::Relaxed;
        self.deposit.store(
            (config.ratio.clamp(0.0, 1.0) * TOKEN as f64).round() as i64,
            relaxed,
        );
        self.cap
            .store(i64::from(config.max_saved.max(1)) * TOKEN, relaxed);
        self.max_per_request.store(config.max_per_request, relaxed);
        self.base_backoff_nanos
            .store(saturating_nanos(config.base_backoff), relaxed);
        self.max_backoff_nanos
            .store(saturating_nanos(config.max_backoff), relaxed);
    }

    /// The configuration in force.
    pub fn config(&self) -> RetryConfig {
        *lock(&self.config)
    }

    /// Retries one request may spend across all its calls.
    pub fn max_per_request(&self) -> u32 {
        self.max_per_request.load(Ordering::Relaxed)
    }

    /// The back-off in force (equal jitter, as [`Backoff::from`] a [`RetryConfig`]).
    pub fn backoff(&self) -> Backoff {
        Backoff {
            base: Duration::from_nanos(self.base_backoff_nanos.load(Ordering::Relaxed)),
            max: Duration::from_nanos(self.max_backoff_nanos.load(Ordering::Relaxed)),
            jitter: Jitter::Equal,
        }
    }

    /// Records a first attempt.
    pub fn deposit(&self) {
        self.first_attempts.fetch_add(1, Ordering::Relaxed);
        let deposit = self.deposit.load(Ordering::Relaxed);
        let cap = self.cap.load(Ordering::Relaxed);
        let _ = self
            .balance
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |balance| {
                Some((balance + deposit).min(cap))
            });
    }

    /// Takes a token for one retry, or says no.
    pub fn try_withdraw(&self) -> bool {
        let taken = self
            .balance
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |balance| {
                (balance >= TOKEN).then_some(balance - TOKEN)
            })
            .is_ok();
        if taken {
            self.retries.fetch_add(1, Ordering::Relaxed);
        } else {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
        taken
    }

    /// First attempts, retries made and retries refused since start.
    pub fn counts(&self) -> (u64, u64, u64) {
        (
            self.first_attempts.load(Ordering::Relaxed),
            self.retries.load(Ordering::Relaxed),
            self.refused.load(Ordering::Relaxed),
        )
    }
}

/// Exponential back-off: retry `n` (1-based) waits a random time up to
/// `d = min(base × 2^(n−1), max)`, spread by its [`Jitter`] so that the retries of many clients
/// (or the reconnects of a fleet) do not arrive in lockstep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
    pub jitter: Jitter,
}

/// How a [`Backoff`] spreads its delay below the ceiling `d`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Jitter {
    /// Uniform in `[d/2, d]`: spread, yet never collapsing to an immediate retry (calls).
    Equal,
    /// Uniform in `[0, d]`: the widest spread (a fleet reconnecting after a broker restart).
    Full,
}

impl Backoff {
    /// The ceiling of retry `retry`'s delay (1-based; 0 counts as 1).
    pub fn cap(&self, retry: u32) -> Duration {
        let doubling = retry.saturating_sub(1).min(20);
        self.base.saturating_mul(1 << doubling).min(self.max)
    }

    pub fn delay(&self, retry: u32) -> Duration {
        self.delay_for(retry, rand::rng().random::<f64>())
    }

    /// The delay of retry `retry` for the random draw `unit` in `[0, 1]` (clamped): the same
    /// spread as [`Backoff::delay`], for a caller that brings its own seeded randomness (the load
    /// generator, so that a run can be repeated).
    pub fn delay_for(&self, retry: u32, unit: f64) -> Duration {
        let ceiling = self.cap(retry);
        let floor = match self.jitter {
            Jitter::Equal => ceiling / 2,
            Jitter::Full => Duration::ZERO,
        };
        let unit = if unit.is_nan() {
            0.0
        } else {
            unit.clamp(0.0, 1.0)
        };
        floor + ceiling.saturating_sub(floor).mul_f64(unit)
    }
}

impl From<&RetryConfig> for Backoff {
    fn from(config: &RetryConfig) -> Self {
        Self {
            base: config.base_backoff,
            max: config.max_backoff,
            jitter: Jitter::Equal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_given_draw_picks_its_place_between_the_floor_and_the_ceiling() {
        let equal = Backoff {
            base: Duration::from_millis(200),
            max: Duration::from_secs(5),
            jitter: Jitter::Equal,
        };
        assert_eq!(equal.delay_for(1, 0.0), Duration::from_millis(100));
        assert_eq!(equal.delay_for(1, 0.5), Duration::from_millis(150));
        assert_eq!(equal.delay_for(2, 1.0), Duration::from_millis(400));
        assert_eq!(equal.delay_for(9, 1.0), Duration::from_secs(5), "capped");
        assert_eq!(
            equal.delay_for(1, 7.0),
            Duration::from_millis(200),
            "clamped"
        );
        assert_eq!(equal.delay_for(1, f64::NAN), Duration::from_millis(100));
        let full = Backoff {
            jitter: Jitter::Full,
            ..equal
        };
        assert_eq!(full.delay_for(1, 0.0), Duration::ZERO);
        assert_eq!(full.delay_for(3, 0.25), Duration::from_millis(200));
    }

    #[test]
    fn retries_never_exceed_the_ratio_of_first_attempts() {
        let budget = RetryBudget::new(&RetryConfig::default());
        // Every call fails and wants two retries.
        let mut calls = 0u64;
        for _ in 0..1_000 {
            budget.deposit();
            calls += 1;
            for _ in 0..2 {
                if budget.try_withdraw() {
                    calls += 1;
                }
            }
        }
        let (first, retries, refused) = budget.counts();
        assert_eq!(first, 1_000);
        assert_eq!(retries, 100);
        assert_eq!(refused, 1_900);
        assert!(calls as f64 <= 1.1 * 1_000.0);
    }

    #[test]
    fn a_quiet_spell_saves_at_most_max_saved() {
        let budget = RetryBudget::new(&RetryConfig {
            max_saved: 3,
            ..RetryConfig::default()
        });
        for _ in 0..10_000 {
            budget.deposit();
        }
        let granted = (0..10).filter(|_| budget.try_withdraw()).count();
        assert_eq!(granted, 3);
    }

    #[test]
    fn a_reconfigured_budget_caps_its_savings_and_deposits_at_the_new_ratio() {
        let budget = RetryBudget::new(&RetryConfig::default());
        for _ in 0..200 {
            budget.deposit();
        }
        let tighter = RetryConfig {
            max_per_request: 1,
            ratio: 0.5,
            max_saved: 4,
            base_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(50),
        };
        budget.reconfigure(&tighter);
        assert_eq!(budget.config(), tighter);
        assert_eq!(budget.max_per_request(), 1);
        assert_eq!(
            budget.backoff(),
            Backoff {
                base: Duration::from_millis(20),
                max: Duration::from_millis(50),
                jitter: Jitter::Equal
            }
        );
        assert_eq!(
            (0..10).filter(|_| budget.try_withdraw()).count(),
            4,
            "the ten saved, cut to the new cap"
        );
        for _ in 0..4 {
            budget.deposit();
        }
        assert_eq!(
            (0..10).filter(|_| budget.try_withdraw()).count(),
            2,
            "half a token per first attempt"
        );
        assert_eq!(budget.counts(), (204, 6, 14), "the counts are kept");
        budget.reconfigure(&RetryConfig::default());
        for _ in 0..10 {
            budget.deposit();
        }
        assert!(budget.try_withdraw() && !budget.try_withdraw());
    }

    #[test]
    fn a_zero_ratio_never_retries() {
        let budget = RetryBudget::new(&RetryConfig {
            ratio: 0.0,
            ..RetryConfig::default()
        });
        for _ in 0..100 {
            budget.deposit();
        }
        assert!(!budget.try_withdraw());
    }

    #[test]
    fn backoff_doubles_within_jitter_and_caps() {
        let backoff = Backoff {
            base: Duration::from_millis(10),
            max: Duration::from_millis(100),
            jitter: Jitter::Equal,
        };
        for _ in 0..200 {
            let first = backoff.delay(1);
            assert!(first >= Duration::from_millis(5) && first <= Duration::from_millis(10));
            let second = backoff.delay(2);
            assert!(second >= Duration::from_millis(10) && second <= Duration::from_millis(20));
            let late = backoff.delay(30);
            assert!(late >= Duration::from_millis(50) && late <= Duration::from_millis(100));
        }
    }

    #[test]
    fn full_jitter_spreads_from_zero_to_the_doubling_cap() {
        let backoff = Backoff {
            base: Duration::from_millis(200),
            max: Duration::from_secs(10),
            jitter: Jitter::Full,
        };
        assert_eq!(backoff.cap(1), Duration::from_millis(200));
        assert_eq!(backoff.cap(2), Duration::from_millis(400));
        assert_eq!(backoff.cap(6), Duration::from_millis(6_400));
        assert_eq!(backoff.cap(7), Duration::from_secs(10));
        assert_eq!(backoff.cap(u32::MAX), Duration::from_secs(10));
        let delays: Vec<Duration> = (0..200).map(|_| backoff.delay(3)).collect();
        assert!(
            delays
                .iter()
                .all(|delay| *delay <= Duration::from_millis(800))
        );
        assert!(
            delays
                .iter()
                .any(|delay| *delay < Duration::from_millis(400)),
            "full jitter reaches below half the cap"
        );
    }

    #[test]
    fn config_validation_names_the_field() {
        let too_many = RetryConfig {
            max_per_request: 3,
            ..RetryConfig::default()
        };
        assert!(too_many.validate().unwrap_err().contains("max_per_request"));
        let bad_ratio = RetryConfig {
            ratio: 1.5,
            ..RetryConfig::default()
        };
        assert!(bad_ratio.validate().unwrap_err().contains("ratio"));
        assert!(RetryConfig::default().validate().is_ok());
    }
}
