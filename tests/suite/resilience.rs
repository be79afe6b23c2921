//! Protection against the real service: breakers, bulkheads, quotas and retries against the
//! upstream simulator's faults; the three shed levels; the per-client limit; the admin status.
//! Breaker cool-downs pass on the test's ticker, never by sleeping.

use std::time::{Duration, Instant};

use futures::future::join_all;
use query_api::Settings;
use rebate_tests::{TestApp, spawn_app_with};
use serde_json::{Value, json};
use upstream_sim::{Endpoint, Fault};

async fn json_of(response: reqwest::Response) -> Value {
    response.json().await.expect("a JSON body")
}

/// The coupon part's degradation in a quote, as `(served, reason)`, or `None` when live.
fn coupon_degradation(quote: &Value) -> Option<(String, String)> {
    quote["degraded_parts"]
        .as_array()
        .expect("degraded_parts")
        .iter()
        .find(|part| part["part"] == "coupons")
        .map(|part| {
            (
                part["served"].as_str().unwrap().to_owned(),
                part["reason"].as_str().unwrap().to_owned(),
            )
        })
}

fn assert_core_intact(quote: &Value) {
    assert_eq!(quote["rebate"]["source"], "live", "{quote}");
    assert!(quote["rebate"]["rate_bps"].is_u64(), "{quote}");
    assert!(quote["item"]["title"].is_string(), "{quote}");
}

