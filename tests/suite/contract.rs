//! The HTTP contract at its edges: the admin API's challenge for every `/admin/v1` path, its
//! case-insensitive scheme and strict bodies, and rejection messages that name the field.

use rebate_tests::spawn_app;
use serde_json::{Value, json};

async fn json_of(response: reqwest::Response) -> Value {
    response.json().await.expect("a JSON body")
}

/// Whether `message` names a Rust type rather than what the client sent.
fn names_a_rust_type(message: &str) -> bool {
    [
        "struct ",
        "enum ",
        "BatchRequest",
        "BatchKey",
        "ShedOverride",
        "LevelName",
        "EventRequest",
    ]
    .iter()
    .any(|needle| message.contains(needle))
}

async fn shed_level(app: &rebate_tests::TestApp) -> Value {
    json_of(app.admin_get("/admin/v1/status").await).await["protection"]["shedding"]["level"]
        .clone()
}

#[tokio::test]
async fn every_admin_path_without_the_token_gets_the_bearer_challenge() {
    let app = spawn_app().await;
    let url = |path: &str| format!("{}{path}", app.admin_url);
    let known_and_unknown = [
        ("GET", "/admin/v1/status"),
        ("GET", "/admin/v1/no-such-route"),
        ("GET", "/admin/v1"),
        ("DELETE", "/admin/v1/status"),
        ("POST", "/admin/v1/events"),
        (
            "GET",
            "/admin/v1/slow-requests/4bf92f3577b34da6a3ce929d0e0e4736",
        ),
    ];
    for (method, path) in known_and_unknown {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let anonymous = app
            .client
            .request(method.clone(), url(path))
            .send()
            .await
            .unwrap();
        assert_eq!(anonymous.status(), 401, "{method} {path}");
        assert_eq!(
            anonymous.headers()["www-authenticate"],
            r#"Bearer realm="rebate-admin""#,
            "{method} {path}"
        );
        let body = json_of(anonymous).await;
        assert_eq!(body["error"]["code"], "unauthorized", "{body}");
        assert!(body["trace_id"].is_string(), "{body}");

        let wrong = app
            .client
            .request(method.clone(), url(path))
            .header("authorization", "Bearer not-the-token")
            .send()
            .await
            .unwrap();
        assert_eq!(wrong.status(), 401, "{method} {path}");
        assert_eq!(
            wrong.headers()["www-authenticate"],
            r#"Bearer realm="rebate-admin", error="invalid_token""#
        );
    }
    // With the token, an unknown route is a plain 404 and a wrong method a 405.
    let authorised = |method: reqwest::Method, path: &str| {
        app.client
            .request(method, url(path))
            .bearer_auth(&app.admin_token)
            .send()
    };
    let missing = authorised(reqwest::Method::GET, "/admin/v1/no-such-route")
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    assert_eq!(json_of(missing).await["error"]["code"], "route_not_found");
    let wrong_method = authorised(reqwest::Method::DELETE, "/admin/v1/status")
        .await
        .unwrap();
    assert_eq!(wrong_method.status(), 405);
    // Outside /admin/v1 nothing changes: probes and metrics need no token.
    for path in ["/healthz", "/readyz", "/metrics"] {
        let response = app.client.get(url(path)).send().await.unwrap();
        assert_eq!(response.status(), 200, "{path}");
    }
    app.stop().await;
}

#[tokio::test]
async fn the_bearer_scheme_is_case_insensitive_and_its_token_is_exact() {
    let app = spawn_app().await;
    let status = |authorization: String| {
        app.client
            .get(format!("{}/admin/v1/status", app.admin_url))
            .header("authorization", authorization)
            .send()
    };
    let token = &app.admin_token;
    for accepted in [
        format!("Bearer {token}"),
        format!("bearer {token}"),
        format!("BEARER {token}"),
        format!("Bearer   {token}"),
    ] {
        assert_eq!(
            status(accepted.clone()).await.unwrap().status(),
            200,
            "{accepted}"
        );
    }
    for refused in [
        format!("Basic {token}"),
        format!("Bearer{token}"),
        format!("Bearer {token}x"),
        format!("Bearer {}", token.to_uppercase()),
        "Bearer ".to_owned(),
        token.clone(),
    ] {
        if refused == format!("Bearer {token}") {
            continue; // an all-uppercase token would equal itself
        }
        assert_eq!(
            status(refused.clone()).await.unwrap().status(),
            401,
            "{refused}"
        );
    }
    app.stop().await;
}

