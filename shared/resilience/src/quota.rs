//! Token buckets as GCRA (generic cell rate algorithm): one `u64` of state, one CAS per call.
//!
//! [`TokenBucket`] guards an outbound contract (45/s for a 50/s API): when it is empty the caller
//! degrades at once instead of queueing. [`KeyedLimiter`] holds one bucket per client at the edge.
//!
//! GCRA keeps the "theoretical arrival time" (TAT) of the next conforming call instead of a token
//! count: a call conforms when admitting it keeps the TAT within `burst` emission intervals of
//! now. It needs no refill timer and its state fits one atomic. (The `governor` crate does the
//! same; it is not used because its clock cannot be the injected [`Ticker`] without an adapter
//! the size of this file.)

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;

use crate::keyed::KeyedSlots;
use crate::ticker::Ticker;

/// A sustained rate and the burst allowed above it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RateConfig {
    pub per_second: f64,
    /// Calls that may be made at once after a quiet spell (at least 1).
    pub burst: u32,
}

impl RateConfig {
    pub fn validate(&self) -> Result<(), String> {
        if !(self.per_second.is_finite() && self.per_second > 0.0 && self.per_second <= 1e9) {
            return Err(format!(
                "per_second must be a number in (0, 1e9], got {}",
                self.per_second
            ));
        }
        if self.burst == 0 {
            return Err("burst must be at least 1".to_owned());
        }
        Ok(())
    }

    fn interval_nanos(&self) -> u64 {
        // At least 1 ns, so a huge rate never divides into zero.
        ((1e9 / self.per_second) as u64).max(1)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("rate limit reached; retry after {retry_after:?}")]
pub struct QuotaExceeded {
    /// When the next call would conform.
    pub retry_after: Duration,
}

/// A lock-free token bucket.
#[derive(Debug)]
pub struct TokenBucket {
    interval: u64,
    tolerance: u64,
    /// Theoretical arrival time of the next call, in ticker nanoseconds.
    tat: AtomicU64,
    granted: AtomicU64,
    rejected: AtomicU64,
}

impl TokenBucket {
    /// A full bucket. `rate` must have passed [`RateConfig::validate`]; out-of-range values are
    /// clamped rather than trusted.
    pub fn new(rate: RateConfig) -> Self {
        let interval = rate.interval_nanos();
        Self {
            interval,
            tolerance: interval.saturating_mul(u64::from(rate.burst.max(1))),
            tat: AtomicU64::new(0),
            granted: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
        }
    }

    /// Takes one token at `now_nanos`, or says when one will be there.
    pub fn try_acquire_at(&self, now_nanos: u64) -> Result<(), QuotaExceeded> {
        let mut tat = self.tat.load(Ordering::Relaxed);
        loop {
            let (next, ahead) = self.next_after(tat, now_nanos);
            if ahead > self.tolerance {
                self.rejected.fetch_add(1, Ordering::Relaxed);
                return Err(QuotaExceeded {
                    retry_after: Duration::from_nanos(ahead - self.tolerance),
                });
            }
            match self
                .tat
                .compare_exchange_weak(tat, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    self.granted.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                Err(actual) => tat = actual,
            }
        }
    }

    /// Whether [`TokenBucket::try_acquire_at`] would grant a token at `now_nanos`, without
    /// taking it (advisory: another caller may take it first).
    pub fn has_token_at(&self, now_nanos: u64) -> bool {
        let (_, ahead) = self.next_after(self.tat.load(Ordering::Relaxed), now_nanos);
        ahead <= self.tolerance
    }

    /// How long from `now_nanos` until [`TokenBucket::try_acquire_at`] would grant a token
    /// (zero when it would now), without taking it.
    pub fn wait_at(&self, now_nanos: u64) -> Duration {
        let (_, ahead) = self.next_after(self.tat.load(Ordering::Relaxed), now_nanos);
        Duration::from_nanos(ahead.saturating_sub(self.tolerance))
    }

    /// The theoretical arrival time after one more call at `now_nanos` given `tat`, and how far
    /// it is ahead of now.
    fn next_after(&self, tat: u64, now_nanos: u64) -> (u64, u64) {
        let next = tat.max(now_nanos).saturating_add(self.interval);
        (next, next - now_nanos)
    }

    /// Calls granted and refused since start.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.granted.load(Ordering::Relaxed),
            self.rejected.load(Ordering::Relaxed),
        )
    }
}

/// One token bucket per key (client id or peer address), created on first sight and forgotten
/// after `idle` without calls (see [`KeyedSlots`]). At most `max_keys` are tracked; when more
/// clients are active than that, some lose their state (and start again with a full bucket), so
/// memory stays bounded whatever clients send.
#[derive(Debug)]
pub struct KeyedLimiter {
    rate: RateConfig,
    buckets: KeyedSlots<TokenBucket>,
    ticker: Arc<dyn Ticker>,
    rejected: AtomicU64,
}

impl KeyedLimiter {
    pub fn new(rate: RateConfig, max_keys: u64, idle: Duration, ticker: Arc<dyn Ticker>) -> Self {
        Self {
            rate,
            buckets: KeyedSlots::new(max_keys, idle),
            ticker,
            rejected: AtomicU64::new(0),
        }
    }

    pub fn rate(&self) -> RateConfig {
        self.rate
    }

    /// Takes one token from `key`'s bucket.
    pub fn try_acquire(&self, key: &str) -> Result<(), QuotaExceeded> {
        let now = self.ticker.now_nanos();
        let bucket = self
            .buckets
            .get_or_insert_with(key, now, || TokenBucket::new(self.rate));
        let verdict = bucket.try_acquire_at(now);
        if verdict.is_err() {
            self.rejected.fetch_add(1, Ordering::Relaxed);
        }
        verdict
    }

