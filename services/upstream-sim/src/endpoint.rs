//! The two simulated APIs, and a pair of values kept per API.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// One of the simulated upstream APIs; faults and counters are kept per endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Endpoint {
    /// `GET /v1/coupons/{platform}/{item_id}` and `POST /v1/coupons:batch`.
    Coupons,
    /// `GET /v1/extras/{platform}/{item_id}` and `POST /v1/extras:batch`.
    Extras,
}

impl Endpoint {
    pub const ALL: [Endpoint; 2] = [Endpoint::Coupons, Endpoint::Extras];

    /// The name used in control routes (`/_sim/faults/{endpoint}`) and JSON keys.
    pub const fn as_str(self) -> &'static str {
        match self {
            Endpoint::Coupons => "coupons",
            Endpoint::Extras => "extras",
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.as_str())
    }
}

/// A control route named an endpoint the simulator does not have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown endpoint {0:?}; expected coupons or extras")]
pub struct UnknownEndpoint(String);

impl FromStr for Endpoint {
    type Err = UnknownEndpoint;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "coupons" => Ok(Endpoint::Coupons),
            "extras" => Ok(Endpoint::Extras),
            other => Err(UnknownEndpoint(rebate_domain::text::truncate_chars(
                other, 32,
            ))),
        }
    }
}

/// One value per endpoint; serialises as `{"coupons": …, "extras": …}`, the shape of the
/// `/_sim/faults` and `/_sim/counters` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PerEndpoint<T> {
    pub coupons: T,
    pub extras: T,
}

impl<T> PerEndpoint<T> {
    /// Builds both values from one function, so adding an endpoint cannot forget one.
    pub fn from_fn(mut make: impl FnMut(Endpoint) -> T) -> Self {
        Self {
            coupons: make(Endpoint::Coupons),
            extras: make(Endpoint::Extras),
        }
    }

    pub fn get(&self, endpoint: Endpoint) -> &T {
        match endpoint {
            Endpoint::Coupons => &self.coupons,
            Endpoint::Extras => &self.extras,
        }
    }

    pub fn get_mut(&mut self, endpoint: Endpoint) -> &mut T {
        match endpoint {
            Endpoint::Coupons => &mut self.coupons,
            Endpoint::Extras => &mut self.extras,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for endpoint in Endpoint::ALL {
            assert_eq!(endpoint.as_str().parse::<Endpoint>(), Ok(endpoint));
            assert_eq!(
                serde_json::to_string(&endpoint).unwrap(),
                format!("\"{endpoint}\"")
            );
        }
        let error = "Coupons".parse::<Endpoint>().unwrap_err();
        assert_eq!(
            error.to_string(),
            "unknown endpoint \"Coupons\"; expected coupons or extras"
        );
    }

    #[test]
    fn long_names_are_truncated_in_messages() {
        let message = "x"
            .repeat(5_000)
            .parse::<Endpoint>()
            .unwrap_err()
            .to_string();
        assert!(message.len() < 100, "{message}");
    }

    #[test]
    fn per_endpoint_serialises_by_name() {
        let pair = PerEndpoint::from_fn(|endpoint| endpoint.as_str().len());
        assert_eq!(*pair.get(Endpoint::Coupons), 7);
        assert_eq!(
            serde_json::to_string(&pair).unwrap(),
            r#"{"coupons":7,"extras":6}"#
        );
    }
}
