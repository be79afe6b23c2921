//! Applies operators' change events to this instance's caches.
//!
//! Every instance receives every event on its *broadcast* subscription and fences its own L1.
//! Exactly one instance receives each event on the *shared* subscription: it fences L2 as well
//! and re-warms the changed items so the next reader finds the new values cached. After a short
//! delay it fences its L1 once more (the classic delayed second delete, for a read that raced the
//! first); L2 needs no second pass, because its fence refuses any older version server-side.
//! Fences compare data versions, so duplicate and out-of-order events change nothing; the shared
//! path also skips event ids it has already applied.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rebate_engine::{QueryEngine, ShedLevel};
use rebate_events::{Deduplicator, EventHandler, HandlerError, InvalidationEvent};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::protection::Protection;

/// How an instance applies events.
#[derive(Debug, Clone)]
pub struct InvalidationSettings {
    /// How long a fence stands: longer than any rebuild that started before the change can take.
    pub fence_for: Duration,
    /// Delay of the second pass.
    pub second_pass_after: Duration,
    /// Deadline of each re-warm quote.
    pub rewarm_deadline: Duration,
}

#[derive(Debug)]
pub struct Invalidator {
    engine: QueryEngine,
    /// Re-warming is skipped while the service sheds load: the fence is what matters, and the
    /// next request reloads.
    protection: Arc<Protection>,
    settings: InvalidationSettings,
    applied: Deduplicator,
    /// Second passes and re-warms run here, stopped with the service.
    tasks: TaskTracker,
    shutdown: CancellationToken,
}

impl Invalidator {
    pub fn new(
        engine: QueryEngine,
        protection: Arc<Protection>,
        settings: InvalidationSettings,
        tasks: TaskTracker,
        shutdown: CancellationToken,
    ) -> Arc<Self> {
        Arc::new(Self {
            engine,
            protection,
            settings,
            applied: Deduplicator::new(100_000, Duration::from_secs(3_600)),
            tasks,
            shutdown,
        })
    }

    async fn fence(&self, event: &InvalidationEvent, through_l2: bool) -> Result<(), HandlerError> {
        for key in event.keys() {
            for part in event.affected_parts() {
                self.engine
                    .invalidate(
                        key,
                        *part,
                        event.version(),
                        self.settings.fence_for,
                        through_l2,
                    )
                    .await
                    .map_err(HandlerError::new)?;
            }
        }
        Ok(())
    }
}

#[async_trait]
impl EventHandler for Invalidator {
    async fn on_broadcast(&self, event: &InvalidationEvent) {
        if event.kind().adds_to_bloom_filter()
            && let Some(filter) = self.engine.item_filter()
        {
            for key in event.keys() {
                filter.insert(key);
            }
        }
        // L1 fences cannot fail.
        let _ = self.fence(event, false).await;
        tracing::debug!(
            event_id = event.event_id().as_str(),
            kind = event.kind().as_str(),
            "event applied to L1"
        );
    }

    async fn on_shared(&self, event: &InvalidationEvent) -> Result<(), HandlerError> {
        if !self.applied.first_time(event.event_id()) {
            return Ok(());
        }
        if let Err(error) = self.fence(event, true).await {
            // Let the redelivery try again rather than skip it as a duplicate.
            self.applied.forget(event.event_id());
            return Err(error);
        }
        let engine = self.engine.clone();
        let protection = Arc::clone(&self.protection);
        let event = event.clone();
        let settings = self.settings.clone();
        let shutdown = self.shutdown.clone();
        self.tasks.spawn(async move {
            for key in event.keys() {
                if protection.level() != ShedLevel::Normal {
                    break;
                }
                let _ = engine
                    .quote(key, Instant::now() + settings.rewarm_deadline)
                    .await;
            }
            tokio::select! {
                () = tokio::time::sleep(settings.second_pass_after) => {}
                () = shutdown.cancelled() => return,
            }
            for key in event.keys() {
                for part in event.affected_parts() {
                    // L1 only: an L1 fence cannot fail, and L2's fence already holds.
                    let _ = engine
                        .invalidate(key, *part, event.version(), settings.fence_for, false)
                        .await;
                }
            }
        });
        Ok(())
    }
}
