//! What a cache tier stores for one key and part, and how long it lives.

use std::time::Duration;

use rand::Rng;
use rebate_domain::Timestamp;
use serde::{Deserialize, Serialize};

/// One cached part: a value or a *not-found* marker, with its version and lifetimes.
///
/// `fresh_until` ends the window in which the entry answers without asking the source;
/// `stale_until` ends the window in which it may still be served when the source fails.
///
/// Encoded for the shared tier with [`Envelope::encode`]: JSON, timestamps as epoch milliseconds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope<T> {
    /// `None` means the source said the item does not exist (negative caching).
    pub value: Option<T>,
    /// Data version from the source; an older version must never replace a newer one.
    pub version: u64,
    #[serde(with = "epoch_millis")]
    pub fetched_at: Timestamp,
    #[serde(with = "epoch_millis")]
    pub fresh_until: Timestamp,
    #[serde(with = "epoch_millis")]
    pub stale_until: Timestamp,
    /// A version fence left by an invalidation, not data: never fresh, never served, and only a
    /// value at `version` or newer may replace it, so a rebuild that read the row before the
    /// change cannot put the old value back.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tombstone: bool,
}

/// An envelope's bookkeeping without its value: what inspection and consistency checks read, for
/// a part of any type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct EntryMeta {
    pub version: u64,
    pub fetched_at: Timestamp,
    pub fresh_until: Timestamp,
    pub stale_until: Timestamp,
    pub tombstone: bool,
    /// False for a not-found marker.
    pub found: bool,
}

impl EntryMeta {
    /// The same rule as [`Envelope::is_fresh`]: a fence is never fresh.
    pub fn is_fresh(&self, now: Timestamp) -> bool {
        !self.tombstone && now < self.fresh_until
    }
}

/// Envelope timestamps travel as integers: exact to the millisecond and cheap to parse.
mod epoch_millis {
    use rebate_domain::Timestamp;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(
        stamp: &Timestamp,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.serialize_i64(stamp.as_millis())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Timestamp, D::Error> {
        i64::deserialize(deserializer).map(Timestamp::from_millis)
    }
}

impl<T: Serialize> Envelope<T> {
    /// The bytes stored in the shared tier.
    pub fn encode(&self) -> Result<Vec<u8>, serde_json::Error> {
        serde_json::to_vec(self)
    }
}

impl<T: serde::de::DeserializeOwned> Envelope<T> {
    pub fn decode(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}

impl<T> Envelope<T> {
    /// A fence at `version` that lives until `until`.
    pub fn tombstone(version: u64, now: Timestamp, until: Timestamp) -> Self {
        Self {
            value: None,
            version,
            fetched_at: now,
            fresh_until: now,
            stale_until: until,
            tombstone: true,
        }
    }

    /// A copy of a fence (which holds no value, so any `T` will do).
    pub fn clone_fence(&self) -> Self {
        debug_assert!(self.tombstone && self.value.is_none());
        Self {
            value: None,
            version: self.version,
            fetched_at: self.fetched_at,
            fresh_until: self.fresh_until,
            stale_until: self.stale_until,
            tombstone: self.tombstone,
        }
    }

    pub fn is_fresh(&self, now: Timestamp) -> bool {
        !self.tombstone && now < self.fresh_until
    }

    /// The bookkeeping without the value.
    pub fn meta(&self) -> EntryMeta {
        EntryMeta {
            version: self.version,
            fetched_at: self.fetched_at,
            fresh_until: self.fresh_until,
            stale_until: self.stale_until,
            tombstone: self.tombstone,
            found: self.value.is_some(),
        }
    }

    /// Still inside the stale window: may answer when the source cannot.
    pub fn is_servable(&self, now: Timestamp) -> bool {
        !self.tombstone && now < self.stale_until
    }

    pub fn is_not_found(&self) -> bool {
        self.value.is_none()
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PolicyError {
    #[error("fresh TTL must be greater than zero")]
    ZeroFresh,
    #[error("jitter ratio {0} must be within 0.0 and 0.5")]
    JitterOutOfRange(f64),
    #[error("additive jitter {0:?} must not exceed the fresh TTL")]
    JitterTooLong(Duration),
    #[error("not-found TTL must be greater than zero")]
    ZeroNotFound,
}

/// How a TTL is spread so that entries written together do not expire together.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Jitter {
    /// Uniform in `base × [1 − ratio, 1 + ratio]` (L1: 5 min ± 10 %).
    Ratio(f64),
    /// Uniform in `[base, base + up_to]` (L2: 15 min + 0–300 s).
    UpTo(Duration),
}

/// Lifetimes of one part's entries in one tier, with jitter so that mass expiry never lines up.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TtlPolicy {
    /// Base time an entry is fresh.
    pub fresh: Duration,
    /// Applied to every fresh and not-found TTL drawn.
    pub jitter: Jitter,
    /// How long past `fresh_until` an entry stays servable as stale.
    pub stale: Duration,
    /// Mean time a not-found marker is kept. Short: a new item must appear soon.
    pub not_found: Duration,
}

impl TtlPolicy {
    pub fn validate(&self) -> Result<(), PolicyError> {
        if self.fresh.is_zero() {
            return Err(PolicyError::ZeroFresh);
        }
        if self.not_found.is_zero() {
            return Err(PolicyError::ZeroNotFound);
        }
        match self.jitter {
            Jitter::Ratio(ratio) if !(0.0..=0.5).contains(&ratio) => {
                Err(PolicyError::JitterOutOfRange(ratio))
            }
            Jitter::UpTo(up_to) if up_to > self.fresh => Err(PolicyError::JitterTooLong(up_to)),
            _ => Ok(()),
        }
    }

