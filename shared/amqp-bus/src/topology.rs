//! Exchanges, queues and bindings, declared idempotently on every (re)connect.

use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{Channel, ExchangeKind};

use crate::AmqpSettings;

/// Declares the whole topology. Re-declaring with identical arguments is a no-op on the broker,
/// so this runs after every reconnect (a restarted broker may have lost nothing, or everything).
///
/// The shared queue is a *classic* durable queue: the broker here is a single node, where a quorum
/// queue buys no extra safety, and our own `x-deliveries` header bounds redelivery on any queue type.
pub(crate) async fn declare(channel: &Channel, settings: &AmqpSettings) -> lapin::Result<()> {
    let durable_exchange = ExchangeDeclareOptions {
        durable: true,
        ..ExchangeDeclareOptions::default()
    };
    channel
        .exchange_declare(
            settings.exchange.as_str().into(),
            ExchangeKind::Topic,
            durable_exchange,
            FieldTable::default(),
        )
        .await?;
    channel
        .exchange_declare(
            settings.dead_letter_exchange.as_str().into(),
            ExchangeKind::Fanout,
            durable_exchange,
            FieldTable::default(),
        )
        .await?;

    let durable_queue = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(
            settings.dead_letter_queue.as_str().into(),
            durable_queue,
            FieldTable::default(),
        )
        .await?;
    channel
        .queue_bind(
            settings.dead_letter_queue.as_str().into(),
            settings.dead_letter_exchange.as_str().into(),
            "".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;

    // Safety net: anything the broker itself dead-letters (a reject without requeue, an operator
    // policy) also ends up in the dead-letter queue rather than vanishing.
    let mut shared_arguments = FieldTable::default();
    shared_arguments.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString(LongString::from(settings.dead_letter_exchange.as_str())),
    );
    channel
        .queue_declare(
            settings.shared_queue.as_str().into(),
            durable_queue,
            shared_arguments,
        )
        .await?;
    bind_to_events(channel, settings, &settings.shared_queue).await?;

    // Exclusive + auto-delete: the queue lives exactly as long as this connection. Events missed
    // while disconnected are not needed: the L1 TTL bounds staleness meanwhile.
    let broadcast_options = QueueDeclareOptions {
        exclusive: true,
        auto_delete: true,
        ..QueueDeclareOptions::default()
    };
    let broadcast_queue = settings.broadcast_queue();
    channel
        .queue_declare(
            broadcast_queue.as_str().into(),
            broadcast_options,
            FieldTable::default(),
        )
        .await?;
    bind_to_events(channel, settings, &broadcast_queue).await
}

async fn bind_to_events(
    channel: &Channel,
    settings: &AmqpSettings,
    queue: &str,
) -> lapin::Result<()> {
    channel
        .queue_bind(
            queue.into(),
            settings.exchange.as_str().into(),
            settings.binding_key.as_str().into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
}
