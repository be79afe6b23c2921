//! The `rebate-events` adapter against the real RabbitMQ: signed events are applied; malformed
//! and unsigned ones are dead-lettered with the contract's reason and code, and counted; a rules
//! announcement reaches every instance.

mod common;

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use common::{drain_dead_letters, instance, isolated, isolated_settings};
use rebate_amqp_bus::AmqpBus;
use rebate_amqp_bus::events::{AmqpEventPublisher, DecodingHandler, routing_key};
use rebate_domain::{ItemId, Platform, Timestamp};
use rebate_events::{
    EventHandler, EventId, EventKind, EventPublisher, HandlerError, InvalidationEvent, SigningKey,
    ValidationPolicy, encode_event, sign,
};
use rebate_testkit::wait_until;
use tokio_util::sync::CancellationToken;

#[derive(Default)]
struct Applied {
    broadcast: Mutex<Vec<u64>>,
    shared: Mutex<Vec<u64>>,
    /// The kinds of the broadcast deliveries, in order.
    broadcast_kinds: Mutex<Vec<EventKind>>,
}

#[async_trait]
impl EventHandler for Applied {
    async fn on_broadcast(&self, event: &InvalidationEvent) {
        self.broadcast.lock().unwrap().push(event.version());
        self.broadcast_kinds.lock().unwrap().push(event.kind());
    }

    async fn on_shared(&self, event: &InvalidationEvent) -> Result<(), HandlerError> {
        self.shared.lock().unwrap().push(event.version());
        Ok(())
    }
}

