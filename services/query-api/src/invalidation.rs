//! Applies operators' change events to this instance's caches.
//!
//! Every instance receives every event on its *broadcast* subscription and fences its own L1.
//! Exactly one instance receives each event on the *shared* subscription: it fences L2 as well
//! and re-warms the changed items so the next reader finds the new values cached. Each fence is
//! in its part's own version space ([`InvalidationEvent::fences`]). Fences compare data
//! versions, so duplicate and out-of-order events change nothing; the shared path also skips
//! event ids it has already applied.
//!
//! # No delayed second pass
//! The classic "delete, then delete again a moment later" closes the race of a rebuild that read
//! the old row before the change and writes after the delete. A fence closes it for good: that
//! rebuild's value carries the old version, and both L1 and L2 refuse any version below the
//! fence for as long as it stands (`fence_secs`, longer than any rebuild), whenever it arrives.
//!
//! # When the shared step fails
//! The shared handler can fail only on the L2 fence (L1 fences cannot fail), i.e. when Redis is
//! unreachable or slower than its command timeout. By then the event's essential effect is in
//! place: every connected instance fenced its L1 from its own broadcast delivery, so no instance
//! serves a cached value older than the event from L1. The failure is therefore reported as
//! [`HandlerError::incomplete`] with code [`L2_FENCE_UNAPPLIED`]: the bus retries it with its
//! back-off (long enough for a short Redis outage), and if Redis stays down for the whole window
//! the event is acknowledged and counted as abandoned instead of dead-lettered. What is then
//! missing is only the L2 tombstone: the old L2 copy (if any) can still be read until it expires
//! (`l2_fresh_secs`) or a newer event fences it, which the abandonment log line says. When Redis
//! answers but already holds a newer or equal version, the fence counts as applied (the
//! server-side fence refuses the older write) and the event is acknowledged.
//!
//! # Rules announcements
//! A `rules_changed` event names no item and touches no cache: its broadcast delivery publishes
//! its version on [`Invalidator::rules_announcements`] (the highest seen, never lowered), so that
//! the live-rules reader re-reads the store at once instead of at its next poll; its shared
//! delivery has nothing to do and succeeds at once. An announcement this instance misses (a
//! broker outage) is caught by that poll.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rebate_domain::Timestamp;
use rebate_engine::{QueryEngine, ShedLevel};
use rebate_events::{Deduplicator, EventHandler, HandlerError, InvalidationEvent};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::consistency::ConsistencyObserver;
use crate::protection::Protection;

/// The code of an event whose L1 fences hold but whose L2 fence could not be written.
pub const L2_FENCE_UNAPPLIED: &str = "l2_fence_unapplied";

/// How an instance applies events.
#[derive(Debug, Clone)]
pub struct InvalidationConfig {
    /// How long a fence stands: longer than any rebuild that started before the change can take.
    pub fence_for: Duration,
    /// Deadline of each re-warm quote.
    pub rewarm_deadline: Duration,
}

#[derive(Debug)]
pub struct Invalidator {
    engine: QueryEngine,
    /// Re-warming is skipped while the service sheds load: the fence is what matters, and the
    /// next request reloads.
    protection: Arc<Protection>,
    /// Checks, after its windows, that each applied event holds (None: not observed).
    consistency: Option<Arc<ConsistencyObserver>>,
    settings: InvalidationConfig,
    applied: Deduplicator,
    /// The highest live-rules version announced on the bus (0: none yet), for the rules reader
    /// to wake on rather than wait for its next poll.
    rules_announcements: watch::Sender<u64>,
    /// Re-warms run here, stopped with the service.
    tasks: TaskTracker,
    shutdown: CancellationToken,
}

