//! Operators' change events on the embedded profile (in-process bus): a changed rate is served
//! after its event, duplicates and out-of-order events change nothing, malformed events are
//! dead-lettered with their reason and the bus keeps going.

use rebate_domain::{ItemKey, Timestamp};
use rebate_events::{EventId, EventKind, EventPublisher, InvalidationEvent};
use rebate_store::{CatalogRepository, SqliteConfig, SqliteStore};
use rebate_tests::{TestApp, event_for, spawn_app};
use serde_json::Value;

async fn rate_of(app: &TestApp, platform: &str, item: &str) -> Value {
    let body: Value = app.get_item(platform, item).await.json().await.unwrap();
    body["rebate"]["rate_bps"].clone()
}

async fn catalogue(app: &TestApp) -> SqliteStore {
    SqliteStore::open(&SqliteConfig {
        path: app.database_path.clone(),
        max_connections: 1,
        acquire_timeout: std::time::Duration::from_secs(5),
    })
    .await
    .unwrap()
}

fn rate_event(id: &str, key: ItemKey, version: u64) -> InvalidationEvent {
    InvalidationEvent::new(
        EventId::parse(id).unwrap(),
        EventKind::RateChanged,
        key.platform,
        vec![key.item_id],
        version,
        Timestamp::now(),
    )
    .unwrap()
}

#[tokio::test]
async fn a_rate_change_is_served_after_its_event_and_old_events_change_nothing() {
    let app = spawn_app().await;
    let key = ItemKey::parse("taobao", "100042").unwrap();
    let before = rate_of(&app, "taobao", "100042").await;
    let store = catalogue(&app).await;
    let current = store.rate(key).await.unwrap().unwrap();

    // The operator changes the rate; without an event the cached rate is still served.
    let new_version = app.write_rate(key, 4_321, None).await;
    assert_eq!(new_version, current.version + 1);
    assert_eq!(rate_of(&app, "taobao", "100042").await, before);
    // That answer came from the kept rendering of the whole quote: the event must drop it too.
    let rendered = app.state.engine.rendered_stats().unwrap();
    assert!(rendered.hits >= 1 && rendered.entries >= 1, "{rendered:?}");

    app.state
        .events
        .publisher()
        .publish(&rate_event("evt-1", key, new_version))
        .await
        .unwrap();
    app.state.events.in_process().unwrap().settled().await;
    assert_eq!(rate_of(&app, "taobao", "100042").await, 4_321);

    // A duplicate and an older, late event: harmless, and no reload.
    let loads = app.rate_loads();
    app.state
        .events
        .publisher()
        .publish(&rate_event("evt-1", key, new_version))
        .await
        .unwrap();
    app.state
        .events
        .publisher()
        .publish(&rate_event("evt-0", key, current.version))
        .await
        .unwrap();
    app.state.events.in_process().unwrap().settled().await;
    assert_eq!(rate_of(&app, "taobao", "100042").await, 4_321);
    assert_eq!(app.rate_loads(), loads);
    store.close().await;
    app.stop().await;
}

#[tokio::test]
async fn malformed_events_are_dead_lettered_and_the_bus_keeps_going() {
    let app = spawn_app().await;
    let bus = app.state.events.in_process().expect("embedded profile");
    bus.publish_raw(b"{not json".to_vec(), None).unwrap();
    bus.publish_raw(
        br#"{"schema":1,"event_id":"e","kind":"rate_changed","platform":"ebay","item_ids":["1"],"version":1,"occurred_at":"2026-11-30T12:00:00Z"}"#.to_vec(),
        None,
    )
    .unwrap();
    let key = ItemKey::parse("jd", "100043").unwrap();
    bus.publish(&rate_event("evt-ok", key, 99)).await.unwrap();
    bus.settled().await;
    let dead = bus.dead_letters();
    assert_eq!(dead.len(), 2, "{dead:?}");
    assert!(
        dead[0].reason.contains("malformed JSON"),
        "{}",
        dead[0].reason
    );
    assert!(dead[1].reason.contains("ebay"), "{}", dead[1].reason);
    let stats = bus.stats();
    assert_eq!(stats.dead_lettered, 2);
    assert!(stats.delivered_shared >= 1, "{stats:?}");
    app.stop().await;
}

