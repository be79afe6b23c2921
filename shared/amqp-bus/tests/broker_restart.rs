//! The broker itself restarts (`rabbitmqctl stop_app` / `start_app`) under a running bus: it
//! reports the outage, reconnects on its own, and events published afterwards are consumed.
//!
//! This is the only test in its binary on purpose: cargo runs test binaries one after another,
//! so stopping the broker here cannot disturb the other tests of the workspace.

mod common;

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::{isolated, isolated_settings};
use rebate_amqp_bus::{AmqpBus, DeliveryError, DeliveryHandler, QueueRole};
use rebate_testkit::wait_until;
use tokio_util::sync::CancellationToken;

#[derive(Default)]
struct Recorder {
    shared: Mutex<Vec<String>>,
}

#[async_trait]
impl DeliveryHandler for Recorder {
    async fn handle(
        &self,
        queue: QueueRole,
        body: &[u8],
        _signature: Option<&str>,
    ) -> Result<(), DeliveryError> {
        if queue == QueueRole::Shared {
            self.shared
                .lock()
                .unwrap()
                .push(String::from_utf8_lossy(body).into_owned());
        }
        Ok(())
    }
}

fn rabbitmqctl(args: &[&str]) {
    let status = Command::new("rabbitmqctl")
        .args(args)
        .status()
        .expect("rabbitmqctl is installed with the broker");
    assert!(status.success(), "rabbitmqctl {args:?} failed");
}

/// Waits up to 60 s (the broker may take a while to come back); polls every 100 ms.
async fn within_a_minute(what: &str, mut condition: impl FnMut() -> bool) {
    for _ in 0..600 {
        if condition() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test]
async fn the_bus_survives_a_broker_restart() {
    if !rebate_testkit::programs_available("the broker restart test", &["rabbitmqctl"]) {
        return;
    }
    let settings = isolated_settings("restart");
    // `isolated` bounds the body at 20 s; a broker restart can take longer, so the body runs
    // here and only the clean-up goes through it.
    let recorder = Arc::new(Recorder::default());
    let bus = AmqpBus::start(settings.clone(), recorder.clone(), CancellationToken::new())
        .expect("valid settings");
    wait_until("bus to connect", || bus.is_ready()).await;
    bus.publish_bytes("invalidate.before", b"before", None)
        .await
        .expect("published before the restart");
    wait_until("the first event", || {
        recorder.shared.lock().unwrap().len() == 1
    })
    .await;

    rabbitmqctl(&["stop_app"]);
    within_a_minute("the bus to notice the outage", || !bus.is_ready()).await;
    assert!(
        bus.publish_bytes("invalidate.during", b"during", None)
            .await
            .is_err()
    );
    rabbitmqctl(&["start_app"]);
    rabbitmqctl(&["await_startup"]);
    within_a_minute("the bus to reconnect", || bus.is_ready()).await;
    assert!(bus.status().reconnects >= 1, "{:?}", bus.status());

    bus.publish_bytes("invalidate.after", b"after", None)
        .await
        .expect("published after the restart");
    within_a_minute("the event after the restart", || {
        recorder
            .shared
            .lock()
            .unwrap()
            .iter()
            .any(|body| body == "after")
    })
    .await;
    bus.shutdown().await;
    isolated(settings, |_| async {}).await;
}
