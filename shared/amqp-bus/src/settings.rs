//! Typed configuration for the bus.

use std::fmt;
use std::time::Duration;

use serde::Deserialize;

/// Everything the bus needs to reach the broker and name its topology.
///
/// Names are configurable so that tests (and several deployments sharing one broker) can isolate
/// themselves; durations are plain milliseconds so they read well in TOML and env overrides.
#[derive(Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AmqpSettings {
    /// Broker address (`AMQP_URL` in the production profile). May carry credentials, so `Debug`
    /// redacts the password.
    pub url: String,
    /// Durable topic exchange every invalidation event is published to.
    pub exchange: String,
    /// Binding key used for both the shared and the broadcast queue.
    pub binding_key: String,
    /// Durable queue with competing consumers: exactly one instance drops and re-warms L2.
    pub shared_queue: String,
    /// Prefix of the per-instance broadcast queue; the instance id is appended.
    pub broadcast_queue_prefix: String,
    /// Identifies this process; names its broadcast queue and its AMQP connection.
    pub instance_id: String,
    /// Fanout exchange that receives events we give up on.
    pub dead_letter_exchange: String,
    /// Durable queue bound to the dead-letter exchange, kept for operators to inspect.
    pub dead_letter_queue: String,
    /// Unacknowledged deliveries per consumer; bounds in-flight handler work.
    pub prefetch: u16,
    /// Handler attempts per message (first delivery included) before it is dead-lettered (or,
    /// for an incomplete failure, acknowledged and counted as abandoned).
    pub max_deliveries: u32,
    /// Pause before the first retry; each later retry waits twice as long as the one before, up
    /// to `retry_max_delay_ms`, so that a short dependency outage (a Redis restart) is outlasted
    /// instead of burning every attempt in its first seconds. The defaults (250 ms doubling to
    /// 4 s, 8 deliveries) wait 15.75 s in all; see [`AmqpSettings::redelivery_window`].
    pub retry_delay_ms: u64,
    /// Longest pause between two attempts.
    pub retry_max_delay_ms: u64,
    /// Lower bound of the reconnect backoff.
    pub reconnect_min_ms: u64,
    /// Upper bound of the reconnect backoff (full jitter is applied below it).
    pub reconnect_max_ms: u64,
    /// Give up on a TCP/AMQP handshake after this long and back off.
    pub connect_timeout_ms: u64,
    /// Longest wait for the broker's publisher confirm.
    pub publish_timeout_ms: u64,
    /// How long the broker keeps this instance's broadcast queue (and what is published to it)
    /// while the instance is disconnected (`x-expires`). Reconnecting within it, the instance
    /// receives every event it missed; later, the queue is gone and it drops its L1 instead.
    /// Keep it at most `events.max_age_secs`, or replayed events would arrive too old to apply.
    pub catch_up_window_ms: u64,
    /// Most events the broadcast queue keeps for a disconnected instance (`x-max-length`, oldest
    /// dropped first). A backlog that reached it may have lost events: the instance drops its
    /// L1 on reconnecting.
    pub catch_up_max_events: u32,
}

impl Default for AmqpSettings {
    fn default() -> Self {
        Self {
            url: "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned(),
            exchange: "rebate.events".to_owned(),
            binding_key: "#".to_owned(),
            shared_queue: "rebate.invalidate.shared".to_owned(),
            broadcast_queue_prefix: "rebate.invalidate.instance.".to_owned(),
            instance_id: default_instance_id(),
            dead_letter_exchange: "rebate.events.dlx".to_owned(),
            dead_letter_queue: "rebate.events.dead".to_owned(),
            prefetch: 32,
            max_deliveries: 8,
            retry_delay_ms: 250,
            retry_max_delay_ms: 4_000,
            reconnect_min_ms: 200,
            reconnect_max_ms: 10_000,
            connect_timeout_ms: 5_000,
            publish_timeout_ms: 5_000,
            catch_up_window_ms: 300_000,
            catch_up_max_events: 100_000,
        }
    }
}

/// Why a settings value cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid amqp setting `{field}`: {problem}")]
pub struct SettingsError {
    /// The offending field.
    pub field: &'static str,
    /// What is wrong with it.
    pub problem: &'static str,
}

impl AmqpSettings {
    /// Most handler attempts per message: beyond this, redelivery stops being "bounded" in any
    /// useful sense.
    pub const MAX_DELIVERIES_LIMIT: u32 = 50;

    /// Longest total redelivery window [`AmqpSettings::validate`] accepts. A delivery waiting for
    /// its retry holds one of the consumer's `prefetch` slots, and an event retried for longer
    /// than this is better re-published by an operator than held on to.
    pub const MAX_REDELIVERY_WINDOW: Duration = Duration::from_secs(600);

    /// Name of this instance's broadcast queue (durable, kept `catch_up_window_ms` after its
    /// consumer leaves).
    #[must_use]
    pub fn broadcast_queue(&self) -> String {
        format!("{}{}", self.broadcast_queue_prefix, self.instance_id)
    }

