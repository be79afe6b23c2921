//! Against the real RabbitMQ (`AMQP_URL`, default `amqp://guest:guest@127.0.0.1:5672/%2f`).
//! Every test uses its own exchange and queue names and deletes them afterwards.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::{DeadLetter, drain_dead_letters, instance, isolated, isolated_settings};
use rebate_amqp_bus::{
    AmqpBus, AmqpSettings, DeliveryError, DeliveryHandler, PublishError, QueueRole,
};
use rebate_testkit::wait_until;
use tokio_util::sync::CancellationToken;

/// Records every call; fails according to the body.
#[derive(Default)]
struct Recorder {
    calls: Mutex<Vec<(QueueRole, String)>>,
}

impl Recorder {
    fn calls(&self) -> Vec<(QueueRole, String)> {
        self.calls.lock().unwrap().clone()
    }

    fn count(&self, role: QueueRole, body: &str) -> usize {
        self.calls()
            .iter()
            .filter(|(r, b)| *r == role && b == body)
            .count()
    }
}

#[async_trait]
impl DeliveryHandler for Recorder {
    async fn handle(
        &self,
        queue: QueueRole,
        body: &[u8],
        _signature: Option<&str>,
    ) -> Result<(), DeliveryError> {
        let text = String::from_utf8_lossy(body).into_owned();
        self.calls.lock().unwrap().push((queue, text.clone()));
        if text.starts_with("retry") {
            return Err(DeliveryError::retry("store unavailable"));
        }
        if text.starts_with("incomplete") && queue == QueueRole::Shared {
            return Err(DeliveryError::incomplete(
                "l2_fence_unapplied",
                "redis unreachable",
            ));
        }
        if text.starts_with("bad") {
            return Err(DeliveryError::reject(
                "malformed",
                "body is not an invalidation event",
            ));
        }
        Ok(())
    }
}

