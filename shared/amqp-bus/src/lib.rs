//! Cache invalidation over RabbitMQ: this crate moves signed event *bytes* between instances and
//! guarantees the delivery contract — every instance sees every event on its own broadcast queue
//! (drop L1), exactly one instance handles it from the shared queue (drop and re-warm L2), manual
//! acks, bounded redelivery, and a dead-letter queue that records why. It never stops consuming on
//! bad input and reconnects with backoff and jitter after broker outages. Its core knows nothing
//! of the event schema, the caches or HTTP (callers plug in a [`DeliveryHandler`]); only the thin
//! [`events`] module speaks the `rebate-events` contract.
//!
//! # Layout
//! - [`AmqpSettings`]: broker URL and topology names (defaults `rebate.events`, ...).
//! - [`AmqpBus`]: the supervisor task (connect → declare → consume → reconnect), plus
//!   [`AmqpBus::status`] for readiness and [`AmqpBus::stats`] for metrics.
//! - [`AmqpPublisher`]: confirm-mode publishing of bytes + optional signature.
//! - [`DeliveryHandler`]: the callback; its [`DeliveryError`] decides retry or dead-letter.
//! - [`events`]: the adapter to `rebate-events` ([`events::AmqpEventPublisher`] and
//!   [`events::DecodingHandler`]), so the application works with typed events.
//! - [`headers`]: header names on the wire (`x-signature`, `x-deliveries`, `x-death-reason`, ...).
//!
//! # Redelivery
//! A retryable failure waits `retry_delay_ms × 2^(n − 1)` (capped at `retry_max_delay_ms`; by
//! default 250 ms doubling to 4 s, 15.75 s over 8 deliveries, see
//! [`AmqpSettings::redelivery_window`]) and acknowledges the original only after a copy with
//! `x-deliveries = n + 1` has been republished (with publisher confirms) to the same queue; at
//! `max_deliveries` the copy goes to the dead-letter exchange instead, with `x-death-reason`,
//! `x-death-code`, `x-deliveries`, `x-original-routing-key` and `x-original-queue`. If forwarding
//! fails the original is requeued, so a message is never lost by this crate (at-least-once;
//! handlers are idempotent) — with one deliberate exception: a handler that reports
//! [`DeliveryError::Incomplete`] (its effect is in place, a follow-up failed) is retried the same
//! way, but at `max_deliveries` it is acknowledged and counted in [`BusStats::abandoned`] instead
//! of dead-lettered. Dead letters are for input that was never acceptable.

mod bus;
mod consumer;
pub mod events;
mod handler;
pub mod headers;
mod publisher;
mod settings;
mod shared;
mod status;
mod topology;

pub use bus::AmqpBus;
pub use consumer::RETRIES_EXHAUSTED;
pub use handler::{DeliveryError, DeliveryHandler, QueueRole};
pub use publisher::{AmqpPublisher, PublishError};
pub use settings::{AmqpSettings, SettingsError};
pub use status::{BusStats, BusStatus, CatchUp, CatchUpOutcome};
