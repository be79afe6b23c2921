use std::collections::HashSet;

use rebate_domain::{ItemId, Platform};
use tokio::sync::Notify;

use super::*;
use crate::event::{EventId, EventKind};
use crate::wire::SigningKey;

/// Records what it receives and wakes waiters; fails `on_shared` for chosen events.
#[derive(Default)]
struct RecordingHandler {
    broadcasts: Mutex<Vec<String>>,
    shared_attempts: Mutex<Vec<String>>,
    shared_successes: Mutex<Vec<String>>,
    /// Event ids whose shared delivery fails this many times before succeeding.
    failures_before_success: Mutex<BTreeMap<String, u32>>,
    /// Blocks `on_broadcast` until notified, to hold the dispatcher busy.
    gate: Option<Arc<Notify>>,
    entered: Arc<Notify>,
    progress: Arc<Notify>,
}

impl RecordingHandler {
    fn new(progress: &Arc<Notify>) -> Arc<Self> {
        Arc::new(Self {
            progress: Arc::clone(progress),
            ..Self::default()
        })
    }

    fn failing(progress: &Arc<Notify>, event_id: &str, times: u32) -> Arc<Self> {
        let handler = Self::new(progress);
        lock(&handler.failures_before_success).insert(event_id.to_owned(), times);
        handler
    }

    fn broadcasts(&self) -> Vec<String> {
        lock(&self.broadcasts).clone()
    }

    fn shared_successes(&self) -> Vec<String> {
        lock(&self.shared_successes).clone()
    }
}

#[async_trait]
impl EventHandler for RecordingHandler {
    async fn on_broadcast(&self, event: &InvalidationEvent) {
        self.entered.notify_one();
        if let Some(gate) = &self.gate {
            gate.notified().await;
        }
        lock(&self.broadcasts).push(event.event_id().to_string());
        self.progress.notify_waiters();
    }

    async fn on_shared(&self, event: &InvalidationEvent) -> Result<(), HandlerError> {
        let id = event.event_id().to_string();
        lock(&self.shared_attempts).push(id.clone());
        let outcome = {
            let mut failures = lock(&self.failures_before_success);
            match failures.get_mut(&id) {
                Some(remaining) if *remaining > 0 => {
                    *remaining -= 1;
                    Err(HandlerError::new("upstream unavailable"))
                }
                _ => {
                    lock(&self.shared_successes).push(id);
                    Ok(())
                }
            }
        };
        self.progress.notify_waiters();
        outcome
    }
}

/// Waits (in virtual time, so never really) until `condition` holds; fails after a minute.
async fn wait_until(progress: &Notify, condition: impl Fn() -> bool) {
    let waiting = async {
        loop {
            let notified = progress.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if condition() {
                return;
            }
            notified.await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), waiting)
        .await
        .expect("condition not reached");
}

fn event(id: &str) -> InvalidationEvent {
    InvalidationEvent::new(
        EventId::parse(id).unwrap(),
        EventKind::CouponsChanged,
        Platform::Jd,
        vec![ItemId::from_u64(100_001)],
        1,
        Timestamp::now(),
    )
    .unwrap()
}

fn start(settings: BusConfig) -> (InProcessBus, CancellationToken) {
    let shutdown = CancellationToken::new();
    (InProcessBus::start(settings, shutdown.clone()), shutdown)
}

