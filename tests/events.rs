//! Operators' change events on the embedded profile (in-process bus): a changed rate is served
//! after its event, duplicates and out-of-order events change nothing, malformed events are
//! dead-lettered with their reason and the bus keeps going.

use rebate_domain::{ItemKey, RateBps, RebateRate, Timestamp};
use rebate_events::{EventId, EventKind, EventPublisher, InvalidationEvent};
use rebate_store::{CatalogRepository, SqliteSettings, SqliteStore, Versioned};
use rebate_tests::{TestApp, spawn_app};
use serde_json::Value;

async fn rate_of(app: &TestApp, platform: &str, item: &str) -> Value {
    let body: Value = app.get_item(platform, item).await.json().await.unwrap();
    body["rebate"]["rate_bps"].clone()
}

async fn catalogue(app: &TestApp) -> SqliteStore {
    SqliteStore::open(&SqliteSettings {
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
    let new_rate = RebateRate {
        rate_bps: RateBps::try_from(4_321u64).unwrap(),
    };
    let new_version = current.version + 1;
    store
        .upsert_rate(
            key,
            &Versioned {
                value: new_rate,
                version: new_version,
                updated_at: Timestamp::now(),
            },
        )
        .await
        .unwrap();
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
