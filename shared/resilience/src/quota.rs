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
//!
//! The rate can change while calls go on: a bucket reads it from a [`LiveRate`] (one relaxed
//! load per value), which a [`KeyedLimiter`]'s buckets share, and every bucket keeps the tokens
//! it holds (its TAT is rescaled to the new rate).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;

use crate::keyed::KeyedSlots;
use crate::live::{load_f64, lock, store_f64};
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

/// A rate that can change under running callers: the buckets that follow it read it on every
/// call, one relaxed load per value. A call racing [`LiveRate::set`] may be judged by the old
/// interval and the new burst (or the reverse); the next call sees the new rate whole.
#[derive(Debug)]
pub struct LiveRate {
    /// Held by whoever changes the rate, so that concurrent changes cannot interleave; calls
    /// never take it.
    writer: Mutex<()>,
    per_second_bits: AtomicU64,
    burst: AtomicU32,
    /// What calls read: [`Emission`]'s two values.
    interval_nanos: AtomicU64,
    tolerance_nanos: AtomicU64,
}

impl LiveRate {
    /// `rate` must have passed [`RateConfig::validate`]; out-of-range values are clamped rather
    /// than trusted.
    pub fn new(rate: RateConfig) -> Self {
        let emission = Emission::of(rate);
        Self {
            writer: Mutex::new(()),
            per_second_bits: AtomicU64::new(rate.per_second.to_bits()),
            burst: AtomicU32::new(rate.burst),
            interval_nanos: AtomicU64::new(emission.interval),
            tolerance_nanos: AtomicU64::new(emission.tolerance),
        }
    }

    /// The rate in force.
    pub fn get(&self) -> RateConfig {
        RateConfig {
            per_second: load_f64(&self.per_second_bits),
            burst: self.burst.load(Ordering::Relaxed),
        }
    }

    /// Makes `rate` the one in force from the next call on. State kept elsewhere is not
    /// touched (a fleet's bucket in Redis); the buckets here rescale theirs, see
    /// [`TokenBucket::set_rate_at`] and [`KeyedLimiter::set_rate`].
    pub fn set(&self, rate: RateConfig) {
        let _writer = lock(&self.writer);
        self.store(rate);
    }

    /// Stores `rate`; the caller holds `writer`.
    fn store(&self, rate: RateConfig) {
        let emission = Emission::of(rate);
        store_f64(&self.per_second_bits, rate.per_second);
        self.burst.store(rate.burst, Ordering::Relaxed);
        self.interval_nanos
            .store(emission.interval, Ordering::Relaxed);
        self.tolerance_nanos
            .store(emission.tolerance, Ordering::Relaxed);
    }

    fn emission(&self) -> Emission {
        Emission {
            interval: self.interval_nanos.load(Ordering::Relaxed),
            tolerance: self.tolerance_nanos.load(Ordering::Relaxed),
        }
    }
}

/// A rate as GCRA uses it, in nanoseconds.
#[derive(Debug, Clone, Copy)]
struct Emission {
    /// Between two calls at the sustained rate.
    interval: u64,
    /// How far ahead of now the TAT may run: `interval × burst`.
    tolerance: u64,
}

impl Emission {
    fn of(rate: RateConfig) -> Self {
        let interval = rate.interval_nanos();
        Self {
            interval,
            tolerance: interval.saturating_mul(u64::from(rate.burst.max(1))),
        }
    }
}

/// One bucket's state: the theoretical arrival time of the next call, in ticker nanoseconds
/// (0, the default, is a full bucket).
#[derive(Debug, Default)]
struct Tat(AtomicU64);

impl Tat {
    /// Takes one token at `now_nanos`, or says when one will be there.
    fn take(&self, emission: Emission, now_nanos: u64) -> Result<(), QuotaExceeded> {
        let mut tat = self.0.load(Ordering::Relaxed);
        loop {
            let (next, ahead) = next_after(tat, emission, now_nanos);
            if ahead > emission.tolerance {
                return Err(QuotaExceeded {
                    retry_after: Duration::from_nanos(ahead - emission.tolerance),
                });
            }
            match self
                .0
                .compare_exchange_weak(tat, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return Ok(()),
                Err(actual) => tat = actual,
            }
        }
    }

    /// How long from `now_nanos` until [`Tat::take`] would grant a token (zero when it would
    /// now), without taking it.
    fn wait(&self, emission: Emission, now_nanos: u64) -> u64 {
        let (_, ahead) = next_after(self.0.load(Ordering::Relaxed), emission, now_nanos);
        ahead.saturating_sub(emission.tolerance)
    }