#[tokio::test(start_paused = true)]
async fn broadcast_reaches_all_and_shared_exactly_one() {
    let progress = Arc::new(Notify::new());
    let (bus, _shutdown) = start(BusConfig::default());
    let handlers: Vec<Arc<RecordingHandler>> =
        (0..3).map(|_| RecordingHandler::new(&progress)).collect();
    let _subscriptions: Vec<Subscription> = handlers
        .iter()
        .map(|handler| bus.subscribe(Arc::clone(handler) as Arc<dyn EventHandler>))
        .collect();

    let ids: Vec<String> = (0..6).map(|n| format!("event-{n}")).collect();
    for id in &ids {
        bus.publish(&event(id)).await.unwrap();
    }
    wait_until(&progress, || {
        handlers
            .iter()
            .map(|handler| handler.shared_successes().len())
            .sum::<usize>()
            == 6
    })
    .await;

    for handler in &handlers {
        assert_eq!(handler.broadcasts(), ids, "broadcast in publication order");
        assert_eq!(handler.shared_successes().len(), 2, "round robin");
    }
    let shared: HashSet<String> = handlers
        .iter()
        .flat_map(|handler| handler.shared_successes())
        .collect();
    assert_eq!(
        shared.len(),
        6,
        "each event's shared delivery went to one handler"
    );
    let stats = bus.stats();
    assert_eq!(stats.published, 6);
    assert_eq!(stats.delivered_broadcast, 18);
    assert_eq!(stats.delivered_shared, 6);
    assert_eq!(stats.dead_lettered, 0);
    assert!(bus.dead_letters().is_empty());
}

#[tokio::test(start_paused = true)]
async fn failed_shared_deliveries_are_redelivered_then_dead_lettered() {
    let progress = Arc::new(Notify::new());
    let settings = BusConfig {
        max_deliveries: 3,
        ..BusConfig::default()
    };
    let (bus, _shutdown) = start(settings);
    let recovers = RecordingHandler::failing(&progress, "flaky", 2);
    lock(&recovers.failures_before_success).insert("doomed".into(), u32::MAX);
    let _subscription = bus.subscribe(Arc::clone(&recovers) as Arc<dyn EventHandler>);

    bus.publish(&event("flaky")).await.unwrap();
    bus.publish(&event("doomed")).await.unwrap();
    bus.publish(&event("marker")).await.unwrap();
    wait_until(&progress, || {
        recovers.shared_successes().contains(&"marker".to_owned())
    })
    .await;

    assert_eq!(recovers.shared_successes(), ["flaky", "marker"]);
    assert_eq!(
        lock(&recovers.shared_attempts).clone(),
        [
            "flaky", "flaky", "flaky", "doomed", "doomed", "doomed", "marker"
        ]
    );
    let dead_letters = bus.dead_letters();
    assert_eq!(dead_letters.len(), 1);
    let dead_letter = &dead_letters[0];
    assert_eq!(dead_letter.code, "handler_failed");
    assert_eq!(dead_letter.deliveries, 3);
    assert_eq!(
        dead_letter.reason,
        "shared handler failed 3 times; last error: upstream unavailable"
    );
    assert_eq!(
        dead_letter.body,
        encode_event(&event_with_time("doomed", &dead_letter.body))
    );
    let stats = bus.stats();
    assert_eq!(stats.redelivered, 4);
    assert_eq!(stats.delivered_shared, 2);
    assert_eq!(stats.dead_lettered, 1);
}

/// Fails every shared delivery as "incomplete": the broadcast effect holds, the follow-up does not.
struct IncompleteHandler {
    shared_attempts: Mutex<u32>,
    progress: Arc<Notify>,
}

#[async_trait]
impl EventHandler for IncompleteHandler {
    async fn on_broadcast(&self, _event: &InvalidationEvent) {}

    async fn on_shared(&self, _event: &InvalidationEvent) -> Result<(), HandlerError> {
        *lock(&self.shared_attempts) += 1;
        self.progress.notify_waiters();
        Err(HandlerError::incomplete(
            "l2_fence_unapplied",
            "redis unreachable",
        ))
    }
}

