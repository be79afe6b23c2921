//! Drives `router()` in-process with `oneshot`: data, faults, control routes and counters.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use rebate_domain::{Coupon, Timestamp};
use serde_json::{Value, json};
use tower::ServiceExt;
use upstream_sim::{CouponsResponse, Endpoint, ExtrasResponse, Fault, SimState, router};

/// What a test looks at in an answer.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    retry_after: Option<String>,
    content_type: Option<String>,
    body: Vec<u8>,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|error| {
            panic!(
                "not JSON ({error}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    fn error_code(&self) -> String {
        self.json()["error"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    fn error_message(&self) -> String {
        self.json()["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }
}

async fn send(app: &Router, method: Method, uri: &str, body: Option<Value>) -> Answer {
    let builder = Request::builder().method(method).uri(uri);
    let request = match body {
        Some(json) => builder
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(json.to_string())),
        None => builder.body(Body::empty()),
    }
    .unwrap();
    send_request(app, request).await
}

async fn send_request(app: &Router, request: Request<Body>) -> Answer {
    let response = app.clone().oneshot(request).await.unwrap();
    let header_text = |name| {
        response
            .headers()
            .get(name)
            .map(|value: &header::HeaderValue| value.to_str().unwrap().to_owned())
    };
    let retry_after = header_text(header::RETRY_AFTER);
    let content_type = header_text(header::CONTENT_TYPE);
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap()
        .to_vec();
    Answer {
        status,
        retry_after,
        content_type,
        body,
    }
}

async fn get(app: &Router, uri: &str) -> Answer {
    send(app, Method::GET, uri, None).await
}

async fn put_fault(app: &Router, endpoint: &str, fault: Value) -> Answer {
    send(
        app,
        Method::PUT,
        &format!("/_sim/faults/{endpoint}"),
        Some(fault),
    )
    .await
}

fn app() -> (SimState, Router) {
    let state = SimState::new();
    (state.clone(), router(state))
}

#[tokio::test]
async fn same_item_same_body_and_items_differ() {
    let (_, app) = app();
    let first = get(&app, "/v1/coupons/taobao/100001").await;
    let second = get(&app, "/v1/coupons/taobao/100001").await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.content_type.as_deref(), Some("application/json"));
    assert_eq!(first.body, second.body);

    let body = first.json();
    assert_eq!(body["platform"], "taobao");
    assert_eq!(body["item_id"], "100001");
    assert_eq!(body["version"], 1);

    // Over a handful of neighbours, bodies differ from one item to the next.
    let mut bodies = std::collections::HashSet::new();
    for number in 100_001..100_021 {
        bodies.insert(get(&app, &format!("/v1/extras/jd/{number}")).await.body);
    }
    assert_eq!(bodies.len(), 20);
    let taobao = get(&app, "/v1/extras/taobao/100001").await;
    let jd = get(&app, "/v1/extras/jd/100001").await;
    assert_ne!(taobao.json()["sales_30d"], Value::Null);
    assert_ne!(taobao.body, jd.body);
}

#[tokio::test]
async fn coupons_deserialize_into_domain_types_over_many_items() {
    let (_, app) = app();
    let now = Timestamp::now();
    let mut with_coupons = 0;
    for number in 0..2_000u64 {
        let platform = ["taobao", "jd", "pdd"][(number % 3) as usize];
        let answer = get(
            &app,
            &format!("/v1/coupons/{platform}/{}", 500_000 + number),
        )
        .await;
        assert_eq!(answer.status, StatusCode::OK);
        let body: CouponsResponse = serde_json::from_slice(&answer.body).unwrap();
        assert_eq!(body.platform.as_str(), platform);
        let coupons: Vec<Coupon> = body.coupons;
        with_coupons += usize::from(!coupons.is_empty());
        for coupon in coupons {
            let discount = coupon.discount_cents.get();
            let threshold = coupon.threshold_cents.get();
            assert!(
                (300..=5_000).contains(&discount) && discount % 100 == 0,
                "{coupon:?}"
            );
            assert!(threshold % 100 == 0, "{coupon:?}");
            assert!(threshold == 0 || threshold > discount, "{coupon:?}");
            assert!(coupon.expires_at > now, "{coupon:?}");
        }
    }
    assert!((1_200..=1_800).contains(&with_coupons), "{with_coupons}");
}

#[tokio::test]
async fn extras_follow_the_wire_format() {
    let (_, app) = app();
    let answer = get(&app, "/v1/extras/pdd/123456").await;
    assert_eq!(answer.status, StatusCode::OK);
    let json = answer.json();
    let keys: Vec<&str> = json
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(keys.len(), 4, "{json}");
    for key in ["platform", "item_id", "sales_30d", "popular_searches"] {
        assert!(keys.contains(&key), "{json}");
    }
    let body: ExtrasResponse = serde_json::from_value(json).unwrap();
    assert!(body.extras.sales_30d <= 100_000);
    assert!((2..=4).contains(&body.extras.popular_searches.len()));
}

#[tokio::test]
async fn invalid_items_are_refused_with_the_parse_error_and_not_counted() {
    let (state, app) = app();
    let cases = [
        ("/v1/coupons/amazon/100001", "unknown platform \"amazon\""),
        (
            "/v1/extras/jd/12a",
            "item id must contain only ASCII digits",
        ),
        ("/v1/coupons/jd/123456789012345678901", "at most 20 digits"),
        ("/v1/extras/jd/%FF", "UTF-8"),
    ];
    for (uri, expected) in cases {
        let answer = get(&app, uri).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{uri}");
        assert_eq!(answer.error_code(), "invalid_item", "{uri}");
        assert!(
            answer.error_message().contains(expected),
            "{uri}: {}",
            answer.error_message()
        );
    }
    assert_eq!(state.counters(Endpoint::Coupons).calls, 0);
    assert_eq!(state.counters(Endpoint::Extras).calls, 0);
}

#[tokio::test]
async fn outage_answers_503_at_once_even_with_latency() {
    let (state, app) = app();
    let answer = put_fault(
        &app,
        "coupons",
        json!({"outage": true, "latency_ms": 600_000}),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK);
    let answer = tokio::time::timeout(
        Duration::from_secs(5),
        get(&app, "/v1/coupons/taobao/100001"),
    )
    .await
    .expect("an outage answers without the latency");
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(answer.error_code(), "outage");
    // Faults are per endpoint.
    assert_eq!(
        get(&app, "/v1/extras/taobao/100001").await.status,
        StatusCode::OK
    );
    assert_eq!(state.counters(Endpoint::Coupons).outage, 1);
}

#[tokio::test]
async fn rate_limited_answers_429_with_retry_after() {
    let (state, app) = app();
    put_fault(&app, "extras", json!({"rate_limited": true})).await;
    let answer = get(&app, "/v1/extras/jd/100001").await;
    assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(answer.retry_after.as_deref(), Some("1"));
    assert_eq!(answer.error_code(), "rate_limited");
    assert_eq!(state.counters(Endpoint::Extras).rate_limited, 1);
}

#[tokio::test]
async fn error_rate_one_always_answers_500() {
    let (state, app) = app();
    put_fault(&app, "coupons", json!({"error_rate": 1.0})).await;
    for _ in 0..20 {
        let answer = get(&app, "/v1/coupons/pdd/100001").await;
        assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(answer.error_code(), "injected_error");
    }
    assert_eq!(state.counters(Endpoint::Coupons).errors, 20);
}

#[tokio::test]
async fn error_rate_half_fails_about_half_the_calls() {
    let (state, app) = app();
    put_fault(&app, "extras", json!({"error_rate": 0.5})).await;
    let mut failures = 0;
    for number in 0..400 {
        let answer = get(&app, &format!("/v1/extras/jd/{number}")).await;
        match answer.status {
            StatusCode::OK => {}
            StatusCode::INTERNAL_SERVER_ERROR => failures += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    // Binomial(400, 0.5): mean 200, sd 10; this band is 8 sd wide on each side.
    assert!((120..=280).contains(&failures), "{failures}");
    let counters = state.counters(Endpoint::Extras);
    assert_eq!(counters.errors, failures);
    assert_eq!(counters.ok + counters.errors, 400);
}

#[tokio::test(start_paused = true)]
async fn hang_rate_one_never_answers() {
    let (state, app) = app();
    put_fault(&app, "coupons", json!({"hang_rate": 1.0})).await;
    let outcome = tokio::time::timeout(
        Duration::from_secs(24 * 3600),
        get(&app, "/v1/coupons/taobao/100001"),
    )
    .await;
    assert!(outcome.is_err(), "a hung call must not answer");
    assert_eq!(state.counters(Endpoint::Coupons).hung, 1);
    assert_eq!(state.counters(Endpoint::Coupons).ok, 0);
}

#[tokio::test(start_paused = true)]
async fn latency_delays_the_answer_by_that_much() {
    let (_, app) = app();
    put_fault(&app, "extras", json!({"latency_ms": 2_000})).await;

    let too_early = tokio::time::timeout(
        Duration::from_millis(1_999),
        get(&app, "/v1/extras/taobao/100001"),
    )
    .await;
    assert!(too_early.is_err(), "answered before the latency elapsed");

    let started = tokio::time::Instant::now();
    let answer = tokio::time::timeout(
        Duration::from_millis(2_001),
        get(&app, "/v1/extras/taobao/100001"),
    )
    .await
    .expect("answers once the latency elapsed");
    assert_eq!(answer.status, StatusCode::OK);
    assert!(started.elapsed() >= Duration::from_millis(2_000));
}

#[tokio::test]
async fn fault_routes_store_report_and_reset() {
    let (state, app) = app();
    let fault = json!({
        "latency_ms": 0, "latency_jitter_ms": 0, "error_rate": 0.25,
        "hang_rate": 0.2, "rate_limited": false, "outage": false
    });
    let stored = put_fault(
        &app,
        "extras",
        json!({"error_rate": 0.25, "hang_rate": 0.2}),
    )
    .await;
    assert_eq!(stored.status, StatusCode::OK);
    assert_eq!(stored.json(), fault);
    assert_eq!(state.fault(Endpoint::Extras).hang_rate, 0.2);

    let all = get(&app, "/_sim/faults").await.json();
    assert_eq!(all["extras"], fault);
    assert_eq!(all["coupons"], serde_json::to_value(Fault::NONE).unwrap());
    assert_eq!(get(&app, "/_sim/faults/extras").await.json(), fault);

    let reset_one = send(&app, Method::DELETE, "/_sim/faults/extras", None).await;
    assert_eq!(reset_one.status, StatusCode::OK);
    assert_eq!(state.fault(Endpoint::Extras), Fault::NONE);

    put_fault(&app, "coupons", json!({"outage": true})).await;
    put_fault(&app, "extras", json!({"rate_limited": true})).await;
    let reset_all = send(&app, Method::DELETE, "/_sim/faults", None).await;
    assert_eq!(reset_all.status, StatusCode::OK);
    assert_eq!(state.fault(Endpoint::Coupons), Fault::NONE);
    assert_eq!(state.fault(Endpoint::Extras), Fault::NONE);
    assert_eq!(get(&app, "/v1/coupons/jd/1").await.status, StatusCode::OK);
}

#[tokio::test]
async fn invalid_faults_are_refused_naming_the_field() {
    let (state, app) = app();
    let cases = [
        (json!({"error_rate": 1.5}), "error_rate"),
        (json!({"hang_rate": -0.1}), "hang_rate"),
        (json!({"latency_ms": 600_001}), "latency_ms"),
        (
            json!({"latency_jitter_ms": 10_000_000}),
            "latency_jitter_ms",
        ),
        (json!({"latency_ms": -5}), "latency_ms"),
        (json!({"error_rate": "high"}), "error_rate"),
        (json!({"outage": 1}), "outage"),
        (json!({"eror_rate": 0.5}), "eror_rate"),
    ];
    for (body, field) in cases {
        let answer = put_fault(&app, "coupons", body.clone()).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{body}");
        assert!(
            answer.error_message().contains(field),
            "{body}: {}",
            answer.error_message()
        );
        assert!(
            ["invalid_fault", "invalid_body"].contains(&answer.error_code().as_str()),
            "{body}"
        );
    }
    assert_eq!(
        state.fault(Endpoint::Coupons),
        Fault::NONE,
        "nothing was stored"
    );
}

#[tokio::test]
async fn malformed_bodies_get_json_errors() {
    let (_, app) = app();
    let malformed = Request::builder()
        .method(Method::PUT)
        .uri("/_sim/faults/coupons")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from("{\"error_rate\": "))
        .unwrap();
    let answer = send_request(&app, malformed).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert_eq!(answer.error_code(), "invalid_body");

    let not_json = Request::builder()
        .method(Method::PUT)
        .uri("/_sim/faults/coupons")
        .body(Body::from("{}"))
        .unwrap();
    let answer = send_request(&app, not_json).await;
    assert_eq!(answer.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(answer.error_code(), "unsupported_media_type");
}

#[tokio::test]
async fn unknown_endpoints_routes_and_methods_are_json_errors() {
    let (_, app) = app();
    let answer = put_fault(&app, "product", json!({})).await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
    assert_eq!(answer.error_code(), "unknown_endpoint");
    assert!(answer.error_message().contains("product"));
    assert_eq!(
        send(&app, Method::DELETE, "/_sim/faults/product", None)
            .await
            .status,
        StatusCode::NOT_FOUND
    );

    let answer = get(&app, "/v2/coupons/jd/1").await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
    assert_eq!(answer.error_code(), "route_not_found");

    let answer = send(&app, Method::POST, "/v1/coupons/jd/1", None).await;
    assert_eq!(answer.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(answer.error_code(), "method_not_allowed");
}

#[tokio::test]
async fn counters_count_each_outcome_and_reset() {
    let (state, app) = app();
    for _ in 0..3 {
        get(&app, "/v1/coupons/jd/1").await;
    }
    put_fault(&app, "coupons", json!({"error_rate": 1.0})).await;
    get(&app, "/v1/coupons/jd/1").await;
    put_fault(&app, "extras", json!({"outage": true})).await;
    get(&app, "/v1/extras/jd/1").await;
    get(&app, "/v1/extras/jd/1").await;

    let counters = get(&app, "/_sim/counters").await.json();
    assert_eq!(
        counters,
        json!({
            "coupons": {"calls": 4, "ok": 3, "errors": 1, "hung": 0, "rate_limited": 0, "outage": 0},
            "extras": {"calls": 2, "ok": 0, "errors": 0, "hung": 0, "rate_limited": 0, "outage": 2},
        })
    );
    // Control routes are not counted.
    assert_eq!(state.counters(Endpoint::Coupons).calls, 4);

    let reset = send(&app, Method::DELETE, "/_sim/counters", None).await;
    assert_eq!(reset.status, StatusCode::OK);
    let zero = json!({"calls": 0, "ok": 0, "errors": 0, "hung": 0, "rate_limited": 0, "outage": 0});
    assert_eq!(
        get(&app, "/_sim/counters").await.json(),
        json!({"coupons": zero, "extras": zero})
    );
}

#[tokio::test]
async fn bumped_coupon_version_is_served() {
    let (state, app) = app();
    let key = rebate_domain::ItemKey::parse("taobao", "100001").unwrap();
    assert_eq!(state.bump_coupon_version(key), 2);
    let body: CouponsResponse =
        serde_json::from_slice(&get(&app, "/v1/coupons/taobao/100001").await.body).unwrap();
    assert_eq!(body.version, 2);
    assert!(
        body.coupons
            .iter()
            .all(|coupon| coupon.coupon_id.starts_with("tb-100001-v2-"))
    );
    let other: CouponsResponse =
        serde_json::from_slice(&get(&app, "/v1/coupons/taobao/100002").await.body).unwrap();
    assert_eq!(other.version, 1);
}

#[tokio::test]
async fn healthz_says_ok() {
    let (_, app) = app();
    let answer = get(&app, "/healthz").await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.body, b"ok");
}
