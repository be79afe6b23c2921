//! Wall-clock timestamps in milliseconds since the Unix epoch.
//!
//! Cache envelopes travel between instances (through Redis), so freshness is judged on wall-clock
//! time, not on a process-local monotonic clock. Where "now" comes from is up to the caller (the
//! cache crate injects a clock so tests never sleep).

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use chrono::{DateTime, Datelike, SecondsFormat, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(i64);

impl Timestamp {
    pub const fn from_millis(millis: i64) -> Self {
        Self(millis)
    }

    pub const fn as_millis(self) -> i64 {
        self.0
    }

    /// The wall clock's time. Read straight from `SystemTime` (a clock before 1970 reads as
    /// negative milliseconds): `chrono`'s `Utc::now` builds a calendar date first, which every
    /// request's kept-rendering check would pay for nothing.
    pub fn now() -> Self {
        let millis = match SystemTime::now().duration_since(UNIX_EPOCH) {
            Ok(since) => i64::try_from(since.as_millis()).unwrap_or(i64::MAX),
            Err(before) => i64::try_from(before.duration().as_millis()).map_or(i64::MIN, |m| -m),
        };
        Self(millis)
    }

    pub fn saturating_add_millis(self, millis: u64) -> Self {
        Self(
            self.0
                .saturating_add(i64::try_from(millis).unwrap_or(i64::MAX)),
        )
    }

    /// Milliseconds from `earlier` to `self`, zero when `earlier` is later.
    pub fn millis_since(self, earlier: Timestamp) -> u64 {
        u64::try_from(self.0.saturating_sub(earlier.0)).unwrap_or(0)
    }

    /// RFC 3339 in UTC, second precision, e.g. `2026-11-30T12:00:00Z`.
    pub fn to_rfc3339(self) -> String {
        match DateTime::<Utc>::from_timestamp_millis(self.0) {
            Some(datetime) => datetime.to_rfc3339_opts(SecondsFormat::Secs, true),
            None => String::from("1970-01-01T00:00:00Z"),
        }
    }

    /// Parses RFC 3339 with any offset. Instants outside the years 0000–9999 once in UTC are
    /// refused: RFC 3339 cannot write them, so [`Timestamp::to_rfc3339`] could not give back
    /// what was read (`9999-12-31T23:59:59-01:00` is year 10000 in UTC).
    pub fn parse_rfc3339(text: &str) -> Result<Self, TimestampError> {
        let datetime = DateTime::parse_from_rfc3339(text)?.with_timezone(&Utc);
        if !(0..=9999).contains(&datetime.year()) {
            return Err(TimestampError::OutOfRange);
        }
        Ok(Self(datetime.timestamp_millis()))
    }
}

/// Why a text is not a [`Timestamp`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimestampError {
    #[error("{0}")]
    Syntax(#[from] chrono::ParseError),
    #[error("the instant is outside the years 0000-9999 in UTC, which RFC 3339 cannot write")]
    OutOfRange,
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "Timestamp({})", self.to_rfc3339())
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(&self.to_rfc3339())
    }
}

/// On the wire a timestamp is an RFC 3339 string, which is what clients and operators read.
impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_rfc3339())
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        Timestamp::parse_rfc3339(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn now_agrees_with_chrono() {
        let before = chrono::Utc::now().timestamp_millis();
        let now = super::Timestamp::now().as_millis();
        let after = chrono::Utc::now().timestamp_millis();
        assert!(
            before <= now && now <= after,
            "{before} <= {now} <= {after}"
        );
    }

    #[test]
    fn instants_rfc_3339_cannot_write_in_utc_are_refused() {
        use super::{Timestamp, TimestampError};
        assert_eq!(
            Timestamp::parse_rfc3339("9999-12-31T23:59:59-01:00"),
            Err(TimestampError::OutOfRange)
        );
        assert_eq!(
            Timestamp::parse_rfc3339("0000-01-01T00:30:00+01:00"),
            Err(TimestampError::OutOfRange)
        );
        let last = Timestamp::parse_rfc3339("9999-12-31T23:59:59Z").unwrap();
        assert_eq!(last.to_rfc3339(), "9999-12-31T23:59:59Z");
        assert_eq!(
            Timestamp::parse_rfc3339(&last.to_rfc3339()),
            Ok(last),
            "round trip"
        );
    }

    use super::*;

    #[test]
    fn formats_and_parses_rfc3339() {
        let stamp = Timestamp::parse_rfc3339("2026-11-30T12:00:00Z").unwrap();
        assert_eq!(stamp.to_rfc3339(), "2026-11-30T12:00:00Z");
        assert_eq!(
            serde_json::to_string(&stamp).unwrap(),
            "\"2026-11-30T12:00:00Z\""
        );
        assert!(Timestamp::parse_rfc3339("yesterday").is_err());
    }

    #[test]
    fn arithmetic_saturates() {
        let stamp = Timestamp::from_millis(1_000);
        assert_eq!(stamp.saturating_add_millis(500).as_millis(), 1_500);
        assert_eq!(stamp.millis_since(Timestamp::from_millis(2_000)), 0);
        assert_eq!(Timestamp::from_millis(2_000).millis_since(stamp), 1_000);
    }
}