    /// Client-provided connection name; operators (and the reconnect test) find the
    /// connection by it in `rabbitmqctl list_connections`.
    #[must_use]
    pub fn connection_name(&self) -> String {
        format!("rebate-amqp-bus/{}", self.instance_id)
    }

    /// Checks the values the bus relies on, explaining the first problem found.
    ///
    /// # Errors
    /// Returns the first field that is empty, too long for AMQP, or out of range.
    pub fn validate(&self) -> Result<(), SettingsError> {
        let names: [(&'static str, &str); 6] = [
            ("exchange", &self.exchange),
            ("binding_key", &self.binding_key),
            ("shared_queue", &self.shared_queue),
            ("instance_id", &self.instance_id),
            ("dead_letter_exchange", &self.dead_letter_exchange),
            ("dead_letter_queue", &self.dead_letter_queue),
        ];
        for (field, value) in names {
            if value.is_empty() {
                return Err(SettingsError {
                    field,
                    problem: "must not be empty",
                });
            }
            if value.len() > 200 {
                return Err(SettingsError {
                    field,
                    problem: "must be at most 200 bytes",
                });
            }
        }
        if self.broadcast_queue().len() > 255 {
            return Err(SettingsError {
                field: "broadcast_queue_prefix",
                problem: "prefix + instance_id must be at most 255 bytes",
            });
        }
        if !(self.url.starts_with("amqp://") || self.url.starts_with("amqps://")) {
            return Err(SettingsError {
                field: "url",
                problem: "must start with amqp:// or amqps://",
            });
        }
        if self.prefetch == 0 {
            return Err(SettingsError {
                field: "prefetch",
                problem: "must be at least 1",
            });
        }
        if self.max_deliveries == 0 || self.max_deliveries > Self::MAX_DELIVERIES_LIMIT {
            return Err(SettingsError {
                field: "max_deliveries",
                problem: "must be between 1 and 50",
            });
        }
        if self.retry_delay_ms == 0 {
            return Err(SettingsError {
                field: "retry_delay_ms",
                problem: "must be at least 1",
            });
        }
        if self.retry_max_delay_ms < self.retry_delay_ms {
            return Err(SettingsError {
                field: "retry_max_delay_ms",
                problem: "must not be below retry_delay_ms",
            });
        }
        if self.redelivery_window() > Self::MAX_REDELIVERY_WINDOW {
            return Err(SettingsError {
                field: "max_deliveries",
                problem: "with retry_delay_ms and retry_max_delay_ms, the redelivery window \
                          would exceed 600 s",
            });
        }
        if self.reconnect_min_ms == 0 || self.reconnect_min_ms > self.reconnect_max_ms {
            return Err(SettingsError {
                field: "reconnect_min_ms",
                problem: "must be positive and not above reconnect_max_ms",
            });
        }
        if self.connect_timeout_ms == 0 || self.publish_timeout_ms == 0 {
            return Err(SettingsError {
                field: "connect_timeout_ms",
                problem: "timeouts must be positive",
            });
        }
        if !(1_000..=86_400_000).contains(&self.catch_up_window_ms) {
            return Err(SettingsError {
                field: "catch_up_window_ms",
                problem: "must be between 1000 (1 s) and 86400000 (a day)",
            });
        }
        if !(1..=10_000_000).contains(&self.catch_up_max_events) {
            return Err(SettingsError {
                field: "catch_up_max_events",
                problem: "must be between 1 and 10000000",
            });
        }
        Ok(())
    }

    /// The pause before republishing a delivery whose `attempt` (1 for the first delivery)
    /// failed: `retry_delay_ms × 2^(attempt − 1)`, capped at `retry_max_delay_ms`.
    #[must_use]
    pub fn retry_delay(&self, attempt: u64) -> Duration {
        let doublings = u32::try_from(attempt.saturating_sub(1).min(63)).unwrap_or(63);
        let factor = 1u64.checked_shl(doublings).unwrap_or(u64::MAX);
        Duration::from_millis(
            self.retry_delay_ms
                .saturating_mul(factor)
                .min(self.retry_max_delay_ms),
        )
    }

    /// The total pause across all retries of one message (`max_deliveries − 1` of them): how
    /// long a dependency may stay down before the message runs out of attempts. Handler time
    /// comes on top.
    #[must_use]
    pub fn redelivery_window(&self) -> Duration {
        (1..u64::from(self.max_deliveries))
            .map(|attempt| self.retry_delay(attempt))
            .fold(Duration::ZERO, Duration::saturating_add)
    }

    pub(crate) fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }

    pub(crate) fn publish_timeout(&self) -> Duration {
        Duration::from_millis(self.publish_timeout_ms)
    }
}

