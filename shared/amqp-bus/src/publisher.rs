//! Publishing with broker confirms.

use std::sync::Arc;
use std::time::Duration;

use lapin::options::BasicPublishOptions;
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Confirmation};

use crate::headers;
use crate::shared::Shared;
use crate::status::bump;

/// Why a publish did not reach the broker; callers (admin endpoint, CLI) report it and may retry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublishError {
    /// No live connection right now (the supervisor is reconnecting).
    #[error("not connected to the message broker")]
    Disconnected,
    /// AMQP limits routing keys to 255 bytes.
    #[error("routing key is longer than 255 bytes")]
    RoutingKeyTooLong,
    /// The broker or the client library reported an error.
    #[error("message broker error: {0}")]
    Broker(String),
    /// The broker refused to take responsibility for the message.
    #[error("message broker refused the message")]
    Nacked,
    /// No confirm arrived in time; the message may or may not have been stored.
    #[error("no publisher confirm within {0:?}")]
    ConfirmTimeout(Duration),
}

/// Cheap, cloneable handle for publishing events while the bus is connected.
#[derive(Clone)]
pub struct AmqpPublisher {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for AmqpPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpPublisher")
            .field("exchange", &self.shared.settings.exchange)
            .finish()
    }
}

impl AmqpPublisher {
    /// Publishes `body` (persistent, `application/json`) to the events exchange and waits for the
    /// broker's confirm, so success means the event is stored in every bound queue.
    ///
    /// # Errors
    /// [`PublishError::Disconnected`] while the bus is reconnecting; otherwise the broker's answer.
    pub async fn publish_bytes(
        &self,
        routing_key: &str,
        body: &[u8],
        signature: Option<&str>,
    ) -> Result<(), PublishError> {
        let result = self.try_publish(routing_key, body, signature).await;
        match &result {
            Ok(()) => bump(&self.shared.counters.publish_ok),
            Err(_) => bump(&self.shared.counters.publish_failed),
        }
        result
    }

    async fn try_publish(
        &self,
        routing_key: &str,
        body: &[u8],
        signature: Option<&str>,
    ) -> Result<(), PublishError> {
        if routing_key.len() > 255 {
            return Err(PublishError::RoutingKeyTooLong);
        }
        let channel = self
            .shared
            .publish_channel()
            .ok_or(PublishError::Disconnected)?;
        let mut message_headers = FieldTable::default();
        if let Some(signature) = signature {
            message_headers.insert(
                headers::SIGNATURE.into(),
                AMQPValue::LongString(LongString::from(signature)),
            );
        }
        let properties = persistent_json().with_headers(message_headers);
        publish_confirmed(
            &channel,
            &self.shared.settings.exchange,
            routing_key,
            body,
            properties,
            self.shared.settings.publish_timeout(),
        )
        .await
    }
}

pub(crate) fn persistent_json() -> BasicProperties {
    BasicProperties::default()
        .with_content_type("application/json".into())
        .with_delivery_mode(2)
}

/// Publishes on a confirm-mode channel and waits (bounded) for the broker's ack.
pub(crate) async fn publish_confirmed(
    channel: &Channel,
    exchange: &str,
    routing_key: &str,
    body: &[u8],
    properties: BasicProperties,
    timeout: Duration,
) -> Result<(), PublishError> {
    let publish = async {
        let confirm = channel
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                BasicPublishOptions::default(),
                body,
                properties,
            )
            .await
            .map_err(|error| PublishError::Broker(error.to_string()))?;
        let confirmation = confirm
            .await
            .map_err(|error| PublishError::Broker(error.to_string()))?;
        match confirmation {
            Confirmation::Ack(_) => Ok(()),
            Confirmation::Nack(_) => Err(PublishError::Nacked),
            Confirmation::NotRequested => Err(PublishError::Broker(
                "channel is not in confirm mode".to_owned(),
            )),
        }
    };
    tokio::time::timeout(timeout, publish)
        .await
        .unwrap_or(Err(PublishError::ConfirmTimeout(timeout)))
}
