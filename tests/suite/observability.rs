//! Explaining a request by its trace id without any tracing backend: the slow-request log and its
//! admin API, against the real service and the upstream simulator.

use rebate_tests::{TestApp, spawn_app_with};
use serde_json::Value;
use upstream_sim::Endpoint;

async fn json_of(response: reqwest::Response) -> Value {
    response.json().await.expect("a JSON body")
}

fn trace_id_of(response: &reqwest::Response) -> String {
    response.headers()["x-trace-id"]
        .to_str()
        .unwrap()
        .to_owned()
}

async fn slow_request(app: &TestApp, trace_id: &str) -> reqwest::Response {
    app.admin_get(&format!("/admin/v1/slow-requests/{trace_id}"))
        .await
}

#[tokio::test]
async fn a_slow_request_is_explained_stage_by_stage_by_its_trace_id() {
    let app = spawn_app_with(|settings| {
        settings.observability.slow_request_ms = 300;
        settings.observability.instance_id = "api-7".to_owned();
    })
    .await;
    // Fast and complete: not recorded.
    let fast = app.get_item("jd", "100001").await;
    assert_eq!(fast.status(), 200);
    let fast_id = trace_id_of(&fast);
    assert_eq!(slow_request(&app, &fast_id).await.status(), 404);

    // The coupon API answers in 400 ms: within its 500 ms tier, but a slow request.
    app.slow_upstream(Endpoint::Coupons, 400);
    let slow = app.get_item("jd", "100002").await;
    assert_eq!(slow.status(), 200);
    let slow_id = trace_id_of(&slow);
    let record = json_of(slow_request(&app, &slow_id).await).await;
    assert_eq!(record["trace_id"], slow_id.as_str());
    assert_eq!(record["instance"], "api-7");
    assert_eq!(record["status"], 200);
    assert_eq!(record["shed_level"], 0);
    assert_eq!(record["reasons"], serde_json::json!(["slow"]));
    assert!(record["latency_ms"].as_f64().unwrap() >= 400.0, "{record}");
    let stages = record["stages"].as_array().unwrap();
    let coupon_call = stages
        .iter()
        .find(|stage| stage["kind"] == "dependency" && stage["name"] == "coupons")
        .expect("the coupon call is a stage");
    assert_eq!(coupon_call["outcome"], "success");
    assert_eq!(coupon_call["attempt"], 1);
    assert!(
        coupon_call["elapsed_ms"].as_f64().unwrap() >= 400.0,
        "{coupon_call}"
    );
    // Every part of a cold item was loaded; each shows which dependency it called.
    for part in ["product", "rate", "coupons", "extras"] {
        assert!(
            stages
                .iter()
                .any(|stage| stage["kind"] == "part" && stage["name"] == part),
            "{part} missing from {stages:?}"
        );
    }
    for dependency in ["mysql", "extras"] {
        assert!(
            stages
                .iter()
                .any(|stage| stage["kind"] == "dependency" && stage["name"] == dependency),
            "{dependency} missing from {stages:?}"
        );
    }

    // A degraded answer is recorded with its reason and every attempt.
    app.break_upstream(Endpoint::Coupons);
    let degraded = app.get_item("jd", "100003").await;
    let degraded_id = trace_id_of(&degraded);
    let record = json_of(slow_request(&app, &degraded_id).await).await;
    assert_eq!(record["reasons"], serde_json::json!(["degraded"]));
    let coupon_part = record["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|stage| stage["kind"] == "part" && stage["name"] == "coupons")
        .unwrap()
        .clone();
    assert_eq!(coupon_part["outcome"], "template (error)");

    let recent = json_of(app.admin_get("/admin/v1/slow-requests?limit=2").await).await;
    let ids: Vec<&str> = recent["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|request| request["trace_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [degraded_id.as_str(), slow_id.as_str()]);
    app.stop().await;
}

#[tokio::test]
async fn the_log_stays_bounded_and_its_api_checks_its_input() {
    let app = spawn_app_with(|settings| {
        settings.observability.slow_log_size = 5;
    })
    .await;
    app.break_upstream(Endpoint::Extras);
    // Fifty degraded answers (ten times the log's size).
    let mut ids = Vec::new();
    for id in 100_001..100_051u64 {
        let response = app.get_item("pdd", &id.to_string()).await;
        assert_eq!(response.status(), 200);
        ids.push(trace_id_of(&response));
    }
    let recent = json_of(app.admin_get("/admin/v1/slow-requests").await).await;
    assert_eq!(recent["capacity"], 5);
    assert_eq!(recent["recorded"], 5);
    assert_eq!(recent["requests"].as_array().unwrap().len(), 5);
    assert_eq!(slow_request(&app, &ids[49]).await.status(), 200);
    assert_eq!(slow_request(&app, &ids[44]).await.status(), 404);
    let missing = json_of(slow_request(&app, &ids[0]).await).await;
    assert_eq!(missing["error"]["code"], "not_recorded");

    for (path, code) in [
        ("/admin/v1/slow-requests/not-a-trace-id", "invalid_query"),
        ("/admin/v1/slow-requests?limit=0", "invalid_query"),
        ("/admin/v1/slow-requests?limit=6", "invalid_query"),
        ("/admin/v1/slow-requests?since=1", "invalid_query"),
    ] {
        let response = app.admin_get(path).await;
        assert_eq!(response.status(), 400, "{path}");
        assert_eq!(json_of(response).await["error"]["code"], code, "{path}");
    }
    let anonymous = app
        .client
        .get(format!("{}/admin/v1/slow-requests", app.admin_url))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
    app.stop().await;
}