#[tokio::test(start_paused = true)]
async fn incomplete_deliveries_are_retried_then_abandoned_not_dead_lettered() {
    let progress = Arc::new(Notify::new());
    let settings = BusConfig {
        max_deliveries: 3,
        ..BusConfig::default()
    };
    let (bus, _shutdown) = start(settings);
    let handler = Arc::new(IncompleteHandler {
        shared_attempts: Mutex::new(0),
        progress: Arc::clone(&progress),
    });
    let _subscription = bus.subscribe(Arc::clone(&handler) as Arc<dyn EventHandler>);

    bus.publish(&event("applied-by-broadcast")).await.unwrap();
    bus.settled().await;

    assert_eq!(
        *lock(&handler.shared_attempts),
        3,
        "max_deliveries attempts"
    );
    assert!(bus.dead_letters().is_empty(), "{:?}", bus.dead_letters());
    let stats = bus.stats();
    assert_eq!(stats.redelivered, 2);
    assert_eq!(stats.dead_lettered, 0);
    assert_eq!(stats.delivered_shared, 0);
    assert_eq!(stats.abandoned, 1);
    assert_eq!(
        stats.abandoned_by_code,
        BTreeMap::from([("l2_fence_unapplied".to_owned(), 1)])
    );
}

#[test]
fn handler_errors_say_whether_they_are_incomplete() {
    assert_eq!(HandlerError::new("store down").incomplete_code(), None);
    let incomplete = HandlerError::incomplete("l2_fence_unapplied", "redis down");
    assert_eq!(incomplete.incomplete_code(), Some("l2_fence_unapplied"));
    assert_eq!(incomplete.to_string(), "redis down");
}

/// Rebuilds the event that produced `body` (its timestamp came from the wall clock).
fn event_with_time(id: &str, body: &[u8]) -> InvalidationEvent {
    let decoded = decode_event(
        body,
        None,
        &ValidationPolicy::permissive(Timestamp::default()),
    )
    .unwrap();
    assert_eq!(decoded.event_id().as_str(), id);
    decoded
}

