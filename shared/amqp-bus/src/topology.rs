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

    // Durable, and kept by the broker for `catch_up_window_ms` after its consumer leaves: an
    // instance that reconnects within the window finds every event it missed waiting (see
    // `broadcast_backlog`); after it, the broker deletes the queue, with a bound on what it holds
    // meanwhile (oldest dropped first).
    let broadcast_queue = settings.broadcast_queue();
    channel
        .queue_declare(
            broadcast_queue.as_str().into(),
            durable_queue,
            broadcast_arguments(settings),
        )
        .await?;
    bind_to_events(channel, settings, &broadcast_queue).await
}

fn broadcast_arguments(settings: &AmqpSettings) -> FieldTable {
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-expires".into(),
        AMQPValue::LongLongInt(i64::try_from(settings.catch_up_window_ms).unwrap_or(i64::MAX)),
    );
    arguments.insert(
        "x-max-length".into(),
        AMQPValue::LongLongInt(i64::from(settings.catch_up_max_events)),
    );
    arguments.insert(
        "x-overflow".into(),
        AMQPValue::LongString(LongString::from("drop-head")),
    );
    arguments
}

/// The broadcast queue's state before this connection declares it: `Some(messages waiting)` if
/// the broker still has it, `None` if it does not (it expired, or the broker lost it). Uses its
/// own channel: a passive declare of a missing queue closes the channel it runs on.
pub(crate) async fn broadcast_backlog(
    connection: &lapin::Connection,
    settings: &AmqpSettings,
) -> lapin::Result<Option<u32>> {
    let channel = connection.create_channel().await?;
    let passive = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    match channel
        .queue_declare(
            settings.broadcast_queue().as_str().into(),
            passive,
            FieldTable::default(),
        )
        .await
    {
        Ok(queue) => {
            let _ignored = channel.close(200, "checked".into()).await;
            Ok(Some(queue.message_count()))
        }
        Err(error) if is_not_found(&error) => Ok(None),
        Err(error) => Err(error),
    }
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

fn is_not_found(error: &lapin::Error) -> bool {
    use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
    matches!(
        error.kind(),
        lapin::ErrorKind::ProtocolError(amqp)
            if matches!(amqp.kind(), AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND))
    )
}