    /// Whether [`KeyedLimiter::try_acquire`] would grant `key` a token now, without taking it
    /// or tracking the key (advisory: a key not tracked has a full bucket).
    pub fn has_token(&self, key: &str) -> bool {
        self.buckets
            .peek(key)
            .is_none_or(|bucket| bucket.has_token_at(self.ticker.now_nanos()))
    }

    /// Keys currently tracked and calls refused since start.
    pub fn stats(&self) -> (u64, u64) {
        (
            self.buckets.len() as u64,
            self.rejected.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ticker::ManualTicker;

    const SECOND: u64 = 1_000_000_000;

    #[test]
    fn a_full_bucket_allows_the_burst_then_the_rate() {
        let bucket = TokenBucket::new(RateConfig {
            per_second: 45.0,
            burst: 5,
        });
        let now = 10 * SECOND;
        for _ in 0..5 {
            bucket.try_acquire_at(now).unwrap();
        }
        let refused = bucket.try_acquire_at(now).unwrap_err();
        // The next token arrives one emission interval (1/45 s) later.
        assert_eq!(refused.retry_after, Duration::from_nanos(SECOND / 45));
        assert!(!bucket.has_token_at(now));
        assert_eq!(bucket.wait_at(now), Duration::from_nanos(SECOND / 45));
        assert!(
            bucket.has_token_at(now + SECOND / 45),
            "looking takes nothing"
        );
        assert_eq!(bucket.wait_at(now + SECOND / 45), Duration::ZERO);
        assert!(bucket.has_token_at(now + SECOND / 45));
        bucket.try_acquire_at(now + SECOND / 45).unwrap();
        assert!(!bucket.has_token_at(now + SECOND / 45));
        assert!(bucket.try_acquire_at(now + SECOND / 45).is_err());
        assert_eq!(bucket.counts(), (6, 2));
    }

    #[test]
    fn over_a_long_run_the_rate_holds() {
        let bucket = TokenBucket::new(RateConfig {
            per_second: 45.0,
            burst: 10,
        });
        // 200 attempts per second for 10 s: 45/s pass, plus the initial burst.
        let mut granted = 0;
        for step in 0..2_000u64 {
            if bucket.try_acquire_at(SECOND + step * SECOND / 200).is_ok() {
                granted += 1;
            }
        }
        assert!((450..=461).contains(&granted), "granted {granted}");
    }

    #[test]
    fn a_quiet_spell_refills_only_up_to_the_burst() {
        let bucket = TokenBucket::new(RateConfig {
            per_second: 10.0,
            burst: 3,
        });
        let later = 3_600 * SECOND;
        let granted = (0..10)
            .filter(|_| bucket.try_acquire_at(later).is_ok())
            .count();
        assert_eq!(granted, 3);
    }

    #[test]
    fn racing_threads_never_take_more_than_the_burst() {
        let bucket = Arc::new(TokenBucket::new(RateConfig {
            per_second: 1.0,
            burst: 100,
        }));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let bucket = bucket.clone();
                std::thread::spawn(move || {
                    (0..1_000)
                        .filter(|_| bucket.try_acquire_at(5 * SECOND).is_ok())
                        .count()
                })
            })
            .collect();
        let granted: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(granted, 100);
    }

    #[test]
    fn keys_have_buckets_of_their_own() {
        let ticker = ManualTicker::new();
        let limiter = KeyedLimiter::new(
            RateConfig {
                per_second: 2.0,
                burst: 2,
            },
            1_000,
            Duration::from_secs(60),
            Arc::new(ticker.clone()),
        );
        assert!(limiter.try_acquire("app-1").is_ok());
        assert!(limiter.try_acquire("app-1").is_ok());
        let refused = limiter.try_acquire("app-1").unwrap_err();
        assert_eq!(refused.retry_after, Duration::from_millis(500));
        assert!(limiter.try_acquire("h5-7").is_ok());
        ticker.advance(Duration::from_millis(500));
        assert!(limiter.try_acquire("app-1").is_ok());
        assert_eq!(limiter.stats().1, 1);
    }

    #[test]
    fn looking_at_a_key_takes_nothing_and_tracks_nothing() {
        let ticker = ManualTicker::new();
        let limiter = KeyedLimiter::new(
            RateConfig {
                per_second: 1.0,
                burst: 1,
            },
            1_000,
            Duration::from_secs(60),
            Arc::new(ticker.clone()),
        );
        assert!(limiter.has_token("jd:100001"));
        assert_eq!(limiter.stats(), (0, 0), "an unseen key is not tracked");
        assert!(limiter.try_acquire("jd:100001").is_ok());
        assert!(!limiter.has_token("jd:100001"));
        assert!(limiter.has_token("jd:100002"));
        ticker.advance(Duration::from_secs(1));
        assert!(limiter.has_token("jd:100001"));
        assert!(
            limiter.try_acquire("jd:100001").is_ok(),
            "looking took nothing"
        );
        assert_eq!(limiter.stats(), (1, 0));
    }

    #[test]
    fn bad_rates_are_refused_with_the_field_named() {
        let bad = RateConfig {
            per_second: 0.0,
            burst: 1,
        };
        assert!(bad.validate().unwrap_err().contains("per_second"));
        let bad = RateConfig {
            per_second: f64::NAN,
            burst: 1,
        };
        assert!(bad.validate().is_err());
        let bad = RateConfig {
            per_second: 5.0,
            burst: 0,
        };
        assert!(bad.validate().unwrap_err().contains("burst"));
    }
}
