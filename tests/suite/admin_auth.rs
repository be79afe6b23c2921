//! Failed admin authentication on the real admin listener: each refusal is counted exactly in
//! `rebate_admin_auth_failures_total{reason}`, a peer that keeps offering wrong tokens is
//! throttled (429, `Retry-After`, the JSON error body with its trace id) while other peers and
//! the probes are not.

use std::net::{IpAddr, Ipv4Addr};

use rebate_tests::{TestApp, spawn_app_with};
use serde_json::Value;

/// `GET /admin/v1/status` from this test's client, with `authorization` if given.
async fn status(app: &TestApp, authorization: Option<&str>) -> reqwest::Response {
    let mut request = app.client.get(format!("{}/admin/v1/status", app.admin_url));
    if let Some(authorization) = authorization {
        request = request.header("authorization", authorization);
    }
    request.send().await.expect("the admin listener answers")
}

/// The value of `rebate_admin_auth_failures_total{reason="…"}`, which must be exported.
fn failures(metrics: &str, reason: &str) -> u64 {
    let series = format!("rebate_admin_auth_failures_total{{reason=\"{reason}\"}} ");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(&series))
        .unwrap_or_else(|| panic!("{series}missing from:\n{metrics}"))
        .parse()
        .expect("a count")
}

async fn error_code(response: reqwest::Response) -> (String, Value) {
    let body: Value = response.json().await.expect("a JSON error body");
    assert!(body["trace_id"].is_string(), "{body}");
    (
        body["error"]["code"].as_str().unwrap_or("").to_owned(),
        body,
    )
}

#[tokio::test]
async fn wrong_tokens_are_refused_then_the_peer_is_throttled_and_every_refusal_is_counted() {
    let app = spawn_app_with(|_| {}).await;
    let right = format!("Bearer {}", app.admin_token);
    // The embedded default: 10 wrong tokens, then a penalty of 60 s.
    for attempt in 0..10 {
        let refused = status(&app, Some("Bearer 0123456789abcdef0123456789abcdef")).await;
        assert_eq!(refused.status(), 401, "attempt {attempt}");
        assert_eq!(error_code(refused).await.0, "unauthorized");
    }
    let mut throttled_requests = 0;
    for authorization in [
        Some("Bearer 0123456789abcdef0123456789abcdef"),
        // The right token is refused unread during the penalty: guessing cannot go on.
        Some(right.as_str()),
        None,
    ] {
        let throttled = status(&app, authorization).await;
        throttled_requests += 1;
        assert_eq!(throttled.status(), 429);
        let retry_after: u64 = throttled.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=60).contains(&retry_after), "{retry_after}");
        let (code, body) = error_code(throttled).await;
        assert_eq!(code, "rate_limited", "{body}");
    }
    // A warm job's submission is behind the same throttle.
    let warm_job = app
        .client
        .post(format!("{}/admin/v1/warm-jobs", app.admin_url))
        .header("authorization", &right)
        .json(&serde_json::json!({"items": [{"platform": "jd", "item_id": "100001"}]}))
        .send()
        .await
        .unwrap();
    throttled_requests += 1;
    assert_eq!(warm_job.status(), 429);

    // The probes, /metrics and another peer are not throttled.
    for path in ["/healthz", "/readyz", "/metrics"] {
        let response = app
            .client
            .get(format!("{}{path}", app.admin_url))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{path}");
    }
    let other_peer = reqwest::Client::builder()
        .no_proxy()
        .local_address(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)))
        .build()
        .unwrap();
    let served = other_peer
        .get(format!("{}/admin/v1/status", app.admin_url))
        .header("authorization", &right)
        .send()
        .await
        .unwrap();
    assert_eq!(served.status(), 200);

    let metrics = app.metrics_text().await;
    assert_eq!(failures(&metrics, "invalid"), 10);
    assert_eq!(failures(&metrics, "throttled"), throttled_requests);
    assert_eq!(failures(&metrics, "missing"), 0);
    assert!(
        metrics.contains("\nrebate_admin_auth_tracked_peers 1\n"),
        "{metrics}"
    );
    app.stop().await;
}

#[tokio::test]
async fn missing_tokens_are_counted_but_never_throttle_and_the_right_token_forgives() {
    let app = spawn_app_with(|settings| {
        settings.admin.auth_throttle.max_failures = 3;
    })
    .await;
    let right = format!("Bearer {}", app.admin_token);
    for _ in 0..20 {
        assert_eq!(status(&app, None).await.status(), 401);
        // Not a bearer token at all: nothing was guessed either.
        assert_eq!(
            status(&app, Some("Basic YWRtaW46YWRtaW4=")).await.status(),
            401
        );
    }
    // Two wrong tokens, then the right one: the count starts again, twice over.
    for _ in 0..2 {
        for _ in 0..2 {
            assert_eq!(status(&app, Some("Bearer guess")).await.status(), 401);
        }
        assert_eq!(status(&app, Some(&right)).await.status(), 200);
    }
    let metrics = app.metrics_text().await;
    assert_eq!(failures(&metrics, "missing"), 40);
    assert_eq!(failures(&metrics, "invalid"), 4);
    assert_eq!(failures(&metrics, "throttled"), 0);
    app.stop().await;
}
