//! Wall-clock timestamps in milliseconds since the Unix epoch.
//!
//! Cache envelopes travel between instances (through Redis), so freshness is judged on wall-clock
//! time, not on a process-local monotonic clock. Where "now" comes from is up to the caller (the
//! cache crate injects a clock so tests never sleep).

use std::fmt;

use chrono::{DateTime, SecondsFormat, Utc};
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

    pub fn now() -> Self {
        Self(Utc::now().timestamp_millis())
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

    pub fn parse_rfc3339(text: &str) -> Result<Self, chrono::ParseError> {
        DateTime::parse_from_rfc3339(text).map(|datetime| Self(datetime.timestamp_millis()))
    }
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
