//! Reconnect delays: exponential with full jitter.

use std::time::Duration;

/// Exponential backoff capped at `max`, with "full jitter" (uniform in `[0, cap]`) so that a
/// fleet of instances does not reconnect in lockstep after a broker restart.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Backoff {
    min: Duration,
    max: Duration,
}

impl Backoff {
    pub(crate) fn new(min: Duration, max: Duration) -> Self {
        debug_assert!(min <= max, "backoff min above max");
        Self { min, max }
    }

    /// Upper bound of the delay after `failures` consecutive failures.
    pub(crate) fn cap(&self, failures: u32) -> Duration {
        let factor = 2u32.saturating_pow(failures.min(20));
        self.min.saturating_mul(factor).min(self.max)
    }

    /// A random delay in `[0, cap(failures)]`.
    pub(crate) fn delay(&self, failures: u32) -> Duration {
        let cap_ms = u64::try_from(self.cap(failures).as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(rand::random_range(0..=cap_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_doubles_then_saturates_at_max() {
        let backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
        assert_eq!(backoff.cap(0), Duration::from_millis(200));
        assert_eq!(backoff.cap(1), Duration::from_millis(400));
        assert_eq!(backoff.cap(5), Duration::from_millis(6_400));
        assert_eq!(backoff.cap(6), Duration::from_secs(10));
        assert_eq!(backoff.cap(u32::MAX), Duration::from_secs(10));
    }

    #[test]
    fn delay_stays_within_the_cap() {
        let backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
        for failures in 0..30 {
            assert!(backoff.delay(failures) <= backoff.cap(failures));
        }
    }
}
