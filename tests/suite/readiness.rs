//! `/readyz` means "send me traffic": 503 only while this instance cannot answer queries (still
//! starting, draining, or the store unreachable with nothing cached); a broker or Redis outage
//! is reported in the body as degraded, never as unready, because it hits the whole fleet at once
//! and every query still gets an answer.

use query_api::config::EventBackend;
use query_api::lifecycle::Phase;
use rebate_tests::{ProductionEnv, TestApp, spawn_app_with};
use serde_json::{Value, json};

/// The serving task enters `Serving` right after it spawns the listeners; on the test's
/// single-threaded runtime, yielding lets it get there without any sleep.
async fn until_serving(app: &TestApp) {
    for _ in 0..10_000 {
        if app.state.lifecycle.phase() == Phase::Serving {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("the application never entered the serving phase");
}

/// A local TCP port nothing listens on (bound, then released).
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local address").port()
}

#[tokio::test]
async fn a_fresh_embedded_app_is_ready_with_nothing_degraded() {
    let app = spawn_app_with(|_| {}).await;
    until_serving(&app).await;
    let (status, body) = app.readyz().await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        json!({"ready": true, "phase": "serving", "store": "ok", "redis": "disabled",
               "events": "connected", "degraded": []})
    );
    app.stop().await;
}

/// The broker is unreachable from the start (a closed local port): the application builds,
/// answers queries, stays ready, reports the bus as disconnected in `/readyz` and
/// `/admin/v1/status`, and refuses to publish with an error that names the broker.
#[tokio::test]
async fn an_unreachable_broker_degrades_readiness_but_never_fails_it() {
    let url = format!("amqp://guest:guest@127.0.0.1:{}/%2f", closed_port());
    let app = spawn_app_with(move |settings| {
        settings.events.backend = EventBackend::Amqp;
        settings.events.amqp.url = url;
        settings.events.amqp.reconnect_min_ms = 50;
        settings.events.amqp.reconnect_max_ms = 200;
    })
    .await;
    until_serving(&app).await;
    assert!(!app.state.events.is_ready());

    let (status, body) = app.readyz().await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        json!({"ready": true, "phase": "serving", "store": "ok", "redis": "disabled",
               "events": "disconnected", "degraded": ["events"]})
    );

    let quote = app.get_item("taobao", "100001").await;
    assert_eq!(
        quote.status(),
        200,
        "queries answer while the broker is down"
    );

    let status_body: Value = app
        .admin_get("/admin/v1/status")
        .await
        .json()
        .await
        .expect("a JSON status");
    assert_eq!(status_body["ready"], json!(true));
    assert_eq!(status_body["events"], json!("disconnected"));
    assert_eq!(status_body["degraded"], json!(["events"]));
    assert_eq!(status_body["events_connection"]["connected"], json!(false));
    // The page says how old the pings behind its readiness fields are.
    assert!(status_body["pinged_ms_ago"].is_u64(), "{status_body}");

    let published = app
        .client
        .post(format!("{}/admin/v1/events", app.admin_url))
        .bearer_auth(&app.admin_token)
        .json(&json!({"kind": "rate_changed", "platform": "jd", "item_ids": ["100077"], "version": 4}))
        .send()
        .await
        .expect("the admin listener answers");
    assert_eq!(published.status(), 503);
    assert_eq!(
        published
            .headers()
            .get("retry-after")
            .and_then(|value| value.to_str().ok()),
        Some("1")
    );
    let error: Value = published.json().await.expect("a JSON error");
    assert_eq!(error["error"]["code"], json!("unavailable"));
    assert_eq!(
        error["error"]["message"],
        json!("the event broker is unreachable; the event was not published, retry later")
    );
    app.stop().await;
}

/// Production profile: the catalogue's MariaDB database is dropped after start, and nothing was
/// cached — the instance cannot answer, so it is unready, and says the store is down.
#[tokio::test]
async fn a_lost_store_with_nothing_cached_is_unready() {
    let env = ProductionEnv::new("readiness_store").await;
    let app = env.spawn_instance(|_| {}).await;
    until_serving(&app).await;
    let (status, body) = app.readyz().await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["store"], json!("ok"));
    assert_eq!(body["redis"], json!("ok"));

    drop_database(&env.database_url).await;

    let (status, body) = app.readyz().await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(
        body,
        json!({"ready": false, "phase": "serving", "store": "down", "redis": "ok",
               "events": "connected", "degraded": ["store"]})
    );
    app.stop().await;
    env.clean_up().await;
}

/// `DROP DATABASE` of the database `database_url` names, over a connection of its own.
async fn drop_database(database_url: &str) {
    use sqlx::Connection;
    let (server, name) = database_url
        .rsplit_once('/')
        .expect("a database URL ends in /name");
    let mut connection = sqlx::MySqlConnection::connect(server)
        .await
        .expect("MariaDB reachable");
    sqlx::raw_sql(&format!(
        "SET SESSION lock_wait_timeout = 10; DROP DATABASE `{name}`"
    ))
    .execute(&mut connection)
    .await
    .expect("database dropped");
    connection.close().await.expect("connection closed");
}