impl Invalidator {
    pub fn new(
        engine: QueryEngine,
        protection: Arc<Protection>,
        consistency: Option<Arc<ConsistencyObserver>>,
        settings: InvalidationConfig,
        tasks: TaskTracker,
        shutdown: CancellationToken,
    ) -> Arc<Self> {
        Arc::new(Self {
            engine,
            protection,
            consistency,
            settings,
            applied: Deduplicator::new(100_000, Duration::from_secs(3_600)),
            rules_announcements: watch::Sender::new(0),
            tasks,
            shutdown,
        })
    }

    /// The highest live-rules version announced by a `rules_changed` event since start (0 until
    /// the first); it changes only upwards. Each call gives a new receiver.
    pub fn rules_announcements(&self) -> watch::Receiver<u64> {
        self.rules_announcements.subscribe()
    }

    /// Publishes an announced rule set version unless a version at least as high was seen.
    fn announce_rules(&self, version: u64) {
        let raised = self.rules_announcements.send_if_modified(|highest| {
            let newer = version > *highest;
            if newer {
                *highest = version;
            }
            newer
        });
        tracing::debug!(version, raised, "live-rules change announced");
    }

    /// Fences every affected part of every item: L1 always, L2 too when `through_l2`. Stops at
    /// the first L2 failure (the rest would wait out the same timeout); only L2 can fail.
    async fn fence(&self, event: &InvalidationEvent, through_l2: bool) -> Result<(), HandlerError> {
        let applied_at = Timestamp::now();
        for key in event.keys() {
            for fence in event.fences(applied_at) {
                self.engine
                    .invalidate(
                        key,
                        fence.part,
                        fence.version,
                        self.settings.fence_for,
                        through_l2,
                    )
                    .await
                    .map_err(|error| {
                        HandlerError::incomplete(
                            L2_FENCE_UNAPPLIED,
                            format!(
                                "L2 fence of {key} {} at version {} not written (L1 is fenced): {error}",
                                fence.part.as_str(),
                                fence.version
                            ),
                        )
                    })?;
            }
        }
        Ok(())
    }
}

#[async_trait]
impl EventHandler for Invalidator {
    async fn on_broadcast(&self, event: &InvalidationEvent) {
        if !event.kind().names_items() {
            self.announce_rules(event.version());
            return;
        }
        if event.kind().adds_to_bloom_filter()
            && let Some(filter) = self.engine.item_filter()
        {
            for key in event.keys() {
                filter.insert(key);
            }
        }
        // L1 fences cannot fail.
        let _ = self.fence(event, false).await;
        if let Some(observer) = &self.consistency {
            observer.observe(event);
        }
        tracing::debug!(
            event_id = event.event_id().as_str(),
            kind = event.kind().as_str(),
            "event applied to L1"
        );
    }

    /// Events this instance missed cannot be known one by one: its L1 and kept renderings go
    /// whole, the next reads come from L2 (which the shared deliveries kept fenced) or the
    /// store, and the Bloom filter is rebuilt from the store at once.
    async fn on_events_missed(&self, reason: &str) {
        self.engine.forget_l1();
        // Missed `item_created` keys are known only to the store.
        if let Some(filter) = self.engine.item_filter() {
            filter.request_rebuild();
        }
        tracing::warn!(
            reason,
            "invalidation events may have been missed: L1 dropped"
        );
    }

