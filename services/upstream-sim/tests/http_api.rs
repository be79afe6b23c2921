//! Drives `router()` in-process with `oneshot`: data, faults, control routes and counters.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use rebate_domain::{Coupon, Timestamp};
use serde_json::{Value, json};
use tower::ServiceExt;
use upstream_sim::{
    BatchResponse, CounterSnapshot, CouponsResponse, Endpoint, ExtrasResponse, Fault,
    MAX_BATCH_ITEMS, MAX_BODY_BYTES, SimState, router,
};

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

/// `(platform, item_id)` pairs as batch items; invalid ones are kept as they are.
fn keys(pairs: &[(&str, &str)]) -> Vec<Value> {
    pairs
        .iter()
        .map(|(platform, item_id)| json!({"platform": platform, "item_id": item_id}))
        .collect()
}

async fn post_batch(app: &Router, endpoint: &str, items: &[Value]) -> Answer {
    send(
        app,
        Method::POST,
        &format!("/v1/{endpoint}:batch"),
        Some(json!({ "items": items })),
    )
    .await
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

// Paused, so that every call arrives at the same instant and the peak rate is exact.
#[tokio::test(start_paused = true)]
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

    post_batch(
        &app,
        "extras",
        &keys(&[("jd", "1"), ("jd", "2"), ("pdd", "3")]),
    )
    .await;

    let counters = get(&app, "/_sim/counters").await.json();
    assert_eq!(
        counters,
        json!({
            "coupons": {
                "calls": 4, "items": 4, "batch_calls": 0, "peak_calls_per_sec": 4,
                "ok": 3, "errors": 1, "hung": 0, "rate_limited": 0, "outage": 0
            },
            "extras": {
                "calls": 3, "items": 5, "batch_calls": 1, "peak_calls_per_sec": 3,
                "ok": 0, "errors": 0, "hung": 0, "rate_limited": 0, "outage": 3
            },
        })
    );
    // Control routes are not counted.
    assert_eq!(state.counters(Endpoint::Coupons).calls, 4);

    let reset = send(&app, Method::DELETE, "/_sim/counters", None).await;
    assert_eq!(reset.status, StatusCode::OK);
    let zero = json!({
        "calls": 0, "items": 0, "batch_calls": 0, "peak_calls_per_sec": 0,
        "ok": 0, "errors": 0, "hung": 0, "rate_limited": 0, "outage": 0
    });
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

#[tokio::test]
async fn batch_answers_equal_the_single_answers_in_request_order() {
    let (state, app) = app();
    let pairs = [
        ("taobao", "100001"),
        ("jd", "100002"),
        ("pdd", "007"),
        ("taobao", "100001"),
        ("jd", "12345678901234567890"),
    ];
    // A bumped version shows in the batch as in the single answer.
    state.bump_coupon_version(rebate_domain::ItemKey::parse("jd", "100002").unwrap());
    for endpoint in ["coupons", "extras"] {
        let answer = post_batch(&app, endpoint, &keys(&pairs)).await;
        assert_eq!(answer.status, StatusCode::OK, "{endpoint}");
        assert_eq!(answer.content_type.as_deref(), Some("application/json"));
        let batch = answer.json();
        assert_eq!(batch.as_object().unwrap().len(), 1, "{batch}");
        let items = batch["items"].as_array().unwrap();
        assert_eq!(
            items.len(),
            pairs.len(),
            "duplicates are answered each time"
        );
        for ((platform, item_id), item) in pairs.iter().zip(items) {
            let single = get(&app, &format!("/v1/{endpoint}/{platform}/{item_id}")).await;
            assert_eq!(*item, single.json(), "{endpoint} {platform}/{item_id}");
        }
    }
    // The typed bodies read back as the single routes' types.
    let coupons: BatchResponse<CouponsResponse> =
        serde_json::from_slice(&post_batch(&app, "coupons", &keys(&pairs)).await.body).unwrap();
    assert_eq!(coupons.items[1].version, 2);
    assert_eq!(coupons.items[2].item_id.as_str(), "007");
    let extras: BatchResponse<ExtrasResponse> =
        serde_json::from_slice(&post_batch(&app, "extras", &keys(&pairs)).await.body).unwrap();
    assert_eq!(extras.items[0], extras.items[3]);
}

#[tokio::test]
async fn batch_routes_match_only_their_exact_path_and_method() {
    let (state, app) = app();
    let one = keys(&[("jd", "1")]);
    assert_eq!(
        post_batch(&app, "coupons", &one).await.status,
        StatusCode::OK
    );
    assert_eq!(
        post_batch(&app, "extras", &one).await.status,
        StatusCode::OK
    );
    assert_eq!(state.counters(Endpoint::Coupons).batch_calls, 1);
    assert_eq!(state.counters(Endpoint::Extras).batch_calls, 1);

    let answer = get(&app, "/v1/coupons:batch").await;
    assert_eq!(answer.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(answer.error_code(), "method_not_allowed");
    for uri in [
        "/v1/coupons:batches",
        "/v1/coupons/batch",
        "/v1/products:batch",
        "/v1/:batch",
    ] {
        let body = Some(json!({ "items": one }));
        let answer = send(&app, Method::POST, uri, body).await;
        assert_eq!(answer.status, StatusCode::NOT_FOUND, "{uri}");
        assert_eq!(answer.error_code(), "route_not_found", "{uri}");
    }
    // The single-item routes are untouched by the literal colon next to them.
    assert_eq!(get(&app, "/v1/coupons/jd/1").await.status, StatusCode::OK);
}

#[tokio::test]
async fn invalid_batches_are_refused_naming_the_problem_and_not_counted() {
    let (state, app) = app();
    let cases = [
        (
            keys(&[("jd", "1"), ("taobao", "2"), ("amazon", "3")]),
            "invalid_item",
            r#"items[2]: unknown platform "amazon""#,
        ),
        (
            keys(&[("jd", "12a"), ("amazon", "3")]),
            "invalid_item",
            "items[0]: item id must contain only ASCII digits",
        ),
        (
            keys(&[("jd", "1"), ("jd", "123456789012345678901")]),
            "invalid_item",
            "items[1]: item id is 21 bytes long",
        ),
        (
            keys(&[("jd", "1"), ("pdd", "")]),
            "invalid_item",
            "items[1]: item id must not be empty",
        ),
        (Vec::new(), "invalid_body", "items must not be empty"),
        (
            vec![json!({"platform": "jd"})],
            "invalid_body",
            "missing field `item_id`",
        ),
        (
            vec![json!({"platform": "jd", "item_id": 100001})],
            "invalid_body",
            "item_id",
        ),
    ];
    for (items, code, message) in cases {
        for endpoint in ["coupons", "extras"] {
            let answer = post_batch(&app, endpoint, &items).await;
            assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{items:?}");
            assert_eq!(answer.error_code(), code, "{items:?}");
            assert!(
                answer.error_message().contains(message),
                "{items:?}: {}",
                answer.error_message()
            );
        }
    }

    for body in [r#"{"items": [{"platform": "jd", "#, r#"{"keys": []}"#, "[]"] {
        let request = Request::builder()
            .method(Method::POST)
            .uri("/v1/coupons:batch")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body))
            .unwrap();
        let answer = send_request(&app, request).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(answer.error_code(), "invalid_body", "{body}");
    }

    let without_content_type = Request::builder()
        .method(Method::POST)
        .uri("/v1/extras:batch")
        .body(Body::from(
            json!({ "items": keys(&[("jd", "1")]) }).to_string(),
        ))
        .unwrap();
    let answer = send_request(&app, without_content_type).await;
    assert_eq!(answer.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(answer.error_code(), "unsupported_media_type");

    assert_eq!(state.all_counters().coupons, CounterSnapshot::default());
    assert_eq!(state.all_counters().extras, CounterSnapshot::default());
}

/// `count` distinct valid keys.
fn many_keys(count: usize) -> Vec<Value> {
    (0..count)
        .map(|number| json!({"platform": "pdd", "item_id": (100_000 + number).to_string()}))
        .collect()
}

#[tokio::test]
async fn batches_over_the_limit_are_refused_and_the_limit_can_change() {
    let (state, app) = app();
    assert_eq!(MAX_BATCH_ITEMS, 40);
    let answer = post_batch(&app, "coupons", &many_keys(41)).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert_eq!(answer.error_code(), "too_many_items");
    assert_eq!(
        answer.error_message(),
        "41 items in one call; at most 40 are allowed"
    );
    assert_eq!(state.counters(Endpoint::Coupons).calls, 0);
    let answer = post_batch(&app, "coupons", &many_keys(40)).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.json()["items"].as_array().unwrap().len(), 40);

    state.set_max_batch_items(5).unwrap();
    assert_eq!(
        post_batch(&app, "extras", &many_keys(6)).await.error_code(),
        "too_many_items"
    );
    assert_eq!(
        post_batch(&app, "extras", &many_keys(5)).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn the_largest_batch_is_served_and_larger_bodies_get_413() {
    let (state, app) = app();
    state.set_max_batch_items(1_000).unwrap();
    let longest: Vec<Value> = (0..1_000u64)
        .map(|number| json!({"platform": "taobao", "item_id": format!("{:020}", number)}))
        .collect();
    let answer = post_batch(&app, "extras", &longest).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.json()["items"].as_array().unwrap().len(), 1_000);
    assert_eq!(state.counters(Endpoint::Extras).items, 1_000);

    // Valid JSON padded past the cap: refused before it is parsed, let alone counted.
    let padded = format!(
        r#"{{"items": [{{"platform": "jd", "item_id": "1"}}]{}}}"#,
        " ".repeat(MAX_BODY_BYTES)
    );
    for uri in ["/v1/coupons:batch", "/_sim/faults/coupons"] {
        let method = if uri.starts_with("/_sim") {
            Method::PUT
        } else {
            Method::POST
        };
        let request = Request::builder()
            .method(method)
            .uri(uri)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(padded.clone()))
            .unwrap();
        let answer = send_request(&app, request).await;
        assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE, "{uri}");
        assert_eq!(answer.error_code(), "payload_too_large", "{uri}");
        assert_eq!(
            answer.error_message(),
            format!("the request body is over {MAX_BODY_BYTES} bytes")
        );
    }
    assert_eq!(state.counters(Endpoint::Coupons).calls, 0);
}

