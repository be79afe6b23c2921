//! The supervisor: connect, declare, consume, and reconnect with backoff until shutdown.

use std::sync::Arc;

use chrono::Utc;
use futures::StreamExt;
use lapin::options::{BasicConsumeOptions, BasicQosOptions, ConfirmSelectOptions};
use lapin::types::{FieldTable, LongString};
use lapin::{Channel, Connection, ConnectionProperties, Consumer, Event};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::consumer::{ConsumeContext, consume};
use crate::publisher::{AmqpPublisher, PublishError};
use crate::settings::SettingsError;
use crate::shared::Shared;
use crate::status::{BusStats, BusStatus};
use crate::status::{CatchUp, CatchUpOutcome};
use crate::{AmqpSettings, DeliveryHandler, QueueRole, topology};
use rebate_resilience::{Backoff, Jitter};

/// A running connection to the broker: consumes the broadcast and the shared queue, publishes with
/// confirms, and reconnects on its own. Dropping it (or cancelling the shutdown token) stops it.
pub struct AmqpBus {
    shared: Arc<Shared>,
    stop: CancellationToken,
    supervisor: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for AmqpBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpBus")
            .field("settings", &self.shared.settings)
            .field("status", &self.shared.status())
            .finish_non_exhaustive()
    }
}

impl AmqpBus {
    /// Validates the settings and spawns the supervisor on the current tokio runtime. Returns at
    /// once: the first connection is made in the background, and `status()` reports when it is up.
    ///
    /// # Errors
    /// The settings are invalid.
    pub fn start(
        settings: AmqpSettings,
        handler: Arc<dyn DeliveryHandler>,
        shutdown: CancellationToken,
    ) -> Result<Self, SettingsError> {
        settings.validate()?;
        let shared = Arc::new(Shared::new(settings));
        let stop = shutdown.child_token();
        let supervisor = tokio::spawn(supervise(Arc::clone(&shared), handler, stop.clone()));
        Ok(Self {
            shared,
            stop,
            supervisor: Some(supervisor),
        })
    }

