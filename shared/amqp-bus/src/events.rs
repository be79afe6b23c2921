//! Adapter to the event contract (`rebate-events`): typed events over the byte-level bus.

use std::sync::Arc;

use async_trait::async_trait;
use rebate_domain::Timestamp;
use rebate_events::{
    EventHandler, EventPublisher, InvalidationEvent, PublishError as EventPublishError, SigningKey,
    ValidationPolicy, decode_event, encode_event, sign,
};

use crate::{AmqpPublisher, DeliveryError, DeliveryHandler, QueueRole};

/// Publishes [`InvalidationEvent`]s to the broker: encoded, signed when a key is configured, and
/// routed as `invalidate.<platform>.<kind>` so operators can bind narrower queues later.
#[derive(Debug, Clone)]
pub struct AmqpEventPublisher {
    publisher: AmqpPublisher,
    signing_key: Option<SigningKey>,
}

impl AmqpEventPublisher {
    /// `signing_key` must match the consumers' policy when they require signatures.
    #[must_use]
    pub fn new(publisher: AmqpPublisher, signing_key: Option<SigningKey>) -> Self {
        Self {
            publisher,
            signing_key,
        }
    }
}

/// The routing key an event is published with.
#[must_use]
pub fn routing_key(event: &InvalidationEvent) -> String {
    format!("invalidate.{}.{}", event.platform(), event.kind().as_str())
}

#[async_trait]
impl EventPublisher for AmqpEventPublisher {
    async fn publish(&self, event: &InvalidationEvent) -> Result<(), EventPublishError> {
        let body = encode_event(event);
        let signature = self.signing_key.as_ref().map(|key| sign(&body, key));
        self.publisher
            .publish_bytes(&routing_key(event), &body, signature.as_deref())
            .await
            .map_err(|error| EventPublishError::Unavailable(error.to_string()))
    }
}

/// Decodes each delivery with the contract's strict decoder, then calls an [`EventHandler`].
///
/// Rejections (malformed, unsigned when required, stale) are dead-lettered at once with the
/// rejection's text as the reason and its code as the counter key; a shared-handler error is
/// retried with bounded redelivery. Broadcast handling cannot fail, so it is always acked.
pub struct DecodingHandler {
    handler: Arc<dyn EventHandler>,
    policy: ValidationPolicy,
}

impl std::fmt::Debug for DecodingHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecodingHandler")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl DecodingHandler {
    /// `policy.now` is replaced by the wall clock for every delivery.
    #[must_use]
    pub fn new(handler: Arc<dyn EventHandler>, policy: ValidationPolicy) -> Self {
        Self { handler, policy }
    }
}

#[async_trait]
impl DeliveryHandler for DecodingHandler {
    async fn handle(
        &self,
        queue: QueueRole,
        body: &[u8],
        signature: Option<&str>,
    ) -> Result<(), DeliveryError> {
        let policy = self.policy.clone().at(Timestamp::now());
        let event = decode_event(body, signature, &policy)
            .map_err(|rejection| DeliveryError::reject(rejection.code(), rejection.to_string()))?;
        match queue {
            QueueRole::Broadcast => {
                self.handler.on_broadcast(&event).await;
                Ok(())
            }
            QueueRole::Shared => self
                .handler
                .on_shared(&event)
                .await
                .map_err(|error| DeliveryError::retry(error.to_string())),
        }
    }
}