    async fn on_shared(&self, event: &InvalidationEvent) -> Result<(), HandlerError> {
        // A rules announcement touches no shared tier: its broadcast delivery did all there is.
        if !event.kind().names_items() {
            return Ok(());
        }
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
        let deadline = self.settings.rewarm_deadline;
        let shutdown = self.shutdown.clone();
        self.tasks.spawn(async move {
            for key in event.keys() {
                if protection.level() != ShedLevel::Normal || shutdown.is_cancelled() {
                    break;
                }
                let _ = engine.quote(key, Instant::now() + deadline).await;
            }
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use rebate_cache::{
        Jitter, L2Config, LoadFailure, Loaded, Loader, ManualClock, MemoryTier, PartCache,
        PartCacheConfig, SharedTier, TierKey, TtlPolicy,
    };
    use rebate_domain::{ItemId, ItemKey, PartKind, Platform};
    use rebate_engine::{EngineParts, PartTimeouts};
    use rebate_events::{BusConfig, EventId, EventKind, EventPublisher, InProcessBus};
    use rebate_resilience::ManualTicker;

    use super::*;

    /// Every item exists with nothing in it; what matters here is the fences.
    #[derive(Debug)]
    struct Empty;

    #[async_trait]
    impl<T: Send + Sync + 'static> Loader<T> for Empty {
        async fn load(&self, _key: ItemKey) -> Result<Loaded<T>, LoadFailure> {
            Ok(Loaded {
                value: None,
                version: 1,
            })
        }
    }

    fn part<T>(kind: PartKind, tier: &Arc<MemoryTier>, clock: &ManualClock) -> PartCache<T>
    where
        T: serde::Serialize + serde::de::DeserializeOwned + Send + Sync + 'static,
    {
        let ttl = TtlPolicy {
            fresh: Duration::from_secs(60),
            jitter: Jitter::Ratio(0.0),
            stale: Duration::from_secs(60),
            not_found: Duration::from_secs(60),
        };
        PartCache::with_shared_tier(
            PartCacheConfig {
                name: kind.as_str(),
                part: kind,
                max_entries: 100,
                ttl,
                load_timeout: Duration::from_secs(1),
                refresh_lead: Duration::ZERO,
                max_version_gap: 1_000_000,
            },
            L2Config {
                tier: Arc::clone(tier) as Arc<dyn SharedTier>,
                ttl,
                lease_ttl: Duration::from_secs(1),
                lease_wait: Duration::from_millis(10),
                lease_poll: Duration::from_millis(5),
            },
            Arc::new(Empty),
            Arc::new(clock.clone()),
        )
    }

    fn invalidator(tier: &Arc<MemoryTier>) -> Arc<Invalidator> {
        let clock = ManualClock::starting_now();
        let parts = EngineParts {
            product: part(PartKind::Product, tier, &clock),
            rate: part(PartKind::Rate, tier, &clock),
            coupons: part(PartKind::Coupons, tier, &clock),
            extras: part(PartKind::Extras, tier, &clock),
        };
        let timeouts = PartTimeouts {
            product: Duration::from_secs(1),
            rate: Duration::from_secs(1),
            coupons: Duration::from_secs(1),
            extras: Duration::from_secs(1),
        };
        let engine = QueryEngine::new(parts, timeouts, Arc::new(clock));
        let protection = Arc::new(Protection::for_tests(Arc::new(ManualTicker::new())));
        Invalidator::new(
            engine,
            protection,
            None,
            InvalidationConfig {
                fence_for: Duration::from_secs(60),
                rewarm_deadline: Duration::from_secs(1),
            },
            TaskTracker::new(),
            CancellationToken::new(),
        )
    }

    fn rate_changed(id: &str, version: u64) -> InvalidationEvent {
        InvalidationEvent::new(
            EventId::parse(id).expect("valid id"),
            EventKind::RateChanged,
            Platform::Jd,
            vec![ItemId::from_u64(100_077)],
            version,
            Timestamp::now(),
        )
        .expect("valid event")
    }

    fn rate_key() -> TierKey {
        TierKey {
            item: ItemKey::new(Platform::Jd, ItemId::from_u64(100_077)),
            part: PartKind::Rate,
        }
    }

    #[tokio::test]
    async fn an_unwritable_l2_fence_is_incomplete_not_a_plain_failure() {
        let tier = Arc::new(MemoryTier::new());
        let invalidator = invalidator(&tier);
        let event = rate_changed("evt-redis-down", 4);
        tier.set_failing(true);

        let error = invalidator.on_shared(&event).await.expect_err("L2 is down");
        assert_eq!(error.incomplete_code(), Some(L2_FENCE_UNAPPLIED));
        assert!(error.to_string().contains("at version 4"), "{error}");
        // This instance's L1 is fenced all the same.
        let fenced = invalidator
            .engine
            .parts()
            .rate
            .peek(&rate_key().item)
            .expect("an L1 fence");
        assert!(fenced.tombstone);
        assert_eq!(fenced.version, 4);

        // The redelivery, once Redis is back, writes the L2 fence and succeeds.
        tier.set_failing(false);
        invalidator.on_shared(&event).await.expect("applied");
        assert_eq!(tier.version_of(rate_key()), Some(4));
    }

    #[tokio::test]
    async fn an_l2_fence_already_held_by_a_newer_version_counts_as_applied() {
        let tier = Arc::new(MemoryTier::new());
        let invalidator = invalidator(&tier);
        invalidator
            .on_shared(&rate_changed("evt-newer", 9))
            .await
            .expect("applied");
        invalidator
            .on_shared(&rate_changed("evt-older", 5))
            .await
            .expect("an older event is already covered by the newer fence");
        assert_eq!(tier.version_of(rate_key()), Some(9));
    }

    fn rules_changed(id: &str, version: u64) -> InvalidationEvent {
        InvalidationEvent::rules_changed(
            EventId::parse(id).expect("valid id"),
            version,
            Timestamp::now(),
        )
        .expect("valid announcement")
    }

    #[tokio::test]
    async fn a_rules_announcement_reaches_every_instance_on_the_in_process_bus() {
        let tier = Arc::new(MemoryTier::new());
        let shutdown = CancellationToken::new();
        let bus = InProcessBus::start(BusConfig::default(), shutdown.clone());
        let instances: Vec<Arc<Invalidator>> = (0..3).map(|_| invalidator(&tier)).collect();
        let _subscriptions: Vec<_> = instances
            .iter()
            .map(|instance| bus.subscribe(Arc::clone(instance) as Arc<dyn EventHandler>))
            .collect();
        let mut receivers: Vec<_> = instances
            .iter()
            .map(|instance| instance.rules_announcements())
            .collect();
        assert!(receivers.iter().all(|receiver| *receiver.borrow() == 0));

        bus.publish(&rules_changed("rules-5", 5))
            .await
            .expect("queued");
        bus.settled().await;
        for receiver in &mut receivers {
            assert!(receiver.has_changed().expect("sender alive"));
            assert_eq!(*receiver.borrow_and_update(), 5);
        }
        let stats = bus.stats();
        assert_eq!(stats.delivered_broadcast, 3);
        assert_eq!(
            stats.delivered_shared, 1,
            "the shared delivery succeeds at once"
        );
        assert!(bus.dead_letters().is_empty(), "{:?}", bus.dead_letters());

        // A late, older announcement changes nothing; a newer one is seen.
        bus.publish(&rules_changed("rules-3", 3))
            .await
            .expect("queued");
        bus.settled().await;
        for receiver in &mut receivers {
            assert!(!receiver.has_changed().expect("sender alive"));
            assert_eq!(*receiver.borrow(), 5);
        }
        bus.publish(&rules_changed("rules-8", 8))
            .await
            .expect("queued");
        bus.settled().await;
        for receiver in &mut receivers {
            assert_eq!(*receiver.borrow_and_update(), 8);
        }
        shutdown.cancel();
    }

    #[tokio::test]
    async fn a_rules_announcement_touches_no_cache() {
        let tier = Arc::new(MemoryTier::new());
        let invalidator = invalidator(&tier);
        // Even with Redis down, the shared delivery has nothing to fail on.
        tier.set_failing(true);
        let announcement = rules_changed("rules-2", 2);
        invalidator.on_broadcast(&announcement).await;
        invalidator
            .on_shared(&announcement)
            .await
            .expect("nothing to do");
        tier.set_failing(false);

        assert_eq!(*invalidator.rules_announcements().borrow(), 2);
        assert!(
            invalidator
                .engine
                .parts()
                .rate
                .peek(&rate_key().item)
                .is_none()
        );
        assert_eq!(tier.version_of(rate_key()), None);
    }
}