    /// A jittered fresh TTL for a found value.
    pub fn sample_fresh<R: Rng + ?Sized>(&self, rng: &mut R) -> Duration {
        jitter(self.fresh, self.jitter, rng)
    }

    /// A jittered TTL for a not-found marker. The spread is proportional to the not-found TTL
    /// in both kinds of jitter: an additive `up_to` is scaled by `not_found / fresh`, so a
    /// marker never lives longer than `not_found × (1 + up_to / fresh)` (at most twice
    /// `not_found`, as `up_to ≤ fresh`), rather than taking the fresh TTL's minutes of spread.
    pub fn sample_not_found<R: Rng + ?Sized>(&self, rng: &mut R) -> Duration {
        let spread = match self.jitter {
            Jitter::Ratio(ratio) => Jitter::Ratio(ratio),
            Jitter::UpTo(up_to) => Jitter::UpTo(
                up_to.mul_f64(self.not_found.as_secs_f64() / self.fresh.as_secs_f64().max(1e-9)),
            ),
        };
        jitter(self.not_found, spread, rng)
    }

    /// Stamps a loaded value: fetched now, fresh for a jittered TTL, stale window after that.
    /// Not-found markers get no stale window: serving "does not exist" past its TTL helps nobody.
    pub fn envelope<T, R: Rng + ?Sized>(
        &self,
        value: Option<T>,
        version: u64,
        now: Timestamp,
        rng: &mut R,
    ) -> Envelope<T> {
        let (fresh_for, stale_for) = match value {
            Some(_) => (self.sample_fresh(rng), self.stale),
            None => (self.sample_not_found(rng), Duration::ZERO),
        };
        let fresh_until = now.saturating_add_millis(millis(fresh_for));
        let stale_until = fresh_until.saturating_add_millis(millis(stale_for));
        Envelope {
            value,
            version,
            fetched_at: now,
            fresh_until,
            stale_until,
            tombstone: false,
        }
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn jitter<R: Rng + ?Sized>(base: Duration, jitter: Jitter, rng: &mut R) -> Duration {
    match jitter {
        Jitter::Ratio(ratio) if ratio > 0.0 => {
            base.mul_f64(rng.random_range((1.0 - ratio)..=(1.0 + ratio)))
        }
        Jitter::UpTo(up_to) if !up_to.is_zero() => {
            base + Duration::from_millis(rng.random_range(0..=millis(up_to)))
        }
        _ => base,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    fn policy() -> TtlPolicy {
        TtlPolicy {
            fresh: Duration::from_secs(300),
            jitter: Jitter::Ratio(0.1),
            stale: Duration::from_secs(1800),
            not_found: Duration::from_secs(120),
        }
    }

    /// A large sample covers the whole ±10 % band evenly: no bucket empty or crowded, nothing
    /// outside the band. This is what keeps entries written together from expiring together.
    #[test]
    fn fresh_ttls_spread_across_the_configured_range() {
        let policy = policy();
        let mut rng = SmallRng::seed_from_u64(7);
        let low = 270.0;
        let high = 330.0;
        let buckets = 10;
        let mut counts = vec![0usize; buckets];
        let samples = 20_000;
        let mut min = f64::MAX;
        let mut max = f64::MIN;
        for _ in 0..samples {
            let ttl = policy.sample_fresh(&mut rng).as_secs_f64();
            assert!((low..=high).contains(&ttl), "{ttl} outside [{low}, {high}]");
            min = min.min(ttl);
            max = max.max(ttl);
            let bucket = (((ttl - low) / (high - low)) * buckets as f64) as usize;
            counts[bucket.min(buckets - 1)] += 1;
        }
        // Reaches both ends of the band.
        assert!(min < low + 1.0 && max > high - 1.0, "min {min} max {max}");
        // Each tenth of the band holds 10 % ± 2 % of the samples.
        for count in counts {
            let share = count as f64 / samples as f64;
            assert!((0.08..=0.12).contains(&share), "bucket share {share}");
        }
    }

    /// L2: 15 min + uniform 0–300 s, the whole range used, nothing outside it.
    #[test]
    fn additive_jitter_spreads_over_base_plus_up_to() {
        let policy = TtlPolicy {
            fresh: Duration::from_secs(900),
            jitter: Jitter::UpTo(Duration::from_secs(300)),
            stale: Duration::from_secs(1800),
            not_found: Duration::from_secs(120),
        };
        let mut rng = SmallRng::seed_from_u64(11);
        let mut buckets = [0usize; 10];
        for _ in 0..20_000 {
            let ttl = policy.sample_fresh(&mut rng).as_secs_f64();
            assert!((900.0..=1200.0).contains(&ttl), "{ttl}");
            buckets[(((ttl - 900.0) / 30.0) as usize).min(9)] += 1;
        }
        for count in buckets {
            assert!((1_600..=2_400).contains(&count), "{buckets:?}");
        }
    }

    #[test]
    fn an_additive_jitter_spreads_not_found_markers_in_proportion() {
        let policy = TtlPolicy {
            fresh: Duration::from_secs(900),
            jitter: Jitter::UpTo(Duration::from_secs(300)),
            stale: Duration::from_secs(3_600),
            not_found: Duration::from_secs(120),
        };
        let mut rng = SmallRng::seed_from_u64(7);
        let samples: Vec<Duration> = (0..2_000)
            .map(|_| policy.sample_not_found(&mut rng))
            .collect();
        // 120 s + up to 300 × 120 / 900 = 40 s, never the fresh TTL's 300 s.
        assert!(
            samples
                .iter()
                .all(|ttl| (120.0..=160.0).contains(&ttl.as_secs_f64()))
        );
        assert!(samples.iter().any(|ttl| ttl.as_secs_f64() > 150.0));
        assert!(samples.iter().any(|ttl| ttl.as_secs_f64() < 130.0));
    }

    #[test]
    fn not_found_markers_are_short_and_have_no_stale_window() {
        let policy = policy();
        let mut rng = SmallRng::seed_from_u64(1);
        let now = Timestamp::from_millis(1_000_000);
        let envelope = policy.envelope::<u8, _>(None, 0, now, &mut rng);
        assert!(envelope.is_not_found());
        let ttl = envelope.fresh_until.millis_since(now);
        assert!((108_000..=132_000).contains(&ttl), "{ttl}");
        assert_eq!(envelope.stale_until, envelope.fresh_until);
    }

    #[test]
    fn found_values_get_a_stale_window() {
        let policy = policy();
        let mut rng = SmallRng::seed_from_u64(2);
        let now = Timestamp::from_millis(0);
        let envelope = policy.envelope(Some(5u8), 3, now, &mut rng);
        assert_eq!(envelope.version, 3);
        assert_eq!(envelope.fetched_at, now);
        assert_eq!(
            envelope.stale_until.millis_since(envelope.fresh_until),
            1_800_000
        );
        assert!(envelope.is_fresh(now));
        assert!(!envelope.is_fresh(envelope.fresh_until));
        assert!(envelope.is_servable(envelope.fresh_until));
        assert!(!envelope.is_servable(envelope.stale_until));
    }

    #[test]
    fn envelopes_round_trip_through_bytes_exactly() {
        let envelope = Envelope {
            value: Some(vec!["a".to_owned()]),
            version: 7,
            fetched_at: Timestamp::from_millis(1_764_504_000_123),
            fresh_until: Timestamp::from_millis(1_764_504_300_456),
            stale_until: Timestamp::from_millis(1_764_506_100_789),
            tombstone: false,
        };
        let bytes = envelope.encode().unwrap();
        assert_eq!(Envelope::<Vec<String>>::decode(&bytes).unwrap(), envelope);
        let missing = Envelope::<u8> {
            value: None,
            version: 0,
            fetched_at: envelope.fetched_at,
            fresh_until: envelope.fresh_until,
            stale_until: envelope.fresh_until,
            tombstone: false,
        };
        let bytes = missing.encode().unwrap();
        assert_eq!(Envelope::<u8>::decode(&bytes).unwrap(), missing);
        // A tombstone keeps its flag; data envelopes do not carry the field at all.
        assert!(!String::from_utf8(bytes).unwrap().contains("tombstone"));
        let fence = Envelope::<u8>::tombstone(9, envelope.fetched_at, envelope.stale_until);
        let decoded = Envelope::<u8>::decode(&fence.encode().unwrap()).unwrap();
        assert!(decoded.tombstone);
        assert!(
            !decoded.is_fresh(envelope.fetched_at) && !decoded.is_servable(envelope.fetched_at)
        );
        assert!(Envelope::<u8>::decode(b"garbage").is_err());
    }

    #[test]
    fn validation_explains_bad_policies() {
        let mut bad = policy();
        bad.jitter = Jitter::Ratio(0.9);
        assert_eq!(bad.validate(), Err(PolicyError::JitterOutOfRange(0.9)));
        bad = policy();
        bad.fresh = Duration::ZERO;
        assert_eq!(bad.validate(), Err(PolicyError::ZeroFresh));
        assert_eq!(policy().validate(), Ok(()));
    }
}