    /// A cloneable publisher bound to this bus's connection.
    #[must_use]
    pub fn publisher(&self) -> AmqpPublisher {
        AmqpPublisher {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Shorthand for `self.publisher().publish_bytes(..)`.
    ///
    /// # Errors
    /// See [`AmqpPublisher::publish_bytes`].
    pub async fn publish_bytes(
        &self,
        routing_key: &str,
        body: &[u8],
        signature: Option<&str>,
    ) -> Result<(), PublishError> {
        self.publisher()
            .publish_bytes(routing_key, body, signature)
            .await
    }

    /// Connection state for readiness checks.
    #[must_use]
    pub fn status(&self) -> BusStatus {
        self.shared.status()
    }

    /// Whether invalidations are currently flowing (connected and consuming).
    #[must_use]
    pub fn is_ready(&self) -> bool {
        self.shared.status().connected
    }

    /// Counters since start, for metrics and the admin API.
    #[must_use]
    pub fn stats(&self) -> BusStats {
        self.shared.counters.snapshot()
    }

    /// The settings the bus runs with (names of its exchanges and queues).
    #[must_use]
    pub fn settings(&self) -> &AmqpSettings {
        &self.shared.settings
    }

    /// Stops consuming, closes the connection and waits for the supervisor to finish.
    pub async fn shutdown(mut self) {
        self.stop.cancel();
        if let Some(supervisor) = self.supervisor.take()
            && let Err(error) = supervisor.await
        {
            tracing::warn!(%error, "amqp supervisor task failed");
        }
    }
}

impl Drop for AmqpBus {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[expect(
    clippy::disallowed_methods,
    reason = "the broker expires an unused queue on its own wall clock; the time away is compared with that"
)]
async fn supervise(
    shared: Arc<Shared>,
    handler: Arc<dyn DeliveryHandler>,
    stop: CancellationToken,
) {
    let settings = &shared.settings;
    // Full jitter, so that a fleet does not reconnect in lockstep after a broker restart.
    let backoff = Backoff {
        base: std::time::Duration::from_millis(settings.reconnect_min_ms),
        max: std::time::Duration::from_millis(settings.reconnect_max_ms),
        jitter: Jitter::Full,
    };
    let mut failures: u32 = 0;
    let mut ever_connected = false;
    let mut lost_at = None;
    loop {
        let opened = tokio::select! {
            () = stop.cancelled() => break,
            opened = Session::open(settings) => opened,
        };
        match opened {
            Ok(session) => {
                failures = 0;
                if ever_connected {
                    let catch_up = catch_up(settings, session.backlog, lost_at.take());
                    if let Some(reason) = &catch_up.reason {
                        tracing::warn!(%reason, "amqp reconnected; events may have been missed");
                        handler.on_missed(reason).await;
                    } else {
                        tracing::info!(
                            backlog = catch_up.backlog,
                            "amqp reconnected; the events missed meanwhile are waiting in the broadcast queue"
                        );
                    }
                    shared.record_catch_up(catch_up);
                }
                shared.mark_connected(session.publish_channel.clone(), ever_connected);
                tracing::info!(instance = %settings.instance_id, reconnect = ever_connected, "amqp bus connected");
                ever_connected = true;
                let lost = session.run(&shared, &handler, &stop).await;
                let Some(reason) = lost else {
                    shared.mark_disconnected(None);
                    break;
                };
                tracing::warn!(%reason, "amqp connection lost; reconnecting");
                lost_at = Some(std::time::Instant::now());
                shared.mark_disconnected(Some(reason));
            }
            Err(error) => {
                failures = failures.saturating_add(1);
                tracing::warn!(%error, failures, "amqp connect failed; backing off");
                shared.mark_disconnected(Some(error));
            }
        }
        tokio::select! {
            () = stop.cancelled() => break,
            // After a lost connection (no failure yet) up to the minimum, then doubling.
            () = tokio::time::sleep(backoff.delay(failures + 1)) => {}
        }
    }
    shared.mark_disconnected(None);
}

/// What a reconnect found of the events published while this instance was away: the broadcast
/// queue's `backlog` (None: gone) against its bound.
fn catch_up(
    settings: &AmqpSettings,
    backlog: Option<u32>,
    lost_at: Option<std::time::Instant>,
) -> CatchUp {
    let reason = match backlog {
        None => Some(format!(
            "the broadcast queue was gone (unused for over catch_up_window_ms = {} ms, or lost by the broker)",
            settings.catch_up_window_ms
        )),
        Some(waiting) if waiting >= settings.catch_up_max_events => Some(format!(
            "the broadcast queue held {waiting} events, its bound (catch_up_max_events): older ones were dropped"
        )),
        Some(_) => None,
    };
    CatchUp {
        at: Utc::now(),
        disconnected_ms: lost_at.map_or(0, |lost| {
            u64::try_from(lost.elapsed().as_millis()).unwrap_or(u64::MAX)
        }),
        outcome: if reason.is_some() {
            CatchUpOutcome::DroppedL1
        } else {
            CatchUpOutcome::Replayed
        },
        backlog,
        reason,
    }
}

/// One connection with its topology declared and both consumers started.
struct Session {
    connection: Connection,
    publish_channel: Channel,
    broadcast: Consumer,
    shared_consumer: Consumer,
    /// The broadcast queue's waiting events before this connection declared it (None: gone).
    backlog: Option<u32>,
}

impl Session {
    async fn open(settings: &AmqpSettings) -> Result<Self, String> {
        let properties = ConnectionProperties::default()
            .with_connection_name(LongString::from(settings.connection_name()));
        let connection = tokio::time::timeout(
            settings.connect_timeout(),
            Connection::connect(&settings.url, properties),
        )
        .await
        .map_err(|_elapsed| format!("connect timed out after {:?}", settings.connect_timeout()))?
        .map_err(|error| format!("connect failed: {error}"))?;
        match Self::prepare(&connection, settings).await {
            Ok((backlog, publish_channel, broadcast, shared_consumer)) => Ok(Self {
                connection,
                publish_channel,
                broadcast,
                shared_consumer,
                backlog,
            }),
            Err(error) => {
                let _ignored = connection.close(200, "topology setup failed".into()).await;
                Err(format!("topology setup failed: {error}"))
            }
        }
    }

    async fn prepare(
        connection: &Connection,
        settings: &AmqpSettings,
    ) -> lapin::Result<(Option<u32>, Channel, Consumer, Consumer)> {
        let backlog = topology::broadcast_backlog(connection, settings).await?;
        let publish_channel = connection.create_channel().await?;
        topology::declare(&publish_channel, settings).await?;
        publish_channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        let broadcast = start_consumer(connection, settings, &settings.broadcast_queue()).await?;
        let shared_consumer = start_consumer(connection, settings, &settings.shared_queue).await?;
        Ok((backlog, publish_channel, broadcast, shared_consumer))
    }

    /// Runs until the connection fails (`Some(reason)`) or shutdown is requested (`None`).
    async fn run(
        self,
        shared: &Arc<Shared>,
        handler: &Arc<dyn DeliveryHandler>,
        stop: &CancellationToken,
    ) -> Option<String> {
        let settings = &shared.settings;
        let context = Arc::new(ConsumeContext {
            shared: Arc::clone(shared),
            handler: Arc::clone(handler),
            publish_channel: self.publish_channel.clone(),
        });
        let mut events = self.connection.events_listener();
        let watch_errors = async move {
            while let Some(event) = events.next().await {
                if let Event::Error(error) = event {
                    return format!("connection error: {error}");
                }
            }
            "connection closed".to_owned()
        };
        let lost = tokio::select! {
            () = stop.cancelled() => None,
            reason = consume(Arc::clone(&context), QueueRole::Broadcast, settings.broadcast_queue(), self.broadcast) => Some(reason),
            reason = consume(context, QueueRole::Shared, settings.shared_queue.clone(), self.shared_consumer) => Some(reason),
            reason = watch_errors => Some(reason),
        };
        // Closing a half-dead connection fails harmlessly; closing a live one (shutdown, or a
        // channel error) returns its unacknowledged deliveries to the queues at once.
        if let Err(error) = self.connection.close(200, "bye".into()).await {
            tracing::debug!(%error, "closing amqp connection failed");
        }
        lost
    }
}

async fn start_consumer(
    connection: &Connection,
    settings: &AmqpSettings,
    queue: &str,
) -> lapin::Result<Consumer> {
    let channel = connection.create_channel().await?;
    channel
        .basic_qos(settings.prefetch, BasicQosOptions::default())
        .await?;
    channel
        .basic_consume(
            queue.into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
}