    /// Moves the bucket from `old` to `new` at `now_nanos`, keeping the tokens it holds then
    /// (at most the new burst), so that from then on it refills at the new rate. A call racing
    /// the move is judged by the old rate or the new one.
    fn rescale(&self, old: Emission, new: Emission, now_nanos: u64) {
        let _ = self
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |tat| {
                Some(rescaled(tat, old, new, now_nanos))
            });
    }
}

/// The theoretical arrival time after one more call at `now_nanos` given `tat`, and how far it
/// is ahead of now.
fn next_after(tat: u64, emission: Emission, now_nanos: u64) -> (u64, u64) {
    let next = tat.max(now_nanos).saturating_add(emission.interval);
    (next, next - now_nanos)
}

/// The TAT with which a bucket at `tat` under `old` holds, under `new`, the tokens it held at
/// `now_nanos` (at most the new burst).
fn rescaled(tat: u64, old: Emission, new: Emission, now_nanos: u64) -> u64 {
    // The tolerance not yet spent is the tokens held, in nanoseconds of the old interval.
    let spent = tat.saturating_sub(now_nanos).min(old.tolerance);
    let held =
        u128::from(old.tolerance - spent) * u128::from(new.interval) / u128::from(old.interval);
    let held = u64::try_from(held).map_or(new.tolerance, |held| held.min(new.tolerance));
    now_nanos.saturating_add(new.tolerance - held)
}

/// A lock-free token bucket.
#[derive(Debug)]
pub struct TokenBucket {
    rate: LiveRate,
    tat: Tat,
    granted: AtomicU64,
    rejected: AtomicU64,
}

impl TokenBucket {
    /// A full bucket. `rate` must have passed [`RateConfig::validate`]; out-of-range values are
    /// clamped rather than trusted.
    pub fn new(rate: RateConfig) -> Self {
        Self {
            rate: LiveRate::new(rate),
            tat: Tat::default(),
            granted: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
        }
    }

    /// The rate in force.
    pub fn rate(&self) -> RateConfig {
        self.rate.get()
    }

    /// Makes `rate` the bucket's rate at `now_nanos`, in place: the tokens it holds then are
    /// kept (capped at the new burst), and it refills at the new rate from then on. (GCRA
    /// keeps a time, not a count: what it holds depends on `now_nanos`, which the bucket takes
    /// from its caller, as every other call.) A call racing the change is judged by the old
    /// rate or the new one.
    pub fn set_rate_at(&self, rate: RateConfig, now_nanos: u64) {
        let _writer = lock(&self.rate.writer);
        let old = self.rate.emission();
        self.rate.store(rate);
        self.tat.rescale(old, self.rate.emission(), now_nanos);
    }

    /// Takes one token at `now_nanos`, or says when one will be there.
    pub fn try_acquire_at(&self, now_nanos: u64) -> Result<(), QuotaExceeded> {
        let verdict = self.tat.take(self.rate.emission(), now_nanos);
        match verdict {
            Ok(()) => self.granted.fetch_add(1, Ordering::Relaxed),
            Err(_) => self.rejected.fetch_add(1, Ordering::Relaxed),
        };
        verdict
    }

    /// Whether [`TokenBucket::try_acquire_at`] would grant a token at `now_nanos`, without
    /// taking it (advisory: another caller may take it first).
    pub fn has_token_at(&self, now_nanos: u64) -> bool {
        self.tat.wait(self.rate.emission(), now_nanos) == 0
    }

