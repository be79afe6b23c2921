//! Money in integer cents and rates in integer basis points: no floating point ever touches
//! money (the formula that combines them is in [`crate::rebate`]).

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MoneyError {
    #[error("rate {0} bps is above 10000 bps (100 %)")]
    RateAboveFull(u64),
    #[error("amount {0} is negative; money is never negative")]
    Negative(i64),
}

/// An amount of money in integer cents (分). Never negative.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Cents(u64);

impl Cents {
    pub const ZERO: Cents = Cents(0);

    pub const fn new(cents: u64) -> Self {
        Self(cents)
    }

    pub const fn get(self) -> u64 {
        self.0
    }

    pub fn saturating_sub(self, other: Cents) -> Cents {
        Cents(self.0.saturating_sub(other.0))
    }
}

impl TryFrom<i64> for Cents {
    type Error = MoneyError;

    /// Databases hand out signed integers; a negative amount is corrupt data, not zero.
    fn try_from(value: i64) -> Result<Self, Self::Error> {
        u64::try_from(value)
            .map(Cents)
            .map_err(|_| MoneyError::Negative(value))
    }
}

impl fmt::Display for Cents {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{}.{:02}", self.0 / 100, self.0 % 100)
    }
}

/// A rebate rate in basis points: 100 bps = 1 %, at most 10 000 bps = 100 %.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct RateBps(u16);

impl RateBps {
    pub const FULL: u16 = 10_000;

    pub const fn get(self) -> u16 {
        self.0
    }
}

impl TryFrom<u64> for RateBps {
    type Error = MoneyError;

    fn try_from(value: u64) -> Result<Self, Self::Error> {
        if value > u64::from(Self::FULL) {
            return Err(MoneyError::RateAboveFull(value));
        }
        Ok(Self(value as u16))
    }
}

impl TryFrom<i64> for RateBps {
    type Error = MoneyError;

    fn try_from(value: i64) -> Result<Self, Self::Error> {
        let unsigned = u64::try_from(value).map_err(|_| MoneyError::Negative(value))?;
        Self::try_from(unsigned)
    }
}

impl<'de> Deserialize<'de> for RateBps {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = u64::deserialize(deserializer)?;
        RateBps::try_from(raw).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_and_money_validation() {
        assert!(RateBps::try_from(10_001u64).is_err());
        assert!(RateBps::try_from(-1i64).is_err());
        assert!(Cents::try_from(-5i64).is_err());
        assert_eq!(Cents(12_345).to_string(), "123.45");
        assert!(serde_json::from_str::<RateBps>("10001").is_err());
    }
}