fn event(version: u64) -> InvalidationEvent {
    InvalidationEvent::new(
        EventId::generate(),
        EventKind::RateChanged,
        Platform::Taobao,
        vec![ItemId::parse("1234567").expect("item id")],
        version,
        Timestamp::now(),
    )
    .expect("valid event")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_events_apply_and_bad_ones_are_dead_lettered_with_the_reason() {
    isolated(isolated_settings("events"), |settings| async move {
        let key = SigningKey::new("0123456789abcdef0123").expect("key");
        let policy = ValidationPolicy::production(
            key.clone(),
            std::time::Duration::from_secs(300),
            Timestamp::now(),
        );
        let applied = Arc::new(Applied::default());
        let handler = Arc::new(DecodingHandler::new(
            Arc::clone(&applied) as Arc<dyn EventHandler>,
            policy,
        ));
        let bus = AmqpBus::start(instance(&settings, "e"), handler, CancellationToken::new())
            .expect("settings");
        wait_until("bus to connect", || bus.is_ready()).await;
        let junk_signature = sign(b"{not json", &key);
        let publisher = AmqpEventPublisher::new(bus.publisher(), Some(key));

        publisher.publish(&event(1)).await.expect("publish signed");
        let unsigned = event(2);
        bus.publish_bytes(&routing_key(&unsigned), &encode_event(&unsigned), None)
            .await
            .expect("publish unsigned");
        bus.publish_bytes(
            "invalidate.taobao.rate_changed",
            b"{not json",
            Some(&junk_signature),
        )
        .await
        .expect("publish junk");
        publisher.publish(&event(3)).await.expect("publish signed");

        wait_until("signed events applied", || {
            *applied.broadcast.lock().unwrap() == [1, 3]
                && *applied.shared.lock().unwrap() == [1, 3]
        })
        .await;
        wait_until("bad events dead-lettered", || {
            bus.stats().dead_lettered == 4
        })
        .await;

        let stats = bus.stats();
        assert_eq!(
            stats.dead_lettered_by_code.get("signature_missing"),
            Some(&2),
            "{stats:?}"
        );
        assert_eq!(
            stats.dead_lettered_by_code.values().sum::<u64>(),
            4,
            "{stats:?}"
        );
        let dead = drain_dead_letters(&settings).await;
        assert_eq!(dead.len(), 4);
        let unsigned_dead: Vec<_> = dead
            .iter()
            .filter(|letter| letter.code == "signature_missing")
            .collect();
        assert_eq!(unsigned_dead.len(), 2);
        assert!(
            unsigned_dead
                .iter()
                .all(|letter| letter.reason == "signature missing")
        );
        assert!(
            unsigned_dead
                .iter()
                .all(|letter| letter.original_routing_key == "invalidate.taobao.rate_changed")
        );
        // Correctly signed but not JSON: rejected by the decoder, with its position in the reason.
        let junk: Vec<_> = dead
            .iter()
            .filter(|letter| letter.body == "{not json")
            .collect();
        assert_eq!(junk.len(), 2);
        assert!(
            junk.iter().all(|letter| letter.code == "malformed_json"),
            "{junk:?}"
        );
        assert!(
            junk.iter()
                .all(|letter| letter.reason.starts_with("malformed JSON at line 1")),
            "{junk:?}"
        );
        assert_eq!(
            stats.dead_lettered_by_code.get("malformed_json"),
            Some(&2),
            "{stats:?}"
        );
        bus.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rules_announcement_reaches_every_instance_and_one_naming_items_is_dead_lettered() {
    isolated(isolated_settings("rules"), |settings| async move {
        let key = SigningKey::new("0123456789abcdef0123").expect("key");
        let policy = ValidationPolicy::production(
            key.clone(),
            std::time::Duration::from_secs(300),
            Timestamp::now(),
        );
        let mut instances = Vec::new();
        for id in ["a", "b"] {
            let applied = Arc::new(Applied::default());
            let handler = Arc::new(DecodingHandler::new(
                Arc::clone(&applied) as Arc<dyn EventHandler>,
                policy.clone(),
            ));
            let bus = AmqpBus::start(instance(&settings, id), handler, CancellationToken::new())
                .expect("settings");
            wait_until("bus to connect", || bus.is_ready()).await;
            instances.push((bus, applied));
        }
        let publisher = AmqpEventPublisher::new(instances[0].0.publisher(), Some(key.clone()));

        let announcement =
            InvalidationEvent::rules_changed(EventId::generate(), 12, Timestamp::now())
                .expect("valid announcement");
        publisher
            .publish(&announcement)
            .await
            .expect("publish the announcement");
        // Correctly signed, but naming items: refused by the decoder on both queues it reaches.
        let body = String::from_utf8(encode_event(&announcement))
            .expect("utf-8")
            .replace(r#""version""#, r#""item_ids":["1"],"version""#);
        instances[0]
            .0
            .publish_bytes(
                &routing_key(&announcement),
                body.as_bytes(),
                Some(&sign(body.as_bytes(), &key)),
            )
            .await
            .expect("publish the announcement with items");

        wait_until("the announcement reached every instance", || {
            instances.iter().all(|(_, applied)| {
                *applied.broadcast_kinds.lock().unwrap() == [EventKind::RulesChanged]
                    && *applied.broadcast.lock().unwrap() == [12]
            })
        })
        .await;
        let dead_lettered = || {
            instances
                .iter()
                .map(|(bus, _)| bus.stats().dead_lettered)
                .sum::<u64>()
        };
        wait_until("the announcement with items dead-lettered", || {
            dead_lettered() == 3
        })
        .await;
        let shared: Vec<u64> = instances
            .iter()
            .flat_map(|(_, applied)| applied.shared.lock().unwrap().clone())
            .collect();
        assert_eq!(shared, [12], "one instance took the shared delivery");

        let dead = drain_dead_letters(&settings).await;
        assert_eq!(dead.len(), 3, "{dead:?}");
        for letter in &dead {
            assert_eq!(letter.code, "field_not_allowed", "{letter:?}");
            assert_eq!(
                letter.reason,
                "`item_ids` is not allowed on a rules_changed event: it names no items"
            );
            assert_eq!(letter.original_routing_key, "invalidate.all.rules_changed");
        }
        for (bus, _) in instances {
            bus.shutdown().await;
        }
    })
    .await;
}