    /// How long from `now_nanos` until [`TokenBucket::try_acquire_at`] would grant a token
    /// (zero when it would now), without taking it.
    pub fn wait_at(&self, now_nanos: u64) -> Duration {
        Duration::from_nanos(self.tat.wait(self.rate.emission(), now_nanos))
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
/// memory stays bounded whatever clients send. Every key's bucket follows the one rate in force.
#[derive(Debug)]
pub struct KeyedLimiter {
    rate: LiveRate,
    buckets: KeyedSlots<Tat>,
    ticker: Arc<dyn Ticker>,
    rejected: AtomicU64,
}

impl KeyedLimiter {
    pub fn new(rate: RateConfig, max_keys: u64, idle: Duration, ticker: Arc<dyn Ticker>) -> Self {
        Self {
            rate: LiveRate::new(rate),
            buckets: KeyedSlots::new(max_keys, idle),
            ticker,
            rejected: AtomicU64::new(0),
        }
    }

    /// The rate in force.
    pub fn rate(&self) -> RateConfig {
        self.rate.get()
    }

    /// Makes `rate` every key's rate, in place: each key's bucket keeps the tokens it holds
    /// now (at most the new burst) and refills at the new rate from now on, as with
    /// [`TokenBucket::set_rate_at`]. Visits the keys tracked (a shard's read lock at a time, as
    /// a lookup takes); a key's call racing the change is judged by the old rate or the new one.
    pub fn set_rate(&self, rate: RateConfig) {
        let _writer = lock(&self.rate.writer);
        let old = self.rate.emission();
        self.rate.store(rate);
        let new = self.rate.emission();
        let now = self.ticker.now_nanos();
        self.buckets
            .for_each(|bucket| bucket.rescale(old, new, now));
    }

    /// Forgets keys after `idle` unused (see [`KeyedSlots::set_idle`]).
    pub fn set_idle(&self, idle: Duration) {
        self.buckets.set_idle(idle);
    }

    /// Takes one token from `key`'s bucket.
    pub fn try_acquire(&self, key: &str) -> Result<(), QuotaExceeded> {
        let now = self.ticker.now_nanos();
        let bucket = self.buckets.get_or_insert_with(key, now, Tat::default);
        let verdict = bucket.take(self.rate.emission(), now);
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
            .is_none_or(|bucket| bucket.wait(self.rate.emission(), self.ticker.now_nanos()) == 0)
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

    fn drain(bucket: &TokenBucket, now: u64) -> usize {
        (0..1_000)
            .take_while(|_| bucket.try_acquire_at(now).is_ok())
            .count()
    }

    #[test]
    fn a_new_rate_keeps_the_tokens_held_up_to_its_burst_and_refills_at_its_pace() {
        let rate = |per_second, burst| RateConfig { per_second, burst };
        let now = 10 * SECOND;
        let bucket = TokenBucket::new(rate(10.0, 10));
        for _ in 0..4 {
            bucket.try_acquire_at(now).unwrap();
        }
        bucket.set_rate_at(rate(100.0, 20), now);
        assert_eq!(bucket.rate(), rate(100.0, 20));
        assert_eq!(drain(&bucket, now), 6, "the six it held");
        assert_eq!(
            bucket.wait_at(now),
            Duration::from_millis(10),
            "the next one at the new rate"
        );
        assert_eq!(
            drain(&bucket, now + SECOND),
            20,
            "refilled to the new burst"
        );

        let bucket = TokenBucket::new(rate(10.0, 10));
        bucket.set_rate_at(rate(10.0, 3), now);
        assert_eq!(
            drain(&bucket, now),
            3,
            "a full bucket capped at the new burst"
        );

        let bucket = TokenBucket::new(rate(10.0, 10));
        for _ in 0..7 {
            bucket.try_acquire_at(now).unwrap();
        }
        bucket.set_rate_at(rate(10.0, 10), now);
        assert_eq!(drain(&bucket, now), 3, "the same rate changes nothing");
        bucket.set_rate_at(rate(1.0, 5), now);
        assert_eq!(bucket.wait_at(now), Duration::from_secs(1));
        assert_eq!(
            drain(&bucket, now + 2 * SECOND),
            2,
            "one a second from the change"
        );
    }

    #[test]
    fn every_keys_bucket_follows_a_new_rate() {
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
        assert!(limiter.try_acquire("h5-7").is_ok());
        let faster = RateConfig {
            per_second: 4.0,
            burst: 8,
        };
        limiter.set_rate(faster);
        assert_eq!(limiter.rate(), faster);
        // app-1 held no token and still holds none; the next comes at the new pace.
        let refused = limiter.try_acquire("app-1").unwrap_err();
        assert_eq!(refused.retry_after, Duration::from_millis(250));
        let kept = (0..10)
            .filter(|_| limiter.try_acquire("h5-7").is_ok())
            .count();
        assert_eq!(kept, 1, "h5-7 held one token");
        let fresh = (0..10)
            .filter(|_| limiter.try_acquire("jd-9").is_ok())
            .count();
        assert_eq!(fresh, 8, "a new key starts full at the new burst");
        ticker.advance(Duration::from_millis(250));
        assert!(limiter.has_token("app-1"));
        assert!(limiter.try_acquire("app-1").is_ok());
        assert!(!limiter.has_token("app-1"));
        assert_eq!(limiter.stats(), (3, 12));
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