#[tokio::test(start_paused = true)]
async fn a_fault_applies_once_per_batch() {
    let (state, app) = app();
    let items = many_keys(12);

    put_fault(&app, "coupons", json!({"error_rate": 1.0})).await;
    let answer = post_batch(&app, "coupons", &items).await;
    assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(answer.error_code(), "injected_error");
    assert_eq!(
        state.counters(Endpoint::Coupons),
        CounterSnapshot {
            calls: 1,
            items: 12,
            batch_calls: 1,
            peak_calls_per_sec: 1,
            errors: 1,
            ..CounterSnapshot::default()
        }
    );

    put_fault(&app, "coupons", json!({"rate_limited": true})).await;
    let answer = post_batch(&app, "coupons", &items).await;
    assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(answer.retry_after.as_deref(), Some("1"));
    put_fault(&app, "coupons", json!({"outage": true})).await;
    let answer = post_batch(&app, "coupons", &items).await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(answer.error_code(), "outage");
    let counters = state.counters(Endpoint::Coupons);
    assert_eq!(
        (counters.calls, counters.items, counters.batch_calls),
        (3, 36, 3)
    );
    assert_eq!((counters.rate_limited, counters.outage), (1, 1));

    // The latency is waited once for the whole batch, not once per item.
    put_fault(&app, "extras", json!({"latency_ms": 2_000})).await;
    let started = tokio::time::Instant::now();
    let answer = tokio::time::timeout(
        Duration::from_millis(2_001),
        post_batch(&app, "extras", &items),
    )
    .await
    .expect("one latency for the whole batch");
    assert_eq!(answer.status, StatusCode::OK);
    assert!(started.elapsed() >= Duration::from_millis(2_000));

    // A hang holds the whole batch.
    put_fault(&app, "extras", json!({"hang_rate": 1.0})).await;
    let outcome = tokio::time::timeout(
        Duration::from_secs(24 * 3600),
        post_batch(&app, "extras", &items),
    )
    .await;
    assert!(outcome.is_err(), "a hung batch must not answer");
    let counters = state.counters(Endpoint::Extras);
    assert_eq!(
        (counters.calls, counters.items, counters.batch_calls),
        (2, 24, 2)
    );
    assert_eq!((counters.ok, counters.hung), (1, 1));
}

