//! Helpers shared by the integration tests: unique names, cleanup, polling.
#![allow(dead_code)] // each test binary uses a different subset

use std::future::Future;
use std::time::Duration;

use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
use lapin::{Connection, ConnectionProperties};
use rebate_amqp_bus::AmqpSettings;

pub(crate) const TEST_TIMEOUT: Duration = Duration::from_secs(20);

pub(crate) fn broker_url() -> String {
    std::env::var("AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

pub(crate) fn unique(label: &str) -> String {
    format!("test.{label}.{:08x}", rebate_testkit::unique_suffix())
}

/// Settings whose every name is unique to one test.
pub(crate) fn isolated_settings(label: &str) -> AmqpSettings {
    let base = unique(label);
    AmqpSettings {
        url: broker_url(),
        exchange: format!("{base}.events"),
        shared_queue: format!("{base}.shared"),
        broadcast_queue_prefix: format!("{base}.instance."),
        dead_letter_exchange: format!("{base}.dlx"),
        dead_letter_queue: format!("{base}.dead"),
        instance_id: "a".to_owned(),
        retry_delay_ms: 20,
        reconnect_min_ms: 50,
        reconnect_max_ms: 500,
        ..AmqpSettings::default()
    }
}

pub(crate) fn instance(settings: &AmqpSettings, id: &str) -> AmqpSettings {
    AmqpSettings {
        instance_id: format!("{id}-{:08x}", rand::random::<u32>()),
        ..settings.clone()
    }
}

pub(crate) async fn raw_connection() -> Connection {
    Connection::connect(&broker_url(), ConnectionProperties::default())
        .await
        .expect("RabbitMQ must be running on AMQP_URL")
}

/// Runs `body` with a time limit, then deletes the test's topology even if `body` panicked.
pub(crate) async fn isolated<F, Fut>(settings: AmqpSettings, body: F)
where
    F: FnOnce(AmqpSettings) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let outcome = tokio::spawn(tokio::time::timeout(TEST_TIMEOUT, body(settings.clone()))).await;
    let connection = raw_connection().await;
    let channel = connection.create_channel().await.expect("channel");
    for queue in [&settings.shared_queue, &settings.dead_letter_queue] {
        let _ignored = channel
            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    for exchange in [&settings.exchange, &settings.dead_letter_exchange] {
        let _ignored = channel
            .exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
            .await;
    }
    let _ignored = connection.close(200, "cleanup".into()).await;
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(_elapsed)) => panic!("test took longer than {TEST_TIMEOUT:?}"),
        Err(join_error) => std::panic::resume_unwind(join_error.into_panic()),
    }
}

/// One message read back from the dead-letter queue.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct DeadLetter {
    pub body: String,
    pub reason: String,
    pub code: String,
    pub deliveries: Option<u64>,
    pub original_routing_key: String,
}

/// Empties the dead-letter queue with `basic_get`, sorted for stable comparisons.
pub(crate) async fn drain_dead_letters(settings: &AmqpSettings) -> Vec<DeadLetter> {
    use lapin::options::BasicGetOptions;
    use rebate_amqp_bus::headers;

    let connection = raw_connection().await;
    let channel = connection.create_channel().await.expect("channel");
    let mut dead = Vec::new();
    while let Some(message) = channel
        .basic_get(
            settings.dead_letter_queue.as_str().into(),
            BasicGetOptions { no_ack: true },
        )
        .await
        .expect("basic_get")
    {
        let message_headers = message
            .delivery
            .properties
            .headers()
            .clone()
            .unwrap_or_default();
        dead.push(DeadLetter {
            body: String::from_utf8_lossy(&message.delivery.data).into_owned(),
            reason: headers::text(&message_headers, headers::DEATH_REASON).unwrap_or_default(),
            code: headers::text(&message_headers, headers::DEATH_CODE).unwrap_or_default(),
            deliveries: headers::count(&message_headers, headers::DELIVERIES),
            original_routing_key: headers::text(&message_headers, headers::ORIGINAL_ROUTING_KEY)
                .unwrap_or_default(),
        });
    }
    let _ignored = connection.close(200, "done".into()).await;
    dead.sort();
    dead
}
