//! The bus operators' change events arrive on (and are published to): in process for the
//! embedded profile, RabbitMQ for a fleet. Both backends report the same counters.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rebate_amqp_bus::AmqpBus;
use rebate_amqp_bus::events::{AmqpEventPublisher, DecodingHandler};
use rebate_events::{
    BusConfig, EventPublisher, InProcessBus, SigningKey, Subscription, ValidationPolicy,
};
use tokio_util::sync::CancellationToken;

use crate::config::{EventBackend, EventSettings};
use crate::invalidation::Invalidator;

/// The bus operators' events arrive on (and are published to) in this instance.
#[derive(Clone)]
pub enum EventBus {
    InProcess(InProcessBus),
    Amqp {
        bus: Arc<AmqpBus>,
        publisher: Arc<AmqpEventPublisher>,
    },
}

impl std::fmt::Debug for EventBus {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EventBus::InProcess(_) => formatter.write_str("EventBus::InProcess"),
            EventBus::Amqp { bus, .. } => write!(formatter, "EventBus::Amqp({:?})", bus.status()),
        }
    }
}

impl EventBus {
    /// Starts the configured bus with `invalidator` as this instance's handler. The in-process
    /// bus returns the subscription that keeps the handler on it; hold it for as long as the
    /// instance serves.
    pub fn start(
        events: &EventSettings,
        invalidator: Arc<Invalidator>,
        shutdown: CancellationToken,
    ) -> anyhow::Result<(EventBus, Option<Subscription>)> {
        let signing_key = if events.signing_key.is_empty() {
            None
        } else {
            Some(
                SigningKey::new(events.signing_key.expose().as_bytes().to_vec())
                    .map_err(|error| anyhow::anyhow!("events.signing_key: {error}"))?,
            )
        };
        let policy = ValidationPolicy {
            signing_key: signing_key.clone().filter(|_| events.require_signature),
            max_age: (events.max_age_secs > 0).then(|| Duration::from_secs(events.max_age_secs)),
            max_future_skew: Some(ValidationPolicy::DEFAULT_FUTURE_SKEW),
            now: rebate_domain::Timestamp::now(),
        };
        match events.backend {
            EventBackend::InProcess => {
                let bus = InProcessBus::start(
                    BusConfig {
                        policy,
                        ..BusConfig::default()
                    },
                    shutdown,
                );
                let subscription = bus.subscribe(invalidator);
                Ok((EventBus::InProcess(bus), Some(subscription)))
            }
            EventBackend::Amqp => {
                let handler = Arc::new(DecodingHandler::new(invalidator, policy));
                let bus = AmqpBus::start(events.amqp.clone(), handler, shutdown)
                    .context("starting the AMQP event bus")?;
                let publisher = AmqpEventPublisher::new(bus.publisher(), signing_key);
                tracing::info!(instance = %events.amqp.instance_id, "amqp event bus started");
                Ok((
                    EventBus::Amqp {
                        bus: Arc::new(bus),
                        publisher: Arc::new(publisher),
                    },
                    None,
                ))
            }
        }
    }

    pub fn publisher(&self) -> &dyn EventPublisher {
        match self {
            EventBus::InProcess(bus) => bus,
            EventBus::Amqp { publisher, .. } => publisher.as_ref(),
        }
    }

    /// The in-process bus, for its dead letters and `settled()` (tests, embedded profile).
    pub fn in_process(&self) -> Option<&InProcessBus> {
        match self {
            EventBus::InProcess(bus) => Some(bus),
            EventBus::Amqp { .. } => None,
        }
    }

    /// The bus's counters, mapped onto the same five for either backend (for metrics).
    pub fn stats(&self) -> EventStats {
        match self {
            EventBus::InProcess(bus) => {
                let stats = bus.stats();
                EventStats {
                    published: stats.published,
                    processed: stats.delivered_broadcast + stats.delivered_shared,
                    failed: stats.redelivered + stats.dead_lettered + stats.abandoned,
                    redelivered: stats.redelivered,
                    dead_lettered: stats.dead_lettered,
                    abandoned: stats.abandoned,
                }
            }
            EventBus::Amqp { bus, .. } => {
                let stats = bus.stats();
                EventStats {
                    published: stats.publish_ok,
                    processed: stats.acked,
                    failed: stats.retried + stats.dead_lettered + stats.abandoned,
                    redelivered: stats.retried,
                    dead_lettered: stats.dead_lettered,
                    abandoned: stats.abandoned,
                }
            }
        }
    }

    /// Whether events can flow: always for the in-process bus, while connected for the broker.
    pub fn is_ready(&self) -> bool {
        match self {
            EventBus::InProcess(_) => true,
            EventBus::Amqp { bus, .. } => bus.is_ready(),
        }
    }

    /// What the latest reconnect did about the events missed meanwhile (never, in process).
    pub fn last_catch_up(&self) -> Option<rebate_amqp_bus::CatchUpOutcome> {
        match self {
            EventBus::InProcess(_) => None,
            EventBus::Amqp { bus, .. } => {
                bus.status().last_catch_up.map(|catch_up| catch_up.outcome)
            }
        }
    }
}

/// Event counters since start, the same for the in-process bus and RabbitMQ (for metrics and
/// the status page).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct EventStats {
    /// Events this instance published (confirmed by the broker on RabbitMQ).
    pub published: u64,
    /// Deliveries handled: every broadcast one, and the shared ones the handler accepted.
    pub processed: u64,
    /// Deliveries refused (undecodable) or failed by the handler; each one was redelivered,
    /// dead-lettered or abandoned, so this is `redelivered + dead_lettered + abandoned`.
    pub failed: u64,
    pub redelivered: u64,
    pub dead_lettered: u64,
    /// Shared deliveries whose L1 effect is in place but whose L2 fence kept failing until the
    /// last attempt: acknowledged and counted, never dead-lettered.
    pub abandoned: u64,
}