/// Moves the paused clock to `offset_ms` after `start`, then makes `singles` single calls and
/// `batches` batch calls of three items to the coupon API, whatever they are answered.
async fn burst_at(
    app: &Router,
    start: tokio::time::Instant,
    offset_ms: u64,
    singles: usize,
    batches: usize,
) {
    let target = start + Duration::from_millis(offset_ms);
    tokio::time::advance(target.duration_since(tokio::time::Instant::now())).await;
    for _ in 0..singles {
        get(app, "/v1/coupons/jd/1").await;
    }
    let three = keys(&[("jd", "1"), ("jd", "2"), ("jd", "3")]);
    for _ in 0..batches {
        post_batch(app, "coupons", &three).await;
    }
}

#[tokio::test(start_paused = true)]
async fn peak_rate_counts_calls_in_a_sliding_second() {
    let (state, app) = app();
    let start = tokio::time::Instant::now();
    let peak = |state: &SimState| state.counters(Endpoint::Coupons).peak_calls_per_sec;

    // 30 calls at 0.6 s and 30 at 1.4 s: one sliding second holds all 60, though no aligned
    // second holds more than 30. A batch counts once, however many items it carries.
    burst_at(&app, start, 600, 20, 10).await;
    burst_at(&app, start, 1_400, 10, 20).await;
    assert_eq!(peak(&state), 60);
    // Bursts more than a second apart are never counted together.
    burst_at(&app, start, 3_000, 40, 0).await;
    burst_at(&app, start, 4_100, 0, 40).await;
    assert_eq!(peak(&state), 60);
    let counters = state.counters(Endpoint::Coupons);
    assert_eq!(counters.calls, 140);
    assert_eq!(counters.items, 70 + 70 * 3);
    assert_eq!(counters.batch_calls, 70);
    assert_eq!(counters.ok, 140);
    // Every outcome counts, refusals included.
    put_fault(&app, "coupons", json!({"outage": true})).await;
    burst_at(&app, start, 4_500, 25, 0).await;
    assert_eq!(state.counters(Endpoint::Coupons).outage, 25);
    assert_eq!(peak(&state), 65);

    let reset = send(&app, Method::DELETE, "/_sim/counters", None).await;
    assert_eq!(reset.json()["coupons"]["peak_calls_per_sec"], 0);
    // The arrivals before the reset are forgotten too.
    burst_at(&app, start, 4_600, 3, 0).await;
    assert_eq!(peak(&state), 3);
}