#[tokio::test]
async fn admin_bodies_are_strict_and_an_empty_override_does_not_release_a_pinned_level() {
    let app = spawn_app().await;
    let pinned = app
        .admin_put("/admin/v1/shedding", &json!({"level": "cache_only"}))
        .await;
    assert_eq!(pinned.status(), 200);
    let pinned_level = shed_level(&app).await;
    assert_eq!(pinned_level, "cache_only");

    for body in [
        json!({}),
        json!({"level": "cache_only", "extra": 1}),
        json!([]),
        json!(5),
    ] {
        let refused = app.admin_put("/admin/v1/shedding", &body).await;
        assert_eq!(refused.status(), 400, "{body}");
        let message = json_of(refused).await["error"]["message"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(!names_a_rust_type(&message), "{body}: {message}");
        if body == json!({}) {
            assert!(message.contains("`level`"), "{message}");
        }
        if body.get("extra").is_some() {
            assert!(message.contains("`extra`"), "{message}");
        }
    }
    assert_eq!(shed_level(&app).await, pinned_level, "still pinned");
    let released = app
        .admin_put("/admin/v1/shedding", &json!({"level": null}))
        .await;
    assert_eq!(released.status(), 200);
    app.stop().await;
}

#[tokio::test]
async fn body_rejections_name_the_field_not_a_type() {
    let app = spawn_app().await;
    let cases = [
        (json!([]), "`items`"),
        (json!(5), "`items`"),
        (json!({"items": 5}), "items"),
        (json!({"items": [{"platform": "jd"}]}), "`item_id`"),
        (json!({"items": [5]}), "`platform` and `item_id`"),
        (json!({"items": [], "limit": 3}), "`limit`"),
    ];
    for (body, named) in cases {
        for response in [
            app.post_batch(&body).await,
            app.client
                .post(format!("{}/admin/v1/warm", app.admin_url))
                .bearer_auth(&app.admin_token)
                .json(&body)
                .send()
                .await
                .unwrap(),
        ] {
            assert_eq!(response.status(), 400, "{body}");
            let error = json_of(response).await;
            assert_eq!(error["error"]["code"], "invalid_body", "{error}");
            let message = error["error"]["message"].as_str().unwrap();
            assert!(!names_a_rust_type(message), "{body}: {message}");
            assert!(message.contains(named), "{body}: {message}");
        }
    }
    let events = [
        (json!({"kind": "rate_changed"}), "`platform`"),
        (
            json!({"kind": 5, "platform": "jd", "item_ids": ["1"], "version": 1}),
            "kind",
        ),
        (
            json!({"kind": "renamed", "platform": "jd", "item_ids": ["1"], "version": 1}),
            "rate_changed",
        ),
        (json!([]), "`kind`"),
        // Only the service announces rule changes, whatever else the body holds.
        (
            json!({"kind": "rules_changed", "version": 3}),
            "kind: `rules_changed` is announced by the service itself",
        ),
    ];
    for (body, named) in events {
        let response = app
            .client
            .post(format!("{}/admin/v1/events", app.admin_url))
            .bearer_auth(&app.admin_token)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "{body}");
        let message = json_of(response).await["error"]["message"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(!names_a_rust_type(&message), "{body}: {message}");
        assert!(message.contains(named), "{body}: {message}");
    }
    app.stop().await;
}

#[tokio::test]
async fn h5_origins_get_cors_on_both_paths_and_other_origins_get_none() {
    let app = rebate_tests::spawn_app_with(|settings| {
        settings.http.cors.allowed_origins = vec!["https://h5.example.com".to_owned()];
        settings.http.cors.max_age_secs = 900;
    })
    .await;
    const H5: &str = "https://h5.example.com";
    let batch_url = format!("{}/api/v1/items:batch", app.base_url);
    let preflight = |origin: &'static str| {
        app.client
            .request(reqwest::Method::OPTIONS, &batch_url)
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "content-type, x-client-id",
            )
            .send()
    };
    let allowed = preflight(H5).await.unwrap();
    assert_eq!(allowed.status(), 204);
    let headers = allowed.headers();
    assert_eq!(headers["access-control-allow-origin"], H5);
    assert_eq!(headers["access-control-max-age"], "900");
    assert!(
        headers["access-control-allow-methods"]
            .to_str()
            .unwrap()
            .contains("POST")
    );
    let allow_headers = headers["access-control-allow-headers"].to_str().unwrap();
    assert!(allow_headers.contains("content-type") && allow_headers.contains("x-client-id"));
    assert!(headers.get("access-control-allow-credentials").is_none());
    assert!(headers.contains_key("x-trace-id"));

    let other = preflight("https://evil.example").await.unwrap();
    assert_ne!(other.status(), 204);
    assert!(
        other
            .headers()
            .keys()
            .all(|name| !name.as_str().starts_with("access-control-")),
        "{:?}",
        other.headers()
    );

    // Actual requests: the single item twice (the second from the kept rendering, the edge's
    // hot path), a batch and an error, from the allowed origin.
    let item = app.item_url("jd", "100001");
    for _ in 0..2 {
        let answer = app
            .client
            .get(&item)
            .header("origin", H5)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200);
        assert_eq!(answer.headers()["access-control-allow-origin"], H5);
        assert_eq!(answer.headers()["vary"], "origin");
        let exposed = answer.headers()["access-control-expose-headers"]
            .to_str()
            .unwrap();
        assert!(
            exposed.contains("x-trace-id") && exposed.contains("etag"),
            "{exposed}"
        );
    }
    let batch = app
        .client
        .post(&batch_url)
        .header("origin", H5)
        .json(&json!({"items": [{"platform": "jd", "item_id": "100001"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(batch.status(), 200);
    assert_eq!(batch.headers()["access-control-allow-origin"], H5);
    let missing = app
        .client
        .get(app.item_url("jd", "999999999"))
        .header("origin", H5)
        .send()
        .await
        .unwrap();
    assert!(missing.status().is_client_error());
    assert_eq!(missing.headers()["access-control-allow-origin"], H5);

    // Another origin: the answer, but nothing that lets its page read it.
    let elsewhere = app
        .client
        .get(&item)
        .header("origin", "https://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(elsewhere.status(), 200);
    assert!(
        elsewhere
            .headers()
            .get("access-control-allow-origin")
            .is_none()
    );
    assert_eq!(elsewhere.headers()["vary"], "origin");
    app.stop().await;
}

/// A quote's answer and its tag, by `GET` with an optional `If-None-Match`.
async fn get_tagged(
    app: &rebate_tests::TestApp,
    url: &str,
    if_none_match: Option<&str>,
) -> reqwest::Response {
    let mut request = app.client.get(url);
    if let Some(tag) = if_none_match {
        request = request.header("if-none-match", tag);
    }
    request.send().await.unwrap()
}

fn etag_of(response: &reqwest::Response) -> String {
    response.headers()["etag"].to_str().unwrap().to_owned()
}

#[tokio::test]
async fn etags_give_304s_on_both_routes_and_change_with_the_quote() {
    use rebate_domain::ItemKey;
    use rebate_events::EventKind;

    let app = spawn_app().await;
    let url = app.item_url("taobao", "100042");
    // Two answers (the demo's hot items are warmed at start, so both come from the kept
    // rendering): the same tag, though the trace ids differ.
    let first = get_tagged(&app, &url, None).await;
    assert_eq!(first.status(), 200);
    let tag = etag_of(&first);
    let first_trace = json_of(first).await["trace_id"].clone();
    let second = get_tagged(&app, &url, None).await;
    assert_eq!(etag_of(&second), tag);
    let cache_control = second.headers()["cache-control"]
        .to_str()
        .unwrap()
        .to_owned();
    let max_age: u64 = cache_control
        .strip_prefix("private, max-age=")
        .unwrap_or_else(|| panic!("{cache_control}"))
        .parse()
        .unwrap();
    assert!(max_age <= 300, "{cache_control}");
    assert_ne!(json_of(second).await["trace_id"], first_trace);

    // The last tag back: 304, no body, the tag and a trace id; a weak or listed form too.
    for sent in [tag.clone(), format!("W/{tag}"), format!("\"other\", {tag}")] {
        let not_modified = get_tagged(&app, &url, Some(&sent)).await;
        assert_eq!(not_modified.status(), 304, "{sent}");
        assert_eq!(etag_of(&not_modified), tag);
        assert!(not_modified.headers().contains_key("x-trace-id"));
        assert!(not_modified.headers().get("content-type").is_none());
        assert!(not_modified.bytes().await.unwrap().is_empty());
    }
    assert_eq!(
        get_tagged(&app, &url, Some("\"other\"")).await.status(),
        200
    );

    // The batch: the same tag for the same answers, and a 304 for it.
    let batch_url = format!("{}/api/v1/items:batch", app.base_url);
    let batch_body = json!({"items": [
        {"platform": "taobao", "item_id": "100042"},
        {"platform": "jd", "item_id": "100001"},
    ]});
    let post = |if_none_match: Option<String>| {
        let mut request = app.client.post(&batch_url).json(&batch_body);
        if let Some(tag) = if_none_match {
            request = request.header("if-none-match", tag);
        }
        request.send()
    };
    let batch = post(None).await.unwrap();
    assert_eq!(batch.status(), 200);
    let batch_tag = etag_of(&batch);
    assert_eq!(batch.headers()["cache-control"], "private, no-cache");
    assert_eq!(etag_of(&post(None).await.unwrap()), batch_tag);
    let batch_not_modified = post(Some(batch_tag.clone())).await.unwrap();
    assert_eq!(batch_not_modified.status(), 304);
    assert!(batch_not_modified.bytes().await.unwrap().is_empty());

    // A changed rate, after its event: a new tag for the item and for the batch holding it.
    let key = ItemKey::parse("taobao", "100042").unwrap();
    let version = app.write_rate(key, 4_321, None).await;
    app.state
        .events
        .publisher()
        .publish(&rebate_tests::event_for(
            EventKind::RateChanged,
            key,
            version,
        ))
        .await
        .unwrap();
    app.state.events.in_process().unwrap().settled().await;
    let changed = get_tagged(&app, &url, Some(&tag)).await;
    assert_eq!(changed.status(), 200);
    let new_tag = etag_of(&changed);
    assert_ne!(new_tag, tag);
    assert_eq!(json_of(changed).await["rebate"]["rate_bps"], 4_321);
    // The same tag again from the new rendering, which has a max-age.
    let rendered = get_tagged(&app, &url, None).await;
    assert_eq!(etag_of(&rendered), new_tag);
    assert!(
        rendered.headers()["cache-control"]
            .to_str()
            .unwrap()
            .starts_with("private, max-age="),
        "{:?}",
        rendered.headers()
    );
    assert_eq!(get_tagged(&app, &url, Some(&new_tag)).await.status(), 304);

    // A degraded answer (coupons failing for an item never asked for) is tagged but must be
    // revalidated: it changes as soon as the coupons come back.
    app.break_upstream(upstream_sim::Endpoint::Coupons);
    let degraded = get_tagged(&app, &app.item_url("pdd", "100998"), None).await;
    assert_eq!(degraded.status(), 200);
    assert_eq!(degraded.headers()["cache-control"], "private, no-cache");
    assert!(degraded.headers().contains_key("etag"));
    assert_eq!(json_of(degraded).await["degraded"], true);
    let batch_changed = post(Some(batch_tag.clone())).await.unwrap();
    assert_eq!(batch_changed.status(), 200);
    assert_ne!(etag_of(&batch_changed), batch_tag);
    app.stop().await;
}

#[tokio::test]
async fn large_answers_are_compressed_for_clients_that_accept_it() {
    use std::io::Read;

    let app = spawn_app().await;
    let batch_url = format!("{}/api/v1/items:batch", app.base_url);
    let items: Vec<Value> = (100_001..=100_050)
        .map(|id| json!({"platform": "taobao", "item_id": id.to_string()}))
        .collect();
    let body = json!({ "items": items });
    let post = |accept: Option<&'static str>, if_none_match: Option<String>| {
        let mut request = app.client.post(&batch_url).json(&body);
        if let Some(accept) = accept {
            request = request.header("accept-encoding", accept);
        }
        if let Some(tag) = if_none_match {
            request = request.header("if-none-match", tag);
        }
        request.send()
    };
    let plain = post(None, None).await.unwrap();
    assert_eq!(plain.status(), 200);
    assert!(plain.headers().get("content-encoding").is_none());
    assert_eq!(plain.headers()["vary"], "accept-encoding");
    let plain_tag = etag_of(&plain);
    let plain_body = plain.bytes().await.unwrap();
    let plain_json: Value = serde_json::from_slice(&plain_body).unwrap();
    assert_eq!(plain_json["results"].as_array().unwrap().len(), 50);

    for (accept, coding) in [("gzip", "gzip"), ("gzip, deflate, br", "br")] {
        let compressed = post(Some(accept), None).await.unwrap();
        assert_eq!(compressed.status(), 200);
        assert_eq!(compressed.headers()["content-encoding"], coding, "{accept}");
        let tag = etag_of(&compressed);
        assert_eq!(
            tag,
            format!("{}-{coding}\"", &plain_tag[..plain_tag.len() - 1])
        );
        let bytes = compressed.bytes().await.unwrap();
        let mut decoded = Vec::new();
        if coding == "gzip" {
            flate2::read::GzDecoder::new(&bytes[..])
                .read_to_end(&mut decoded)
                .unwrap();
        } else {
            brotli::BrotliDecompress(&mut &bytes[..], &mut decoded).unwrap();
        }
        let decoded: Value = serde_json::from_slice(&decoded).unwrap();
        assert_eq!(decoded["results"], plain_json["results"]);
        // A 50-item batch shrinks several times over (gzip 1: 33,626 → 5,100 bytes; brotli 4:
        // → 3,772, when this was written).
        assert!(
            bytes.len() * 4 < plain_body.len(),
            "{coding}: {} of {} bytes",
            bytes.len(),
            plain_body.len()
        );
        // The compressed representation's tag gives its 304.
        let not_modified = post(Some(accept), Some(tag)).await.unwrap();
        assert_eq!(not_modified.status(), 304);
    }

    // A single quote is below the threshold: never compressed.
    let single = app
        .client
        .get(app.item_url("taobao", "100001"))
        .header("accept-encoding", "gzip, br")
        .send()
        .await
        .unwrap();
    assert_eq!(single.status(), 200);
    assert!(single.headers().get("content-encoding").is_none());
    app.stop().await;
}

/// The document the admin listener serves is the committed one, and real answers — assembled
/// and kept renderings, batches, errors, the admin pages — are exactly its schemas: the schema
/// types deny unknown fields, so a field added to an answer and not to the document fails here.
#[tokio::test]
async fn the_served_openapi_document_is_the_committed_one_and_answers_match_its_schemas() {
    use query_api::http::schemas;

    macro_rules! conforms {
        ($schema:ty, $body:expr, $what:expr) => {{
            let body: String = $body;
            if let Err(error) = serde_json::from_str::<$schema>(&body) {
                panic!("{} does not match its schema: {error}\n{body}", $what);
            }
        }};
    }

    let app = spawn_app().await;
    let served = app
        .client
        .get(format!("{}/openapi.json", app.admin_url))
        .send()
        .await
        .unwrap();
    assert_eq!(served.status(), 200);
    assert_eq!(served.headers()["content-type"], "application/json");
    assert!(
        served.text().await.unwrap() == include_str!("../../docs/openapi.json"),
        "GET /openapi.json is not docs/openapi.json: run \
         `cargo run -p query-api -- openapi > docs/openapi.json`"
    );

    // The first answer is assembled, the second comes from the kept rendering.
    for round in ["assembled", "kept rendering"] {
        let response = app.get_item("taobao", "100001").await;
        assert_eq!(response.status(), 200, "{round}");
        conforms!(schemas::QuoteBody, response.text().await.unwrap(), round);
    }
    let batch = app
        .client
        .post(format!("{}/api/v1/items:batch", app.base_url))
        .json(
            &json!({"items": [{"platform": "taobao", "item_id": "100001"},
            {"platform": "jd", "item_id": "abc"}, {"platform": "pdd", "item_id": "101123"}]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(batch.status(), 200);
    conforms!(schemas::BatchBody, batch.text().await.unwrap(), "a batch");
    let missing = app.get_item("jd", "999999999").await;
    assert_eq!(missing.status(), 404);
    conforms!(
        schemas::ErrorEnvelope,
        missing.text().await.unwrap(),
        "an error"
    );

    let readiness = app
        .client
        .get(format!("{}/readyz", app.admin_url))
        .send()
        .await
        .unwrap();
    conforms!(
        schemas::Readiness,
        readiness.text().await.unwrap(),
        "/readyz"
    );
    let app = &app;
    let admin = |path: &'static str| async move {
        let response = app.admin_get(path).await;
        assert_eq!(response.status(), 200, "{path}");
        response.text().await.unwrap()
    };
    let status = "/admin/v1/status";
    conforms!(schemas::Status, admin(status).await, status);
    let hot_keys = "/admin/v1/hot-keys";
    conforms!(schemas::HotKeys, admin(hot_keys).await, hot_keys);
    let slow = "/admin/v1/slow-requests";
    conforms!(schemas::SlowRequests, admin(slow).await, slow);
    let inspect = "/admin/v1/items/taobao/100001";
    conforms!(schemas::Inspection, admin(inspect).await, inspect);

    // The bodies are objects: serde alone would read `[null]` as `{"level": null}`.
    let array = app.admin_put("/admin/v1/shedding", &json!([null])).await;
    assert_eq!(array.status(), 400);
    assert_eq!(json_of(array).await["error"]["code"], "invalid_body");
}