/// The service's own announcement of a live-rules version reaches the application's state
/// (where the rules reader waits on it) and no cache.
#[tokio::test]
async fn a_rules_announcement_reaches_the_application_state() {
    let app = spawn_app().await;
    let bus = app.state.events.in_process().expect("embedded profile");
    let mut announcements = app.state.rules_announcements.clone();
    assert_eq!(*announcements.borrow_and_update(), 0);
    let loads = app.rate_loads();
    let announcement =
        InvalidationEvent::rules_changed(EventId::generate(), 7, Timestamp::now()).unwrap();
    bus.publish(&announcement).await.unwrap();
    bus.settled().await;

    assert!(announcements.has_changed().unwrap());
    assert_eq!(*announcements.borrow_and_update(), 7);
    assert!(bus.dead_letters().is_empty(), "{:?}", bus.dead_letters());
    assert_eq!(app.rate_loads(), loads);
    app.stop().await;
}

fn fenced_writes_refused(app: &TestApp) -> u64 {
    let parts = app.state.engine.parts();
    [
        parts.product.stats().fenced_writes_refused,
        parts.rate.stats().fenced_writes_refused,
        parts.coupons.stats().fenced_writes_refused,
        parts.extras.stats().fenced_writes_refused,
    ]
    .iter()
    .sum()
}

/// `item_delisted` fences the product at its row's version and nothing else: the item answers
/// 404 from its product part, and its rate, coupons and extras stay cacheable (before, they were
/// fenced at the product's version, which means nothing in their version spaces, and every query
/// reloaded them for the whole fence window).
#[tokio::test]
async fn a_delisted_item_answers_404_with_at_most_one_load_per_part() {
    use upstream_sim::Endpoint;
    let app = spawn_app().await;
    let key = ItemKey::parse("jd", "100077").unwrap();
    assert_eq!(app.get_item("jd", "100077").await.status(), 200);
    let store = catalogue(&app).await;
    let mut product = store.product(key).await.unwrap().unwrap();
    product.version += 1;
    product.value.status = rebate_domain::ProductStatus::Delisted;
    store.upsert_product(&product).await.unwrap();
    app.state
        .events
        .publisher()
        .publish(&event_for(EventKind::ItemDelisted, key, product.version))
        .await
        .unwrap();
    app.state.events.in_process().unwrap().settled().await;

    let loads = || {
        (
            app.product_loads(),
            app.rate_loads(),
            app.upstream_calls(Endpoint::Coupons),
            app.upstream_calls(Endpoint::Extras),
        )
    };
    let before = loads();
    let refused = fenced_writes_refused(&app);
    for _ in 0..100 {
        assert_eq!(app.get_item("jd", "100077").await.status(), 404);
    }
    let after = loads();
    assert!(
        after.0 - before.0 <= 1
            && after.1 - before.1 <= 1
            && after.2 - before.2 <= 1
            && after.3 - before.3 <= 1,
        "loads per part (product, rate, coupons, extras): {before:?} -> {after:?}"
    );
    assert_eq!(fenced_writes_refused(&app), refused);
    store.close().await;
    app.stop().await;
}

/// An event can run ahead of the store (published before the row's write commits). The fence
/// then refuses the old row the query in between reads, and the next query after the write
/// serves the new one, through the kept rendering of the quote too.
#[tokio::test]
async fn an_event_ahead_of_the_store_never_leaves_the_old_value_behind() {
    let app = spawn_app().await;
    let key = ItemKey::parse("pdd", "100031").unwrap();
    let before = rate_of(&app, "pdd", "100031").await;
    let store = catalogue(&app).await;
    let current = store.rate(key).await.unwrap().unwrap();
    let ahead = current.version + 5;
    app.state
        .events
        .publisher()
        .publish(&event_for(EventKind::RateChanged, key, ahead))
        .await
        .unwrap();
    app.state.events.in_process().unwrap().settled().await;
    // The store still holds the old row: that is what there is to serve.
    assert_eq!(rate_of(&app, "pdd", "100031").await, before);
    app.write_rate(key, 1_234, Some(ahead)).await;
    assert_eq!(rate_of(&app, "pdd", "100031").await, 1_234);
    assert_eq!(rate_of(&app, "pdd", "100031").await, 1_234);
    store.close().await;
    app.stop().await;
}
