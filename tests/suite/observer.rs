//! The consistency observer on the embedded profile: an operator's event whose version is far
//! ahead of the store's row (40000000000 typed for the row's version) is its own outcome,
//! `ahead_of_store`, in the status and the metrics, while an event the store holds is
//! consistent.

use rebate_tests::{TestApp, spawn_app_with, wait_until};
use serde_json::{Value, json};

/// The store's version of an item's rate row, as the inspection route reads it.
async fn rate_version(app: &TestApp, item_id: &str) -> u64 {
    let inspection: Value = app
        .admin_get(&format!("/admin/v1/items/jd/{item_id}"))
        .await
        .json()
        .await
        .unwrap();
    inspection["store"]["rate"]["version"]
        .as_u64()
        .unwrap_or_else(|| panic!("a rate row: {inspection}"))
}

/// Publishes an operator's rate event through the admin API.
async fn publish(app: &TestApp, item_id: &str, version: u64) {
    let published = app
        .client
        .post(format!("{}/admin/v1/events", app.admin_url))
        .bearer_auth(&app.admin_token)
        .json(
            &json!({"kind": "rate_changed", "platform": "jd", "item_ids": [item_id],
            "version": version}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(published.status(), 202);
}

#[tokio::test]
async fn a_mistyped_event_version_is_ahead_of_store_and_a_held_one_consistent() {
    // Two short windows, both before events.fence_secs (60 s): the last one is the verdict.
    let app = spawn_app_with(|settings| {
        settings.events.observer.windows_ms = vec![100, 200];
    })
    .await;
    let held = rate_version(&app, "100001").await;
    let row = rate_version(&app, "100002").await;
    let mistyped = 40_000_000_000;
    let gap = query_api::Settings::defaults()
        .unwrap()
        .events
        .max_version_gap;
    assert!(mistyped - row > gap, "far beyond events.max_version_gap");

    publish(&app, "100001", held).await;
    publish(&app, "100002", mistyped).await;
    app.state.events.in_process().unwrap().settled().await;
    wait_until("both windows checked both events", || {
        let report = app.state.consistency.report();
        report.pending == 0
            && report.windows.iter().all(|window| {
                window.consistent + window.inconsistent + window.unknown + window.ahead_of_store
                    == 2
            })
    })
    .await;

    let status: Value = app
        .admin_get("/admin/v1/status")
        .await
        .json()
        .await
        .unwrap();
    let consistency = &status["consistency"];
    assert_eq!(consistency["ahead_of_store"], 1, "{consistency}");
    for window in consistency["windows"].as_array().unwrap() {
        assert_eq!(
            (
                &window["consistent"],
                &window["inconsistent"],
                &window["unknown"],
                &window["ahead_of_store"]
            ),
            (&json!(1), &json!(0), &json!(0), &json!(1)),
            "{consistency}"
        );
    }
    let metrics = app.metrics_text().await;
    for window in ["100ms", "200ms"] {
        for (outcome, count) in [
            ("consistent", 1),
            ("inconsistent", 0),
            ("unknown", 0),
            ("ahead_of_store", 1),
        ] {
            let line = format!(
                "\nrebate_consistency_checks_total{{window=\"{window}\",outcome=\"{outcome}\"}} {count}\n"
            );
            assert!(metrics.contains(&line), "{line} missing from:\n{metrics}");
        }
    }
    assert!(
        metrics.contains("\nrebate_consistency_ahead_of_store_total 1\n"),
        "{metrics}"
    );
    app.stop().await;
}