async fn start(settings: AmqpSettings, handler: Arc<Recorder>) -> AmqpBus {
    let bus = AmqpBus::start(settings, handler, CancellationToken::new()).expect("valid settings");
    wait_until("bus to connect", || bus.is_ready()).await;
    bus
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_instance_gets_broadcasts_and_one_instance_gets_each_shared_delivery() {
    isolated(isolated_settings("fanout"), |settings| async move {
        let recorder_a = Arc::new(Recorder::default());
        let recorder_b = Arc::new(Recorder::default());
        let bus_a = start(instance(&settings, "a"), Arc::clone(&recorder_a)).await;
        let bus_b = start(instance(&settings, "b"), Arc::clone(&recorder_b)).await;

        let bodies: Vec<String> = (0..20).map(|n| format!("event-{n}")).collect();
        for body in &bodies {
            bus_a
                .publish_bytes("invalidate.rate", body.as_bytes(), Some("sha256=00"))
                .await
                .expect("confirmed publish");
        }

        let shared_total = || {
            recorder_a
                .calls()
                .iter()
                .chain(recorder_b.calls().iter())
                .filter(|(role, _)| *role == QueueRole::Shared)
                .count()
        };
        wait_until("all deliveries", || {
            bodies.iter().all(|body| {
                recorder_a.count(QueueRole::Broadcast, body) == 1
                    && recorder_b.count(QueueRole::Broadcast, body) == 1
            }) && shared_total() >= bodies.len()
        })
        .await;
        // Give any duplicate a chance to show up before asserting exactly-once on the shared queue.
        tokio::time::sleep(Duration::from_millis(200)).await;
        for body in &bodies {
            let shared_deliveries = recorder_a.count(QueueRole::Shared, body)
                + recorder_b.count(QueueRole::Shared, body);
            assert_eq!(
                shared_deliveries, 1,
                "{body} must reach exactly one shared consumer"
            );
        }
        assert_eq!(shared_total(), bodies.len());
        assert_eq!(bus_a.stats().publish_ok, 20);
        assert_eq!(bus_a.stats().acked + bus_b.stats().acked, 60);

        bus_a.shutdown().await;
        bus_b.shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_are_bounded_and_rejects_are_dead_lettered_with_the_reason() {
    let settings = AmqpSettings {
        max_deliveries: 3,
        ..isolated_settings("deadletter")
    };
    isolated(settings, |settings| async move {
        let recorder = Arc::new(Recorder::default());
        let bus = start(settings.clone(), Arc::clone(&recorder)).await;

        bus.publish_bytes("invalidate.rate", b"retry-1", None)
            .await
            .expect("publish");
        bus.publish_bytes("invalidate.rate", b"bad-1", None)
            .await
            .expect("publish");
        bus.publish_bytes("invalidate.rate", b"good-1", None)
            .await
            .expect("publish");

        // Each message reaches both the broadcast and the shared queue, so everything happens twice.
        wait_until("dead letters", || bus.stats().dead_lettered == 4).await;
        wait_until("good message", || {
            recorder.count(QueueRole::Broadcast, "good-1") == 1
                && recorder.count(QueueRole::Shared, "good-1") == 1
        })
        .await;
        assert_eq!(
            recorder.count(QueueRole::Shared, "retry-1"),
            3,
            "max_deliveries attempts"
        );
        assert_eq!(
            recorder.count(QueueRole::Broadcast, "retry-1"),
            3,
            "max_deliveries attempts"
        );
        assert_eq!(
            recorder.count(QueueRole::Shared, "bad-1"),
            1,
            "rejects are not retried"
        );

        let stats = bus.stats();
        assert_eq!(stats.retried, 4);
        assert_eq!(stats.dead_lettered_by_code.get("malformed"), Some(&2));
        assert_eq!(
            stats
                .dead_lettered_by_code
                .get(rebate_amqp_bus::RETRIES_EXHAUSTED),
            Some(&2)
        );
        assert_eq!(stats.consumed, 2 * 3 + 2 + 2);

        // Read the dead-letter queue back.
        let dead = drain_dead_letters(&settings).await;
        let expected_bad = DeadLetter {
            body: "bad-1".to_owned(),
            reason: "body is not an invalidation event".to_owned(),
            code: "malformed".to_owned(),
            deliveries: Some(1),
            original_routing_key: "invalidate.rate".to_owned(),
        };
        let expected_retry = DeadLetter {
            body: "retry-1".to_owned(),
            reason: "store unavailable".to_owned(),
            code: "retries_exhausted".to_owned(),
            deliveries: Some(3),
            original_routing_key: "invalidate.rate".to_owned(),
        };
        assert_eq!(
            dead,
            vec![
                expected_bad.clone(),
                expected_bad,
                expected_retry.clone(),
                expected_retry
            ]
        );

        // The consumer keeps going after bad input.
        bus.publish_bytes("invalidate.rate", b"good-2", None)
            .await
            .expect("publish");
        wait_until("later good message", || {
            recorder.count(QueueRole::Shared, "good-2") == 1
        })
        .await;
        bus.shutdown().await;
    })
    .await;
}

/// An incomplete failure (effect in place, follow-up failed) is retried like any other, then
/// acknowledged and counted as abandoned: the dead-letter queue stays empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incomplete_deliveries_are_retried_then_abandoned_not_dead_lettered() {
    let settings = AmqpSettings {
        max_deliveries: 3,
        ..isolated_settings("abandon")
    };
    isolated(settings, |settings| async move {
        let recorder = Arc::new(Recorder::default());
        let bus = start(settings.clone(), Arc::clone(&recorder)).await;

        bus.publish_bytes("invalidate.rate", b"incomplete-1", None)
            .await
            .expect("publish");
        wait_until("the delivery to be abandoned", || {
            bus.stats().abandoned == 1
        })
        .await;
        bus.publish_bytes("invalidate.rate", b"marker", None)
            .await
            .expect("publish");
        // Both copies of the marker: the broadcast one may arrive after the shared one.
        wait_until("the marker", || {
            recorder.count(QueueRole::Shared, "marker") == 1
                && recorder.count(QueueRole::Broadcast, "marker") == 1
        })
        .await;
        wait_until("the marker's acks", || bus.stats().acked == 3).await;

        assert_eq!(recorder.count(QueueRole::Shared, "incomplete-1"), 3);
        assert_eq!(recorder.count(QueueRole::Broadcast, "incomplete-1"), 1);
        let stats = bus.stats();
        assert_eq!(stats.retried, 2);
        assert_eq!(stats.dead_lettered, 0);
        assert_eq!(
            stats.abandoned_by_code.get("l2_fence_unapplied"),
            Some(&1),
            "{stats:?}"
        );
        // Broadcast of both, shared of the marker; the abandoned delivery is not "accepted".
        assert_eq!(stats.acked, 3);
        assert_eq!(drain_dead_letters(&settings).await, Vec::new());
        bus.shutdown().await;
    })
    .await;
}

/// Finds our connection by its client-provided name and closes it from the server side, which
/// affects no one else's connections (unlike `rabbitmqctl stop_app`).
fn close_connection_from_broker(connection_name: &str) {
    let listing = std::process::Command::new("rabbitmqctl")
        .args([
            "list_connections",
            "-q",
            "--no-table-headers",
            "pid",
            "client_properties",
        ])
        .output()
        .expect("rabbitmqctl must be installed");
    let stdout = String::from_utf8_lossy(&listing.stdout);
    let line = stdout
        .lines()
        .find(|line| line.contains(connection_name))
        .unwrap_or_else(|| panic!("connection {connection_name} not listed:\n{stdout}"));
    let pid = line.split_whitespace().next().expect("pid column");
    let closed = std::process::Command::new("rabbitmqctl")
        .args(["close_connection", pid, "reconnect test"])
        .output()
        .expect("rabbitmqctl close_connection");
    assert!(
        closed.status.success(),
        "close_connection failed: {closed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnects_after_the_broker_drops_the_connection() {
    if !rebate_testkit::programs_available("the broker reconnect test", &["rabbitmqctl"]) {
        return;
    }
    isolated(isolated_settings("reconnect"), |settings| async move {
        let recorder = Arc::new(Recorder::default());
        let settings = instance(&settings, "r");
        let connection_name = settings.connection_name();
        let bus = Arc::new(start(settings, Arc::clone(&recorder)).await);
        assert_eq!(bus.status().reconnects, 0);
        bus.publish_bytes("invalidate.rate", b"before", None)
            .await
            .expect("publish");
        wait_until("first event", || {
            recorder.count(QueueRole::Broadcast, "before") == 1
        })
        .await;

        // Watch the status closely while the connection is closed from the broker.
        let watcher = {
            let bus = Arc::clone(&bus);
            tokio::spawn(async move {
                let mut saw_disconnected = false;
                loop {
                    let status = bus.status();
                    saw_disconnected |= !status.connected;
                    if saw_disconnected && status.connected {
                        return status;
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            })
        };
        tokio::task::spawn_blocking(move || close_connection_from_broker(&connection_name))
            .await
            .expect("rabbitmqctl task");
        let status = tokio::time::timeout(Duration::from_secs(10), watcher)
            .await
            .expect("reconnect in time")
            .expect("watcher");
        assert!(status.connected);
        assert_eq!(status.reconnects, 1);
        assert!(
            status.last_error.is_some(),
            "the outage is reported: {status:?}"
        );

        bus.publish_bytes("invalidate.rate", b"after", None)
            .await
            .expect("publish after reconnect");
        wait_until("event after reconnect", || {
            recorder.count(QueueRole::Broadcast, "after") == 1
                && recorder.count(QueueRole::Shared, "after") == 1
        })
        .await;
        Arc::into_inner(bus).expect("sole owner").shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_broker_is_reported_and_publishing_fails_fast() {
    let settings = AmqpSettings {
        url: "amqp://guest:guest@127.0.0.1:1/%2f".to_owned(),
        ..isolated_settings("unreachable")
    };
    let bus = AmqpBus::start(
        settings,
        Arc::new(Recorder::default()),
        CancellationToken::new(),
    )
    .expect("valid settings");
    wait_until("a connect error", || bus.status().last_error.is_some()).await;
    let status = bus.status();
    assert!(!status.connected);
    assert_eq!(
        bus.publish_bytes("invalidate.rate", b"x", None).await,
        Err(PublishError::Disconnected)
    );
    assert_eq!(bus.stats().publish_failed, 1);
    let printed = serde_json::to_string(&status).expect("status serializes");
    assert!(printed.contains("\"connected\":false"), "{printed}");
    bus.shutdown().await;
}