async fn coupon_breaker(app: &TestApp) -> Value {
    let status = json_of(app.admin_get("/admin/v1/status").await).await;
    status["protection"]["dependencies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|dependency| dependency["name"] == "coupons")
        .expect("the coupon dependency is in the status")["breaker"]
        .clone()
}

/// The coupon breaker once it reaches `state`, or as it is after two seconds: loads record their
/// outcome a moment after the callers that gave up on them have been answered.
async fn settled_breaker(app: &TestApp, state: &str) -> Value {
    for _ in 0..200 {
        let breaker = coupon_breaker(app).await;
        if breaker["state"] == state {
            return breaker;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    coupon_breaker(app).await
}

/// One upstream call per item, as for an API without a batch route: the tests of a guard's
/// per-call rules (a breaker counting calls, a bulkhead's slots) need concurrent loads to be
/// concurrent calls rather than one batch.
fn one_call_per_item(settings: &mut Settings) {
    settings.upstreams.coupons_batch_max_items = 1;
    settings.upstreams.extras_batch_max_items = 1;
}

/// Quotes `ids` concurrently (each a cold item) and returns each body with its latency.
async fn quote_all(app: &TestApp, ids: impl Iterator<Item = u64>) -> Vec<(Value, Duration)> {
    join_all(ids.map(|id| async move {
        let started = Instant::now();
        let response = app.get_item("jd", &id.to_string()).await;
        assert_eq!(response.status(), 200);
        (json_of(response).await, started.elapsed())
    }))
    .await
}

#[tokio::test]
async fn a_slow_coupon_api_trips_its_breaker_relieves_it_and_recovers_without_a_second_trip() {
    let app = spawn_app_with(|settings| {
        one_call_per_item(settings);
        settings.resilience.coupons.min_calls = Some(10);
    })
    .await;
    // 800 ms latency, 20 % of calls hanging: every call overruns the 500 ms coupon tier.
    app.set_upstream_fault(
        Endpoint::Coupons,
        Fault {
            latency_ms: 800,
            hang_rate: 0.2,
            ..Fault::default()
        },
    );

    // Wave 1: twelve cold items at once. Each waits the coupon tier, then degrades.
    let wave = quote_all(&app, 100_001..100_013).await;
    for (quote, latency) in &wave {
        assert_core_intact(quote);
        assert_eq!(
            coupon_degradation(quote),
            Some(("template".to_owned(), "timeout".to_owned()))
        );
        // The coupon tier (500 ms) plus a margin for this 2-core machine.
        assert!(*latency < Duration::from_millis(900), "{latency:?}");
    }
    // Each load's own attempt timeout fires a moment after its caller stopped waiting.
    let breaker = settled_breaker(&app, "open").await;
    assert_eq!(breaker["state"], "open", "{breaker}");
    let calls_when_open = app.upstream_calls(Endpoint::Coupons);
    assert_eq!(calls_when_open, 12);

    // Wave 2: the breaker answers for the API at once; the API sees no call.
    let wave = quote_all(&app, 100_101..100_131).await;
    for (quote, latency) in &wave {
        assert_core_intact(quote);
        assert_eq!(
            coupon_degradation(quote),
            Some(("template".to_owned(), "breaker_open".to_owned()))
        );
        assert!(*latency < Duration::from_millis(400), "{latency:?}");
    }
    assert_eq!(app.upstream_calls(Endpoint::Coupons), calls_when_open);

    // The API heals; after the cool-down the breaker probes 1, 2, then 4 calls and closes.
    app.set_upstream_fault(Endpoint::Coupons, Fault::default());
    app.ticker.advance(Duration::from_secs(5));
    for id in 100_201..100_211u64 {
        let quote = json_of(app.get_item("jd", &id.to_string()).await).await;
        assert_core_intact(&quote);
        assert_eq!(coupon_degradation(&quote), None, "{quote}");
    }
    let breaker = coupon_breaker(&app).await;
    assert_eq!(breaker["state"], "closed", "{breaker}");
    assert_eq!(breaker["trips"], 1, "{breaker}");
    assert_eq!(app.upstream_calls(Endpoint::Coupons), calls_when_open + 10);
    app.stop().await;
}

#[tokio::test]
async fn a_failing_api_costs_at_most_three_attempts_per_request_and_a_tenth_more_overall() {
    let app = spawn_app_with(|settings| {
        settings.resilience.retry.base_backoff_ms = 1;
        settings.resilience.retry.max_backoff_ms = 2;
    })
    .await;
    app.break_upstream(Endpoint::Coupons);
    let requests = 60u64;
    let mut most = 0;
    for id in 100_001..100_001 + requests {
        let before = app.upstream_calls(Endpoint::Coupons);
        let quote = json_of(app.get_item("jd", &id.to_string()).await).await;
        assert_core_intact(&quote);
        let (served, reason) = coupon_degradation(&quote).expect("coupons degraded");
        assert_eq!(served, "template");
        assert!(reason == "error" || reason == "breaker_open", "{reason}");
        most = most.max(app.upstream_calls(Endpoint::Coupons) - before);
    }
    let calls = app.upstream_calls(Endpoint::Coupons);
    assert!(most <= 3, "{most} attempts for one request");
    assert!(
        calls as f64 <= 1.1 * requests as f64,
        "{calls} upstream calls for {requests} requests"
    );
    let breaker = settled_breaker(&app, "open").await;
    assert_eq!(breaker["state"], "open", "{breaker}");
    app.stop().await;
}

#[tokio::test]
async fn a_full_bulkhead_and_a_spent_quota_degrade_at_once() {
    let app = spawn_app_with(|settings| {
        one_call_per_item(settings);
        settings.resilience.coupons.max_concurrent = 2;
        settings.resilience.extras.quota_per_sec = Some(1.0);
        settings.resilience.extras.quota_burst = Some(3);
    })
    .await;
    app.slow_upstream(Endpoint::Coupons, 200);
    let wave = quote_all(&app, 100_001..100_007).await;
    let reasons: Vec<Option<(String, String)>> = wave
        .iter()
        .map(|(quote, _)| coupon_degradation(quote))
        .collect();
    let live = reasons.iter().filter(|reason| reason.is_none()).count();
    let full = reasons
        .iter()
        .filter(|reason| {
            reason
                .as_ref()
                .is_some_and(|(_, reason)| reason == "bulkhead_full")
        })
        .count();
    assert_eq!((live, full), (2, 4), "{reasons:?}");
    assert_eq!(app.upstream_calls(Endpoint::Coupons), 2);

    // Six extras loads against a burst of 3 (the ticker does not move: no refill).
    let quota_refused = wave
        .iter()
        .filter(|(quote, _)| {
            quote["degraded_parts"]
                .as_array()
                .unwrap()
                .iter()
                .any(|part| part["part"] == "extras" && part["reason"] == "quota")
        })
        .count();
    assert_eq!(quota_refused, 3);
    assert_eq!(app.upstream_calls(Endpoint::Extras), 3);
    app.stop().await;
}

#[tokio::test]
async fn each_shed_level_gives_up_what_it_should() {
    // Strict cache-only at level 3: no warming loads (see the next test for those).
    let app = spawn_app_with(|settings| settings.engine.cache_only_loads = 0).await;
    // Warm one item at level 0.
    assert_eq!(app.get_item("jd", "100001").await.status(), 200);
    let coupons_before = app.upstream_calls(Endpoint::Coupons);
    let extras_before = app.upstream_calls(Endpoint::Extras);

    // Level 1: a cold item gets everything but extras, and extras are not called.
    let forced = app
        .admin_put("/admin/v1/shedding", &json!({"level": "drop_extras"}))
        .await;
    assert_eq!(forced.status(), 200);
    let response = app.get_item("jd", "100002").await;
    assert_eq!(response.headers()["x-shed-level"], "1");
    let quote = json_of(response).await;
    assert_core_intact(&quote);
    assert_eq!(quote["extras"], Value::Null);
    assert!(
        quote["degraded_parts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|part| part["part"] == "extras" && part["reason"] == "shed")
    );
    assert_eq!(app.upstream_calls(Endpoint::Extras), extras_before);
    assert_eq!(app.upstream_calls(Endpoint::Coupons), coupons_before + 1);

    // Level 2: the coupon tier is halved (500 → 250 ms).
    app.slow_upstream(Endpoint::Coupons, 400);
    app.admin_put("/admin/v1/shedding", &json!({"level": "short_timeouts"}))
        .await;
    let started = Instant::now();
    let quote = json_of(app.get_item("jd", "100003").await).await;
    let latency = started.elapsed();
    assert_core_intact(&quote);
    assert_eq!(
        coupon_degradation(&quote),
        Some(("template".to_owned(), "timeout".to_owned()))
    );
    assert!(latency < Duration::from_millis(390), "{latency:?}");

    // Level 3: cached items are served from L1; a cold one is 503 with a jittered Retry-After.
    app.admin_put("/admin/v1/shedding", &json!({"level": "cache_only"}))
        .await;
    let loads_before = app.product_loads();
    let response = app.get_item("jd", "100001").await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-shed-level"], "3");
    let quote = json_of(response).await;
    assert_eq!(quote["degraded"], false, "{quote}");
    let response = app.get_item("jd", "100009").await;
    assert_eq!(response.status(), 503);
    let retry_after: u32 = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=5).contains(&retry_after), "{retry_after}");
    let body = response.bytes().await.unwrap();
    assert!(body.len() < 200, "{} bytes", body.len());
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["error"]["code"], "overloaded");
    assert_eq!(app.product_loads(), loads_before);

    // A batch at level 3: per-item answers, the cold one 503.
    let batch = json_of(
        app.post_batch(&json!({"items": [
            {"platform": "jd", "item_id": "100001"},
            {"platform": "jd", "item_id": "100010"},
        ]}))
        .await,
    )
    .await;
    assert_eq!(batch["results"][0]["status"], 200);
    assert_eq!(batch["results"][1]["status"], 503);
    assert_eq!(batch["results"][1]["error"]["code"], "overloaded");

    // Back to the measured level.
    app.admin_put("/admin/v1/shedding", &json!({"level": null}))
        .await;
    let response = app.get_item("jd", "100009").await;
    assert_eq!(response.status(), 200);
    assert!(response.headers().get("x-shed-level").is_none());
    app.stop().await;
}

#[tokio::test]
async fn level_three_still_warms_a_cold_item_under_one_of_its_permits() {
    let app = spawn_app_with(|settings| settings.engine.cache_only_loads = 1).await;
    app.admin_put("/admin/v1/shedding", &json!({"level": "cache_only"}))
        .await;
    let loads_before = app.product_loads();
    // Nothing cached for this item: it loads at level 2 (short timeouts, extras off).
    let response = app.get_item("jd", "100011").await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-shed-level"], "3");
    let quote = json_of(response).await;
    assert!(
        quote["degraded_parts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|part| part["part"] == "extras" && part["reason"] == "shed"),
        "{quote}"
    );
    assert_eq!(app.product_loads(), loads_before + 1);
    // Now cached: answered from L1 without a permit or a load.
    assert_eq!(app.get_item("jd", "100011").await.status(), 200);
    assert_eq!(app.product_loads(), loads_before + 1);
    let status = json_of(app.admin_get("/admin/v1/status").await).await;
    assert_eq!(status["cache_only_loads"]["capacity"], 1);
    assert_eq!(status["cache_only_loads"]["started"], 1);
    assert_eq!(status["cache_only_loads"]["refused"], 0);
    app.stop().await;
}

/// The per-client limit on, at three requests and then one a second.
async fn spawn_app_with_a_tight_client_limit() -> TestApp {
    spawn_app_with(|settings| {
        settings.resilience.client_limit.enabled = true;
        settings.resilience.client_limit.per_sec = 1.0;
        settings.resilience.client_limit.burst = 3;
    })
    .await
}

#[tokio::test]
async fn clients_over_their_limit_get_429_with_retry_after() {
    let app = spawn_app_with_a_tight_client_limit().await;
    let get = |client_id: &'static str| {
        app.client
            .get(app.item_url("jd", "100001"))
            .header("x-client-id", client_id)
            .send()
    };
    for _ in 0..3 {
        assert_eq!(get("app-ios").await.unwrap().status(), 200);
    }
    let refused = get("app-ios").await.unwrap();
    assert_eq!(refused.status(), 429);
    assert_eq!(refused.headers()["retry-after"], "1");
    let body = json_of(refused).await;
    assert_eq!(body["error"]["code"], "rate_limited");
    assert!(body["trace_id"].is_string());
    // Another client has a bucket of its own; so does the peer address without a client id.
    assert_eq!(get("h5-web").await.unwrap().status(), 200);
    assert_eq!(app.get_item("jd", "100001").await.status(), 200);
    // A token comes back after a second.
    app.ticker.advance(Duration::from_secs(1));
    assert_eq!(get("app-ios").await.unwrap().status(), 200);

    let malformed = app
        .client
        .get(app.item_url("jd", "100001"))
        .header("x-client-id", "has spaces")
        .send()
        .await
        .unwrap();
    assert_eq!(malformed.status(), 400);
    assert_eq!(
        json_of(malformed).await["error"]["code"],
        "invalid_client_id"
    );
    app.stop().await;
}

/// Without a client id the bucket is the peer's address: the hot path (a cached single item)
/// and the general path (a batch) see the same address and share its bucket, and another
/// address (127.0.0.2, also loopback) has its own.
#[tokio::test]
async fn clients_without_an_id_are_limited_by_their_address_on_both_paths() {
    let app = spawn_app_with_a_tight_client_limit().await;
    let from = |address: [u8; 4]| {
        reqwest::Client::builder()
            .local_address(std::net::IpAddr::from(address))
            .build()
            .unwrap()
    };
    let (first, second) = (from([127, 0, 0, 1]), from([127, 0, 0, 2]));
    let item = app.item_url("jd", "100001");
    // Two single items (the second from the kept rendering: the hot path) and one batch.
    for _ in 0..2 {
        assert_eq!(first.get(&item).send().await.unwrap().status(), 200);
    }
    let batch = first
        .post(format!("{}/api/v1/items:batch", app.base_url))
        .json(&json!({"items": [{"platform": "jd", "item_id": "100001"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(batch.status(), 200);
    // The address's three tokens are spent, whichever path spent them.
    let refused = first.get(&item).send().await.unwrap();
    assert_eq!(refused.status(), 429);
    assert_eq!(refused.headers()["retry-after"], "1");
    // Another address is another client.
    assert_eq!(second.get(&item).send().await.unwrap().status(), 200);
    app.stop().await;
}

#[tokio::test]
async fn the_admin_status_shows_levels_breakers_and_thresholds_behind_a_token() {
    let app = spawn_app_with(|settings| {
        settings.resilience.coupons.quota_per_sec = Some(45.0);
    })
    .await;
    let anonymous = app
        .client
        .get(format!("{}/admin/v1/status", app.admin_url))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);

    let status = json_of(app.admin_get("/admin/v1/status").await).await;
    assert_eq!(status["shed_level"], "normal");
    let protection = &status["protection"];
    assert_eq!(
        protection["shedding"]["thresholds"],
        json!([0.7, 0.85, 1.0])
    );
    let names: Vec<&str> = protection["dependencies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|dependency| dependency["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["mysql", "redis", "coupons", "extras"]);
    let coupons = &protection["dependencies"][2];
    assert_eq!(coupons["breaker"]["state"], "closed");
    assert_eq!(coupons["quota"]["per_second"], 45.0);
    assert_eq!(coupons["retry"]["max_per_request"], 2);
    assert!(status["caches"]["product"]["hits"].is_u64());

    let bad = app
        .admin_put("/admin/v1/shedding", &json!({"level": "panic"}))
        .await;
    assert_eq!(bad.status(), 400);
    app.stop().await;
}

#[tokio::test]
async fn measured_load_walks_the_shed_levels_up_and_back_down_one_dwell_at_a_time() {
    let app = spawn_app_with(|settings| {
        let shedding = &mut settings.resilience.shedding;
        shedding.capacity_rps = 100;
        shedding.interval_ms = 250;
        shedding.min_dwell_ms = 2_000;
        settings.engine.cache_only_loads = 0;
    })
    .await;
    let level_of = |response: &reqwest::Response| {
        response
            .headers()
            .get("x-shed-level")
            .map_or(0, |level| level.to_str().unwrap().parse::<u8>().unwrap())
    };
    // 40 requests inside one 250 ms interval: 160 requests/s against a capacity of 100.
    for _ in 0..40 {
        let response = app.get_item("jd", "100001").await;
        assert_eq!(level_of(&response), 0);
    }
    app.ticker.advance(Duration::from_millis(250));
    let response = app.get_item("jd", "100001").await;
    assert_eq!(level_of(&response), 3);
    assert_eq!(response.status(), 200, "a cached item is still served");
    let cold = app.get_item("jd", "100777").await;
    assert_eq!((cold.status().as_u16(), level_of(&cold)), (503, 3));

    // Quiet: each dwell steps down one level, never more.
    let mut seen = Vec::new();
    for _ in 0..4 {
        app.ticker.advance(Duration::from_secs(2));
        seen.push(level_of(&app.get_item("jd", "100001").await));
    }
    assert_eq!(seen, [2, 1, 0, 0]);
    let status = json_of(app.admin_get("/admin/v1/status").await).await;
    assert_eq!(status["shed_level"], "normal");
    app.stop().await;
}

#[tokio::test]
async fn a_batch_spends_one_request_allowance_of_retries() {
    let app = spawn_app_with(|settings| {
        one_call_per_item(settings);
        // Only the per-request allowance may limit retries here.
        settings.resilience.retry.ratio = 1.0;
        settings.resilience.retry.max_saved = 1_000;
        settings.resilience.retry.base_backoff_ms = 1;
        settings.resilience.retry.max_backoff_ms = 2;
        settings.resilience.coupons.min_calls = Some(1_000);
    })
    .await;
    // Earn the global budget some tokens first.
    for id in 100_001..100_021u64 {
        assert_eq!(app.get_item("jd", &id.to_string()).await.status(), 200);
    }
    // Ten first attempts and at most two retries for the whole batch.
    let calls = coupon_calls_of_a_batch_of_ten_while_broken(&app).await;
    assert!((10..=12).contains(&calls), "{calls} coupon calls");
    app.stop().await;
}

/// Breaks the coupon API, asks a batch of ten cold items (each answered, with coupons
/// degraded) and returns the coupon calls it cost.
async fn coupon_calls_of_a_batch_of_ten_while_broken(app: &TestApp) -> u64 {
    app.break_upstream(Endpoint::Coupons);
    let before = app.upstream_calls(Endpoint::Coupons);
    let items: Vec<Value> = (100_101..100_111u64)
        .map(|id| json!({"platform": "jd", "item_id": id.to_string()}))
        .collect();
    let batch = json_of(app.post_batch(&json!({ "items": items })).await).await;
    for result in batch["results"].as_array().unwrap() {
        assert_eq!(result["status"], 200);
    }
    app.upstream_calls(Endpoint::Coupons) - before
}

#[tokio::test]
async fn shortened_timeouts_still_count_against_the_breaker() {
    let app = spawn_app_with(|settings| {
        one_call_per_item(settings);
        settings.resilience.coupons.min_calls = Some(5);
    })
    .await;
    app.slow_upstream(Endpoint::Coupons, 400);
    app.admin_put("/admin/v1/shedding", &json!({"level": "short_timeouts"}))
        .await;
    // Five cold items time out at the halved coupon tier (250 ms): the breaker hears of each.
    for (quote, _) in quote_all(&app, 100_001..100_006).await {
        assert_eq!(
            coupon_degradation(&quote),
            Some(("template".to_owned(), "timeout".to_owned()))
        );
    }
    let breaker = settled_breaker(&app, "open").await;
    assert_eq!(breaker["state"], "open", "{breaker}");
    app.stop().await;
}

/// Concurrent cold loads of one API are one batch call: a quota of one call a second answers
/// twelve cold items, and a request batch of ten spends one call (and at most its two retries).
#[tokio::test]
async fn concurrent_cold_items_share_one_upstream_call_and_one_quota_token() {
    let app = spawn_app_with(|settings| {
        settings.resilience.extras.quota_per_sec = Some(1.0);
        settings.resilience.extras.quota_burst = Some(1);
        // Long enough on this shared machine for twelve requests' loads to meet.
        settings.upstreams.batch_window_ms = 50;
    })
    .await;
    let wave = quote_all(&app, 100_001..100_013).await;
    for (quote, _) in &wave {
        assert_core_intact(quote);
        assert_eq!(quote["degraded"], false, "{quote}");
    }
    let extras = app.simulator.counters(Endpoint::Extras);
    assert_eq!((extras.calls, extras.items), (1, 12), "{extras:?}");
    let coupons = app.simulator.counters(Endpoint::Coupons);
    assert!(coupons.calls <= 2 && coupons.items == 12, "{coupons:?}");
    let status = json_of(app.admin_get("/admin/v1/status").await).await;
    assert_eq!(
        status["upstream_batches"]["extras"]["items"], 12,
        "{status}"
    );

    // One batch call, and at most the request's two retries.
    let calls = coupon_calls_of_a_batch_of_ten_while_broken(&app).await;
    assert!((1..=3).contains(&calls), "{calls} coupon calls");
    app.stop().await;
}

/// At a shed level the lower classes give way first: a list is served as if the level were one
/// higher, a prefetch two (refused from level 2); a header lowers a request's class, never
/// raises it, and a class the service does not know is a 400.
#[tokio::test]
async fn lower_request_classes_give_way_first_at_each_level() {
    let app = spawn_app_with(|settings| {
        settings.engine.cache_only_loads = 0;
        // Refused at once, not after a wait (the wait has its own tests below).
        settings.resilience.admission_wait.prefetch_max_waiters = 0;
    })
    .await;
    let get_as = |class: Option<&'static str>, id: &'static str| {
        let mut request = app.client.get(app.item_url("jd", id));
        if let Some(class) = class {
            request = request.header("x-request-class", class);
        }
        request.send()
    };
    assert_eq!(get_as(None, "100001").await.unwrap().status(), 200);

    app.admin_put("/admin/v1/shedding", &json!({"level": "drop_extras"}))
        .await;
    let levels = [
        (None, "2", "1"),
        (Some("page"), "2", "1"),
        (Some("list"), "2", "2"),
        (Some("prefetch"), "3", "3"),
    ];
    for (class, batch_level, item_level) in levels {
        let response = get_as(class, "100001").await.unwrap();
        assert_eq!(response.status(), 200, "{class:?}");
        assert_eq!(response.headers()["x-shed-level"], item_level, "{class:?}");
        let mut batch = app
            .client
            .post(format!("{}/api/v1/items:batch", app.base_url))
            .json(&json!({"items": [{"platform": "jd", "item_id": "100001"}]}));
        if let Some(class) = class {
            batch = batch.header("x-request-class", class);
        }
        let response = batch.send().await.unwrap();
        assert_eq!(response.status(), 200, "{class:?}");
        // A batch is a list: `page` cannot raise it.
        assert_eq!(response.headers()["x-shed-level"], batch_level, "{class:?}");
    }

    app.admin_put("/admin/v1/shedding", &json!({"level": "short_timeouts"}))
        .await;
    let refused = get_as(Some("prefetch"), "100001").await.unwrap();
    assert_eq!(refused.status(), 503);
    assert!(refused.headers().contains_key("retry-after"));
    let trace_id = refused.headers()["x-trace-id"].to_str().unwrap().to_owned();
    assert_eq!(json_of(refused).await["error"]["code"], "overloaded");
    // A list is cache-only at level 2: the cached item is served, a cold one refused.
    let list = get_as(Some("list"), "100001").await.unwrap();
    assert_eq!(list.headers()["x-shed-level"], "3");
    assert_eq!(list.status(), 200);
    assert_eq!(get_as(Some("list"), "100555").await.unwrap().status(), 503);
    assert_eq!(get_as(Some("page"), "100556").await.unwrap().status(), 200);

    let invalid = get_as(Some("urgent"), "100001").await.unwrap();
    assert_eq!(invalid.status(), 400);
    assert_eq!(
        json_of(invalid).await["error"]["code"],
        "invalid_request_class"
    );

    let status = json_of(app.admin_get("/admin/v1/status").await).await;
    assert_eq!(
        status["protection"]["refused_by_class"]["prefetch"], 1,
        "{status}"
    );
    assert_eq!(
        status["protection"]["refused_by_class"]["page"], 0,
        "{status}"
    );
    let record = json_of(
        app.admin_get(&format!("/admin/v1/slow-requests/{trace_id}"))
            .await,
    )
    .await;
    assert_eq!(record["class"], "prefetch", "{record}");
    let metrics = app.admin_get("/metrics").await.text().await.unwrap();
    assert!(
        metrics.contains(r#"rebate_shed_refused_total{class="prefetch"} 1"#),
        "{metrics}"
    );
    app.stop().await;
}

/// The prefetch queue's line of the admin status.
async fn prefetch_queue(app: &TestApp) -> Value {
    let status = json_of(app.admin_get("/admin/v1/status").await).await;
    let classes = &status["protection"]["admission_wait"]["classes"];
    assert_eq!(classes[0]["class"], "prefetch", "{status}");
    classes[0].clone()
}

/// Polls the admin status until `waiting` prefetches wait (each poll is a round trip to the
/// service, which lets the waiting requests run; no timer).
async fn until_waiting(app: &TestApp, waiting: u64) -> Value {
    for _ in 0..2_000 {
        let queue = prefetch_queue(app).await;
        if queue["waiting"] == waiting {
            return queue;
        }
    }
    panic!(
        "{waiting} prefetches never waited: {}",
        prefetch_queue(app).await
    );
}

fn get_prefetch(app: &TestApp, id: &str) -> tokio::task::JoinHandle<reqwest::Response> {
    let request = app
        .client
        .get(app.item_url("jd", id))
        .header("x-request-class", "prefetch");
    tokio::spawn(async move { request.send().await.unwrap() })
}

/// Over its limit (here: a level that refuses prefetches), a prefetch waits in its bounded queue
/// instead of being refused, and is admitted once the level falls; a full queue is a 503 at
/// once; a page request is answered while prefetches wait, never behind them. The waits are
/// long (4 s) so that nothing here races a timer: capacity frees when the test says so.
#[tokio::test]
async fn a_prefetch_waits_over_the_limit_and_is_admitted_when_capacity_frees() {
    let app = spawn_app_with(|settings| {
        settings.http.request_deadline_ms = 5_000;
        settings.http.request_timeout_ms = 6_000;
        let wait = &mut settings.resilience.admission_wait;
        (wait.prefetch_max_waiters, wait.prefetch_max_wait_ms) = (2, 4_000);
    })
    .await;
    assert_eq!(app.get_item("jd", "100001").await.status(), 200);
    app.admin_put("/admin/v1/shedding", &json!({"level": "short_timeouts"}))
        .await;

    let first = get_prefetch(&app, "100001");
    until_waiting(&app, 1).await;
    // A page is not refused, not queued and not delayed by the waiting prefetch.
    let page = app.get_item("jd", "100001").await;
    assert_eq!(page.status(), 200);
    assert_eq!(page.headers()["x-shed-level"], "2");
    assert!(
        !page.headers().contains_key("server-timing"),
        "a page never queues"
    );
    let queue = prefetch_queue(&app).await;
    assert_eq!(
        (&queue["waiting"], &queue["admitted"], &queue["timed_out"]),
        (&json!(1), &json!(0), &json!(0)),
        "the prefetch still waits after the page was answered: {queue}"
    );
    assert!(!first.is_finished());

    let second = get_prefetch(&app, "100002");
    until_waiting(&app, 2).await;
    let full = app
        .client
        .get(app.item_url("jd", "100003"))
        .header("x-request-class", "prefetch")
        .send()
        .await
        .unwrap();
    assert_eq!(full.status(), 503);
    assert!(full.headers().contains_key("retry-after"));
    assert_eq!(full.headers()["x-shed-level"], "2");
    assert_eq!(
        full.headers()["server-timing"],
        "admission;desc=full;dur=0.000"
    );
    assert_eq!(json_of(full).await["error"]["code"], "overloaded");
    assert_eq!(prefetch_queue(&app).await["refused_full"], 1);

    // The level falls: both waiters are let in, oldest first, and answered at the new level,
    // their waits on the service's clock in their `Server-Timing`.
    app.ticker.advance(Duration::from_millis(30));
    app.admin_put("/admin/v1/shedding", &json!({"level": null}))
        .await;
    for waiter in [first, second] {
        let response = waiter.await.unwrap();
        assert_eq!(response.status(), 200);
        assert!(!response.headers().contains_key("x-shed-level"));
        assert_eq!(
            response.headers()["server-timing"],
            "admission;desc=admitted;dur=30.000"
        );
    }
    let queue = prefetch_queue(&app).await;
    assert_eq!(
        (
            &queue["waiting"],
            &queue["admitted"],
            &queue["refused_full"]
        ),
        (&json!(0), &json!(2), &json!(1)),
        "{queue}"
    );
    assert_eq!(
        (&queue["max_waiters"], &queue["peak_waiting"]),
        (&json!(2), &json!(2))
    );
    let metrics = app.admin_get("/metrics").await.text().await.unwrap();
    for series in [
        r#"rebate_admission_queue_depth{class="prefetch"} 0"#,
        r#"rebate_admission_queue_peak_depth{class="prefetch"} 2"#,
        r#"rebate_admission_wait_outcomes_total{class="prefetch",outcome="admitted"} 2"#,
        r#"rebate_admission_wait_outcomes_total{class="prefetch",outcome="full"} 1"#,
        r#"rebate_admission_wait_seconds_count{class="prefetch"} 2"#,
    ] {
        assert!(metrics.contains(series), "{series} in {metrics}");
    }
    assert_eq!(
        app.state
            .protection
            .shedder
            .as_ref()
            .unwrap()
            .snapshot()
            .in_flight,
        0
    );
    app.stop().await;
}

/// A prefetch whose wait runs out before capacity frees is a 503 with `Retry-After`, counted
/// as timed out, and its wait is a stage of its slow-request record.
#[tokio::test]
async fn a_spent_wait_is_a_503_with_retry_after() {
    let app = spawn_app_with(|settings| {
        let wait = &mut settings.resilience.admission_wait;
        (wait.prefetch_max_waiters, wait.prefetch_max_wait_ms) = (4, 20);
    })
    .await;
    app.admin_put("/admin/v1/shedding", &json!({"level": "short_timeouts"}))
        .await;
    let refused = get_prefetch(&app, "100001").await.unwrap();
    assert_eq!(refused.status(), 503);
    assert!(refused.headers().contains_key("retry-after"));
    // The wait is on the service's clock, which this test does not move.
    assert_eq!(
        refused.headers()["server-timing"],
        "admission;desc=timed_out;dur=0.000"
    );
    let trace_id = refused.headers()["x-trace-id"].to_str().unwrap().to_owned();
    assert_eq!(json_of(refused).await["error"]["code"], "overloaded");
    let queue = prefetch_queue(&app).await;
    assert_eq!(
        (&queue["waiting"], &queue["timed_out"], &queue["admitted"]),
        (&json!(0), &json!(1), &json!(0)),
        "{queue}"
    );
    let record = json_of(
        app.admin_get(&format!("/admin/v1/slow-requests/{trace_id}"))
            .await,
    )
    .await;
    let stage = record["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|stage| stage["kind"] == "admission")
        .unwrap_or_else(|| panic!("an admission stage in {record}"))
        .clone();
    assert_eq!(stage["name"], "prefetch");
    assert_eq!(stage["outcome"], "timed_out");
    app.admin_put("/admin/v1/shedding", &json!({"level": null}))
        .await;
    app.stop().await;
}
