//! Per-delivery processing: handler call, then ack, retry or dead-letter.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicNackOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Consumer};
use rebate_domain::text::truncate_bytes;

use crate::publisher::{PublishError, persistent_json, publish_confirmed};
use crate::shared::Shared;
use crate::status::bump;
use crate::{DeliveryError, DeliveryHandler, QueueRole, headers};

/// Code recorded when a retryable failure ran out of attempts.
pub const RETRIES_EXHAUSTED: &str = "retries_exhausted";

/// Longest reason text copied into a header; handlers may produce long error chains.
const MAX_REASON_BYTES: usize = 1024;

/// What one connection's consumers share.
pub(crate) struct ConsumeContext {
    pub(crate) shared: Arc<Shared>,
    pub(crate) handler: Arc<dyn DeliveryHandler>,
    /// Confirm-mode channel used for retries and dead-letters.
    pub(crate) publish_channel: Channel,
}

/// Drives one consumer until its stream fails or is cancelled, returning why.
///
/// Each delivery is processed on its own task; the broker's prefetch bounds how many are in
/// flight because a delivery stays unacknowledged until its task settles it.
pub(crate) async fn consume(
    context: Arc<ConsumeContext>,
    role: QueueRole,
    queue: String,
    mut consumer: Consumer,
) -> String {
    while let Some(item) = consumer.next().await {
        match item {
            Ok(delivery) => {
                tokio::spawn(process(Arc::clone(&context), role, queue.clone(), delivery));
            }
            Err(error) => return format!("{} consumer failed: {error}", role.as_str()),
        }
    }
    format!("{} consumer was cancelled by the broker", role.as_str())
}

async fn process(context: Arc<ConsumeContext>, role: QueueRole, queue: String, delivery: Delivery) {
    bump(&context.shared.counters.consumed);
    let message_headers = delivery.properties.headers().clone().unwrap_or_default();
    let attempt = headers::count(&message_headers, headers::DELIVERIES)
        .unwrap_or(1)
        .max(1);
    let signature = headers::text(&message_headers, headers::SIGNATURE);

    let outcome = AssertUnwindSafe(context.handler.handle(
        role,
        &delivery.data,
        signature.as_deref(),
    ))
    .catch_unwind()
    .await
    .unwrap_or_else(|_panic| Err(DeliveryError::retry("handler panicked")));

    let settings = &context.shared.settings;
    let forwarded = match outcome {
        Ok(()) => {
            ack(&delivery, role).await;
            bump(&context.shared.counters.acked);
            return;
        }
        Err(DeliveryError::Reject { code, reason }) => {
            dead_letter(
                &context,
                &queue,
                &delivery,
                message_headers,
                attempt,
                &code,
                &reason,
            )
            .await
        }
        Err(DeliveryError::Retry { reason }) if attempt >= u64::from(settings.max_deliveries) => {
            dead_letter(
                &context,
                &queue,
                &delivery,
                message_headers,
                attempt,
                RETRIES_EXHAUSTED,
                &reason,
            )
            .await
        }
        Err(DeliveryError::Incomplete { code, reason })
            if attempt >= u64::from(settings.max_deliveries) =>
        {
            // Not a poison message: its effect is in place, only a follow-up failed for the
            // whole redelivery window. Dropping it is the honest outcome; a dead letter would
            // read as "this event was never applied".
            tracing::warn!(
                queue = role.as_str(),
                code = code.as_str(),
                %reason,
                attempt,
                window_ms = u64::try_from(settings.redelivery_window().as_millis()).unwrap_or(u64::MAX),
                "delivery abandoned after its last attempt; its effect is in place, its follow-up is not"
            );
            ack(&delivery, role).await;
            context.shared.counters.record_abandoned(&code);
            return;
        }
        Err(DeliveryError::Retry { reason } | DeliveryError::Incomplete { reason, .. }) => {
            let delay = settings.retry_delay(attempt);
            tracing::debug!(
                queue = role.as_str(),
                attempt,
                delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                %reason,
                "delivery will be retried"
            );
            tokio::time::sleep(delay).await;
            let result = republish(&context, &queue, &delivery, message_headers, attempt + 1).await;
            if result.is_ok() {
                bump(&context.shared.counters.retried);
            }
            result
        }
    };

    match forwarded {
        // The copy is safely stored elsewhere, so the original can go.
        Ok(()) => ack(&delivery, role).await,
        Err(error) => {
            // Could not store the copy: hand the original back to the broker instead of losing it.
            tracing::warn!(queue = role.as_str(), %error, "could not forward delivery; requeueing it");
            let requeue = BasicNackOptions {
                requeue: true,
                ..BasicNackOptions::default()
            };
            if let Err(error) = delivery.nack(requeue).await {
                tracing::debug!(queue = role.as_str(), %error, "nack failed; broker will redeliver");
            }
        }
    }
}