#[tokio::test(start_paused = true)]
async fn malformed_bodies_are_dead_lettered_and_the_dispatcher_keeps_going() {
    let progress = Arc::new(Notify::new());
    let (bus, _shutdown) = start(BusConfig::default());
    let handler = RecordingHandler::new(&progress);
    let _subscription = bus.subscribe(Arc::clone(&handler) as Arc<dyn EventHandler>);

    bus.publish_raw(b"{not json".to_vec(), None).unwrap();
    let mut empty = encode_event(&event("empty"));
    empty = String::from_utf8(empty)
        .unwrap()
        .replace(r#"["100001"]"#, "[]")
        .into_bytes();
    bus.publish_raw(empty.clone(), None).unwrap();
    bus.publish(&event("after")).await.unwrap();
    wait_until(&progress, || handler.shared_successes() == ["after"]).await;

    assert_eq!(handler.broadcasts(), ["after"]);
    let dead_letters = bus.dead_letters();
    assert_eq!(dead_letters.len(), 2);
    assert_eq!(dead_letters[0].code, "malformed_json");
    assert!(
        dead_letters[0]
            .reason
            .starts_with("malformed JSON at line 1 column 2")
    );
    assert_eq!(dead_letters[0].body, b"{not json");
    assert_eq!(dead_letters[0].deliveries, 0);
    assert_eq!(dead_letters[1].reason, "item_ids is empty");
    assert_eq!(dead_letters[1].body, empty);
    let stats = bus.stats();
    assert_eq!(stats.rejected_by_reason.get("malformed_json"), Some(&1));
    assert_eq!(stats.rejected_by_reason.get("no_items"), Some(&1));
    assert_eq!(stats.dead_lettered, 2);
    assert_eq!(stats.published, 3);
    let json = serde_json::to_value(&stats).unwrap();
    assert_eq!(json["rejected_by_reason"]["no_items"], 1);
}

#[tokio::test(start_paused = true)]
async fn signed_bus_signs_its_own_events_and_refuses_unsigned_raw_ones() {
    let progress = Arc::new(Notify::new());
    let key = SigningKey::new("0123456789abcdef-shared-secret").unwrap();
    let settings = BusConfig {
        policy: ValidationPolicy::production(key, Duration::from_secs(300), Timestamp::default()),
        ..BusConfig::default()
    };
    let (bus, _shutdown) = start(settings);
    let handler = RecordingHandler::new(&progress);
    let _subscription = bus.subscribe(Arc::clone(&handler) as Arc<dyn EventHandler>);

    bus.publish_raw(encode_event(&event("unsigned")), None)
        .unwrap();
    bus.publish(&event("signed")).await.unwrap();
    wait_until(&progress, || handler.shared_successes() == ["signed"]).await;

    let dead_letters = bus.dead_letters();
    assert_eq!(dead_letters.len(), 1);
    assert_eq!(dead_letters[0].reason, "signature missing");
}

#[tokio::test(start_paused = true)]
async fn a_panicking_handler_does_not_stop_the_dispatcher() {
    struct Panicking;
    #[async_trait]
    impl EventHandler for Panicking {
        async fn on_broadcast(&self, _event: &InvalidationEvent) {
            panic!("broadcast bug");
        }
        async fn on_shared(&self, _event: &InvalidationEvent) -> Result<(), HandlerError> {
            panic!("shared bug");
        }
    }
    let progress = Arc::new(Notify::new());
    let settings = BusConfig {
        max_deliveries: 2,
        ..BusConfig::default()
    };
    let (bus, _shutdown) = start(settings);
    let panicking = bus.subscribe(Arc::new(Panicking));
    bus.publish(&event("boom")).await.unwrap();
    bus.publish(&event("also-boom")).await.unwrap();
    bus.settled().await;
    assert_eq!(bus.stats().dead_lettered, 2);
    let recorder = RecordingHandler::new(&progress);
    drop(panicking);
    let _subscription = bus.subscribe(Arc::clone(&recorder) as Arc<dyn EventHandler>);
    bus.publish(&event("later")).await.unwrap();
    wait_until(&progress, || {
        recorder.shared_successes().contains(&"later".to_owned())
    })
    .await;

    let dead_letters = bus.dead_letters();
    assert_eq!(
        dead_letters[0].reason,
        "shared handler failed 2 times; last error: handler panicked"
    );
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_pushes_back_instead_of_blocking() {
    let progress = Arc::new(Notify::new());
    let settings = BusConfig {
        queue_capacity: 1,
        ..BusConfig::default()
    };
    let (bus, _shutdown) = start(settings);
    let gate = Arc::new(Notify::new());
    let handler = Arc::new(RecordingHandler {
        gate: Some(Arc::clone(&gate)),
        progress: Arc::clone(&progress),
        ..RecordingHandler::default()
    });
    let _subscription = bus.subscribe(Arc::clone(&handler) as Arc<dyn EventHandler>);

    bus.publish(&event("first")).await.unwrap();
    handler.entered.notified().await; // the dispatcher holds "first"
    bus.publish(&event("second")).await.unwrap(); // fills the queue
    assert_eq!(
        bus.publish(&event("third")).await,
        Err(PublishError::Backpressure)
    );
    assert_eq!(bus.stats().published, 2);

    gate.notify_one();
    handler.entered.notified().await; // now holding "second"
    gate.notify_one();
    wait_until(&progress, || handler.shared_successes().len() == 2).await;
    assert_eq!(handler.broadcasts(), ["first", "second"]);
}

#[tokio::test(start_paused = true)]
async fn shutdown_stops_the_dispatcher_and_refuses_new_events() {
    let (bus, shutdown) = start(BusConfig::default());
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(60), bus.stopped())
        .await
        .expect("dispatcher stopped");
    assert_eq!(bus.publish(&event("late")).await, Err(PublishError::Closed));
}

#[tokio::test(start_paused = true)]
async fn dropping_a_subscription_unsubscribes_and_unheard_events_are_dead_lettered() {
    let progress = Arc::new(Notify::new());
    let (bus, _shutdown) = start(BusConfig::default());
    let handler = RecordingHandler::new(&progress);
    let subscription = bus.subscribe(Arc::clone(&handler) as Arc<dyn EventHandler>);
    bus.publish(&event("heard")).await.unwrap();
    wait_until(&progress, || handler.shared_successes() == ["heard"]).await;
    drop(subscription);

    bus.publish(&event("unheard")).await.unwrap();
    bus.settled().await;
    assert_eq!(handler.broadcasts(), ["heard"]);
    assert_eq!(bus.dead_letters()[0].code, "no_subscriber");
}

#[tokio::test(start_paused = true)]
async fn the_dead_letter_ring_is_bounded() {
    let settings = BusConfig {
        dead_letter_capacity: 2,
        ..BusConfig::default()
    };
    let (bus, _shutdown) = start(settings);
    for body in ["a", "b", "c"] {
        bus.publish_raw(body.as_bytes().to_vec(), None).unwrap();
    }
    bus.settled().await;
    let bodies: Vec<Vec<u8>> = bus
        .dead_letters()
        .into_iter()
        .map(|letter| letter.body)
        .collect();
    assert_eq!(bodies, [b"b".to_vec(), b"c".to_vec()]);
    assert_eq!(bus.stats().dead_lettered, 3);
}

#[tokio::test(start_paused = true)]
async fn a_signed_rules_announcement_reaches_every_subscriber_and_one_shared_handler() {
    let progress = Arc::new(Notify::new());
    let key = SigningKey::new("0123456789abcdef-shared-secret").unwrap();
    let settings = BusConfig {
        policy: ValidationPolicy::production(key, Duration::from_secs(300), Timestamp::default()),
        ..BusConfig::default()
    };
    let (bus, _shutdown) = start(settings);
    let handlers: Vec<Arc<RecordingHandler>> =
        (0..3).map(|_| RecordingHandler::new(&progress)).collect();
    let _subscriptions: Vec<Subscription> = handlers
        .iter()
        .map(|handler| bus.subscribe(Arc::clone(handler) as Arc<dyn EventHandler>))
        .collect();

    let announcement =
        InvalidationEvent::rules_changed(EventId::parse("rules-3").unwrap(), 3, Timestamp::now())
            .unwrap();
    bus.publish(&announcement).await.unwrap();
    bus.settled().await;

    for handler in &handlers {
        assert_eq!(handler.broadcasts(), ["rules-3"]);
    }
    let shared: Vec<String> = handlers
        .iter()
        .flat_map(|handler| handler.shared_successes())
        .collect();
    assert_eq!(shared, ["rules-3"], "exactly one shared delivery");
    assert!(bus.dead_letters().is_empty(), "{:?}", bus.dead_letters());
}

#[tokio::test(start_paused = true)]
async fn a_rules_announcement_naming_items_is_dead_lettered_with_its_reason() {
    let progress = Arc::new(Notify::new());
    let (bus, _shutdown) = start(BusConfig::default());
    let handler = RecordingHandler::new(&progress);
    let _subscription = bus.subscribe(Arc::clone(&handler) as Arc<dyn EventHandler>);

    let body = br#"{"schema":1,"event_id":"rules-4","kind":"rules_changed","platform":"jd","item_ids":["1"],"version":4,"occurred_at":"2026-11-30T12:00:00Z"}"#;
    bus.publish_raw(body.to_vec(), None).unwrap();
    bus.settled().await;

    assert!(handler.broadcasts().is_empty());
    let dead_letters = bus.dead_letters();
    assert_eq!(dead_letters.len(), 1);
    assert_eq!(dead_letters[0].code, "field_not_allowed");
    assert_eq!(
        dead_letters[0].reason,
        "`platform` is not allowed on a rules_changed event: it names no items"
    );
    assert_eq!(
        bus.stats().rejected_by_reason.get("field_not_allowed"),
        Some(&1)
    );
}
