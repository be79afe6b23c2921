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
/// routed by [`routing_key`] so operators can bind narrower queues later.
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

/// The platform segment of [`routing_key`] for an event that names no platform
/// (`rules_changed`): it concerns every platform. No platform is called that.
pub const EVERY_PLATFORM: &str = "all";

/// The routing key an event is published with: `invalidate.<platform>.<kind>`, the platform
/// being [`EVERY_PLATFORM`] for an event that names none, so that a binding on `invalidate.#`
/// (or `invalidate.*.<kind>`) receives every kind.
#[must_use]
pub fn routing_key(event: &InvalidationEvent) -> String {
    let kind = event.kind().as_str();
    match event.platform() {
        Some(platform) => format!("invalidate.{platform}.{kind}"),
        None => format!("invalidate.{EVERY_PLATFORM}.{kind}"),
    }
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
/// retried with bounded redelivery — then dead-lettered, or, when the handler called it
/// [`rebate_events::HandlerError::incomplete`], acknowledged and counted as abandoned.
/// Broadcast handling cannot fail, so it is always acked.
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
            QueueRole::Shared => {
                self.handler.on_shared(&event).await.map_err(|error| {
                    match error.incomplete_code() {
                        Some(code) => DeliveryError::incomplete(code, error.to_string()),
                        None => DeliveryError::retry(error.to_string()),
                    }
                })
            }
        }
    }

    async fn on_missed(&self, reason: &str) {
        self.handler.on_events_missed(reason).await;
    }
}

#[cfg(test)]
mod tests {
    use rebate_domain::{ItemId, Platform};
    use rebate_events::{EventId, EventKind, HandlerError};

    use super::*;

    /// Fails every shared delivery the way it was built to.
    struct Failing(HandlerError);

    #[async_trait]
    impl EventHandler for Failing {
        async fn on_broadcast(&self, _event: &InvalidationEvent) {}

        async fn on_shared(&self, _event: &InvalidationEvent) -> Result<(), HandlerError> {
            Err(self.0.clone())
        }
    }

    fn body() -> Vec<u8> {
        let event = InvalidationEvent::new(
            EventId::parse("evt-1").expect("valid id"),
            EventKind::RateChanged,
            Platform::Jd,
            vec![ItemId::from_u64(100_001)],
            7,
            Timestamp::now(),
        )
        .expect("valid event");
        encode_event(&event)
    }

    fn decoding(error: HandlerError) -> DecodingHandler {
        DecodingHandler::new(
            Arc::new(Failing(error)),
            ValidationPolicy::permissive(Timestamp::now()),
        )
    }

    #[tokio::test]
    async fn handler_errors_keep_their_kind_on_the_wire_side() {
        let plain = decoding(HandlerError::new("store down"));
        assert_eq!(
            plain.handle(QueueRole::Shared, &body(), None).await,
            Err(DeliveryError::retry("store down"))
        );
        let incomplete = decoding(HandlerError::incomplete("l2_fence_unapplied", "redis down"));
        assert_eq!(
            incomplete.handle(QueueRole::Shared, &body(), None).await,
            Err(DeliveryError::incomplete(
                "l2_fence_unapplied",
                "redis down"
            ))
        );
        // The broadcast path never fails on the handler.
        assert_eq!(
            incomplete.handle(QueueRole::Broadcast, &body(), None).await,
            Ok(())
        );
    }

    #[test]
    fn a_rules_announcement_is_routed_for_every_platform() {
        let announcement =
            InvalidationEvent::rules_changed(EventId::generate(), 3, Timestamp::now())
                .expect("valid announcement");
        assert_eq!(routing_key(&announcement), "invalidate.all.rules_changed");
        let item_event = InvalidationEvent::new(
            EventId::generate(),
            EventKind::CouponsChanged,
            Platform::Pdd,
            vec![ItemId::from_u64(1)],
            3,
            Timestamp::now(),
        )
        .expect("valid event");
        assert_eq!(routing_key(&item_event), "invalidate.pdd.coupons_changed");
        assert!(
            Platform::ALL
                .iter()
                .all(|platform| platform.as_str() != EVERY_PLATFORM)
        );
    }

    #[tokio::test]
    async fn a_version_out_of_range_is_rejected_for_the_dead_letter_queue() {
        let handler = decoding(HandlerError::new("unused"));
        let text = String::from_utf8(body()).expect("utf-8");
        let oversized = text.replace("\"version\":7", "\"version\":9007199254740992");
        let outcome = handler
            .handle(QueueRole::Shared, oversized.as_bytes(), None)
            .await;
        assert!(
            matches!(&outcome, Err(DeliveryError::Reject { code, .. }) if code == "version_too_large"),
            "{outcome:?}"
        );
    }
}