async fn ack(delivery: &Delivery, role: QueueRole) {
    if let Err(error) = delivery.ack(BasicAckOptions::default()).await {
        // The channel is gone; the broker redelivers unacked messages, and handling is idempotent.
        tracing::debug!(queue = role.as_str(), %error, "ack failed; broker will redeliver");
    }
}

fn original_routing_key(message_headers: &FieldTable, delivery: &Delivery) -> String {
    // AMQP routing keys are at most 255 bytes; a foreign header could claim a longer one.
    headers::text(message_headers, headers::ORIGINAL_ROUTING_KEY)
        .map(|key| truncate_bytes(&key, 255).to_owned())
        .unwrap_or_else(|| delivery.routing_key.as_str().to_owned())
}

fn copy_properties(delivery: &Delivery, message_headers: FieldTable) -> BasicProperties {
    let properties = persistent_json().with_headers(message_headers);
    match delivery.properties.content_type() {
        Some(content_type) => properties.with_content_type(content_type.clone()),
        None => properties,
    }
}

/// Republishes a copy straight to the queue it came from (via the default exchange, so other
/// instances do not see it again) with the attempt counter incremented.
async fn republish(
    context: &ConsumeContext,
    queue: &str,
    delivery: &Delivery,
    mut message_headers: FieldTable,
    next_attempt: u64,
) -> Result<(), PublishError> {
    let routing_key = original_routing_key(&message_headers, delivery);
    message_headers.insert(
        headers::DELIVERIES.into(),
        AMQPValue::LongLongInt(saturating_i64(next_attempt)),
    );
    message_headers.insert(
        headers::ORIGINAL_ROUTING_KEY.into(),
        AMQPValue::LongString(LongString::from(routing_key)),
    );
    publish_confirmed(
        &context.publish_channel,
        "",
        queue,
        &delivery.data,
        copy_properties(delivery, message_headers),
        context.shared.settings.publish_timeout(),
    )
    .await
}

/// Publishes a copy to the dead-letter exchange, carrying why it was given up on.
async fn dead_letter(
    context: &ConsumeContext,
    queue: &str,
    delivery: &Delivery,
    mut message_headers: FieldTable,
    attempt: u64,
    code: &str,
    reason: &str,
) -> Result<(), PublishError> {
    tracing::warn!(%queue, code, reason, attempt, "dead-lettering delivery");
    let routing_key = original_routing_key(&message_headers, delivery);
    let text = |value: &str| AMQPValue::LongString(LongString::from(value));
    message_headers.insert(
        headers::DEATH_REASON.into(),
        text(truncate_bytes(reason, MAX_REASON_BYTES)),
    );
    message_headers.insert(
        headers::DEATH_CODE.into(),
        text(truncate_bytes(code, MAX_REASON_BYTES)),
    );
    message_headers.insert(
        headers::DELIVERIES.into(),
        AMQPValue::LongLongInt(saturating_i64(attempt)),
    );
    message_headers.insert(headers::ORIGINAL_ROUTING_KEY.into(), text(&routing_key));
    message_headers.insert(headers::ORIGINAL_QUEUE.into(), text(queue));
    let settings = &context.shared.settings;
    let result = publish_confirmed(
        &context.publish_channel,
        &settings.dead_letter_exchange,
        &routing_key,
        &delivery.data,
        copy_properties(delivery, message_headers),
        settings.publish_timeout(),
    )
    .await;
    if result.is_ok() {
        context.shared.counters.record_dead_letter(code);
    }
    result
}

fn saturating_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}