impl fmt::Debug for AmqpSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpSettings")
            .field("url", &redact_url(&self.url))
            .field("exchange", &self.exchange)
            .field("binding_key", &self.binding_key)
            .field("shared_queue", &self.shared_queue)
            .field("broadcast_queue_prefix", &self.broadcast_queue_prefix)
            .field("instance_id", &self.instance_id)
            .field("dead_letter_exchange", &self.dead_letter_exchange)
            .field("dead_letter_queue", &self.dead_letter_queue)
            .field("prefetch", &self.prefetch)
            .field("max_deliveries", &self.max_deliveries)
            .field("retry_delay_ms", &self.retry_delay_ms)
            .field("retry_max_delay_ms", &self.retry_max_delay_ms)
            .field("reconnect_min_ms", &self.reconnect_min_ms)
            .field("reconnect_max_ms", &self.reconnect_max_ms)
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .field("publish_timeout_ms", &self.publish_timeout_ms)
            .field("catch_up_window_ms", &self.catch_up_window_ms)
            .field("catch_up_max_events", &self.catch_up_max_events)
            .finish()
    }
}

/// Replaces the password of `scheme://user:password@host/...` with `***`.
pub(crate) fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "***".to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let Some(at) = authority.rfind('@') else {
        return url.to_owned();
    };
    let userinfo = &authority[..at];
    let user = userinfo
        .split_once(':')
        .map_or(userinfo, |(user, _password)| user);
    format!("{scheme}://{user}:***@{}", &rest[at + 1..])
}

fn default_instance_id() -> String {
    format!("{}-{:08x}", std::process::id(), rand::random::<u32>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_redacts_the_password() {
        let settings = AmqpSettings {
            url: "amqp://svc:s3cret@mq.internal:5672/%2f".to_owned(),
            ..AmqpSettings::default()
        };
        let printed = format!("{settings:?}");
        assert!(!printed.contains("s3cret"), "{printed}");
        assert!(
            printed.contains("amqp://svc:***@mq.internal:5672/%2f"),
            "{printed}"
        );
    }

    #[test]
    fn redaction_leaves_credential_free_urls_alone() {
        assert_eq!(redact_url("amqp://127.0.0.1:5672"), "amqp://127.0.0.1:5672");
        assert_eq!(redact_url("garbage"), "***");
    }

    #[test]
    fn defaults_are_valid_and_validation_names_the_field() {
        assert_eq!(AmqpSettings::default().validate(), Ok(()));
        let bad = AmqpSettings {
            prefetch: 0,
            ..AmqpSettings::default()
        };
        assert_eq!(bad.validate().map_err(|e| e.field), Err("prefetch"));
        let bad = AmqpSettings {
            reconnect_min_ms: 20_000,
            ..AmqpSettings::default()
        };
        assert_eq!(bad.validate().map_err(|e| e.field), Err("reconnect_min_ms"));
    }

    #[test]
    fn retry_delays_double_from_the_first_and_stop_at_the_cap() {
        let settings = AmqpSettings::default();
        let delays: Vec<u64> = (1..=8)
            .map(|attempt| u64::try_from(settings.retry_delay(attempt).as_millis()).expect("small"))
            .collect();
        assert_eq!(delays, [250, 500, 1_000, 2_000, 4_000, 4_000, 4_000, 4_000]);
        assert_eq!(settings.retry_delay(0), Duration::from_millis(250));
        assert_eq!(settings.retry_delay(u64::MAX), Duration::from_secs(4));
    }

    #[test]
    fn the_default_window_outlasts_a_ten_second_outage() {
        let settings = AmqpSettings::default();
        // 7 retries between 8 deliveries: 250 + 500 + 1000 + 2000 + 3 × 4000 ms.
        assert_eq!(settings.redelivery_window(), Duration::from_millis(15_750));
        assert!(settings.redelivery_window() >= Duration::from_secs(10));
        let single = AmqpSettings {
            max_deliveries: 1,
            ..AmqpSettings::default()
        };
        assert_eq!(single.redelivery_window(), Duration::ZERO);
    }

    #[test]
    fn retry_settings_are_validated_and_the_window_is_bounded() {
        let field = |settings: AmqpSettings| settings.validate().map_err(|error| error.field);
        let base = AmqpSettings::default;
        assert_eq!(
            field(AmqpSettings {
                retry_delay_ms: 0,
                ..base()
            }),
            Err("retry_delay_ms")
        );
        assert_eq!(
            field(AmqpSettings {
                retry_max_delay_ms: 100,
                ..base()
            }),
            Err("retry_max_delay_ms")
        );
        assert_eq!(
            field(AmqpSettings {
                max_deliveries: 51,
                ..base()
            }),
            Err("max_deliveries")
        );
        // 50 deliveries × 60 s cap: 49 minutes of retries, refused.
        assert_eq!(
            field(AmqpSettings {
                max_deliveries: 50,
                retry_max_delay_ms: 60_000,
                ..base()
            }),
            Err("max_deliveries")
        );
        // Up to the limit is fine: 250 ms doubling to 60 s over 12 deliveries is ~ 4 min.
        assert_eq!(
            field(AmqpSettings {
                max_deliveries: 12,
                retry_max_delay_ms: 60_000,
                ..base()
            }),
            Ok(())
        );
    }

    #[test]
    fn broadcast_queue_is_per_instance() {
        let settings = AmqpSettings {
            instance_id: "a1".to_owned(),
            ..AmqpSettings::default()
        };
        assert_eq!(settings.broadcast_queue(), "rebate.invalidate.instance.a1");
    }
}
