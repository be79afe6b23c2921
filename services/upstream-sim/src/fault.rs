//! What can go wrong with a simulated API, as set at run time by tests and operators.

use serde::{Deserialize, Serialize};

/// The longest latency (and jitter) accepted: ten minutes is far past any client timeout, and a
/// bound keeps a typo from parking calls for days.
pub const MAX_LATENCY_MS: u64 = 600_000;

/// The faults applied to every call of one endpoint. The default is a healthy API.
///
/// Per call, in this order: `outage` answers 503 at once; `rate_limited` answers 429 at once;
/// otherwise the call waits `latency_ms` plus a uniform `0..=latency_jitter_ms`, then hangs with
/// probability `hang_rate`, else fails with 500 with probability `error_rate`, else succeeds.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Fault {
    /// Fixed delay added to every call that is not refused outright, to exercise timeout tiers.
    pub latency_ms: u64,
    /// Uniform random extra delay `0..=latency_jitter_ms`, so latencies form a spread, not a spike.
    pub latency_jitter_ms: u64,
    /// Fraction in `[0, 1]` of calls answered 500 `injected_error`.
    pub error_rate: f64,
    /// Fraction in `[0, 1]` of calls that never answer: the client's own timeout must fire.
    pub hang_rate: f64,
    /// Every call is answered 429 with `Retry-After: 1`, as a quota-exceeded API would.
    pub rate_limited: bool,
    /// Every call is answered 503 without delay, as an API that is down would.
    pub outage: bool,
}

/// Why a fault was refused; the message names the offending field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FaultError {
    #[error("{field} must be a finite number between 0 and 1, got {value}")]
    RateOutOfRange { field: &'static str, value: f64 },
    #[error("{field} must be at most {max} ms, got {value}", max = MAX_LATENCY_MS)]
    LatencyTooLong { field: &'static str, value: u64 },
}

impl Fault {
    /// A healthy API: no delay, no errors.
    pub const NONE: Fault = Fault {
        latency_ms: 0,
        latency_jitter_ms: 0,
        error_rate: 0.0,
        hang_rate: 0.0,
        rate_limited: false,
        outage: false,
    };

    /// Checks every field, reporting the first one out of range.
    pub fn validate(&self) -> Result<(), FaultError> {
        for (field, value) in [
            ("latency_ms", self.latency_ms),
            ("latency_jitter_ms", self.latency_jitter_ms),
        ] {
            if value > MAX_LATENCY_MS {
                return Err(FaultError::LatencyTooLong { field, value });
            }
        }
        for (field, value) in [
            ("error_rate", self.error_rate),
            ("hang_rate", self.hang_rate),
        ] {
            if !(value.is_finite() && (0.0..=1.0).contains(&value)) {
                return Err(FaultError::RateOutOfRange { field, value });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_healthy_and_valid() {
        assert_eq!(Fault::default(), Fault::NONE);
        assert_eq!(Fault::NONE.validate(), Ok(()));
    }

    #[test]
    fn bounds_are_inclusive() {
        let fault = Fault {
            latency_ms: MAX_LATENCY_MS,
            latency_jitter_ms: MAX_LATENCY_MS,
            error_rate: 1.0,
            hang_rate: 0.0,
            ..Fault::NONE
        };
        assert_eq!(fault.validate(), Ok(()));
    }

    #[test]
    fn each_bad_field_is_named() {
        let cases = [
            (
                Fault {
                    latency_ms: MAX_LATENCY_MS + 1,
                    ..Fault::NONE
                },
                "latency_ms",
            ),
            (
                Fault {
                    latency_jitter_ms: u64::MAX,
                    ..Fault::NONE
                },
                "latency_jitter_ms",
            ),
            (
                Fault {
                    error_rate: 1.01,
                    ..Fault::NONE
                },
                "error_rate",
            ),
            (
                Fault {
                    error_rate: -0.1,
                    ..Fault::NONE
                },
                "error_rate",
            ),
            (
                Fault {
                    hang_rate: f64::NAN,
                    ..Fault::NONE
                },
                "hang_rate",
            ),
            (
                Fault {
                    hang_rate: f64::INFINITY,
                    ..Fault::NONE
                },
                "hang_rate",
            ),
        ];
        for (fault, field) in cases {
            let message = fault.validate().unwrap_err().to_string();
            assert!(message.starts_with(field), "{field}: {message}");
        }
    }

    #[test]
    fn json_fields_default_and_unknown_ones_are_refused() {
        let fault: Fault = serde_json::from_str(r#"{"error_rate":0.25}"#).unwrap();
        assert_eq!(
            fault,
            Fault {
                error_rate: 0.25,
                ..Fault::NONE
            }
        );
        let error = serde_json::from_str::<Fault>(r#"{"eror_rate":0.25}"#).unwrap_err();
        assert!(
            error.to_string().contains("unknown field `eror_rate`"),
            "{error}"
        );
    }
}
