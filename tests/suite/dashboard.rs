//! The operator dashboard on the admin listener of a running service: the page and its assets
//! are served without the token, with their content types and security headers, inside the
//! listener's trace stage; every figure the page shows comes from routes that do need the token.
//! (The page itself, driven in Chromium, is `scripts/dashboard-test.sh`.)

use rebate_tests::{TestApp, spawn_app};
use serde_json::Value;

async fn get(app: &TestApp, path: &str, token: Option<&str>) -> reqwest::Response {
    let mut request = app.client.get(format!("{}{path}", app.admin_url));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    request.send().await.expect("the admin listener answers")
}

fn header<'a>(response: &'a reqwest::Response, name: &str) -> &'a str {
    response
        .headers()
        .get(name)
        .unwrap_or_else(|| panic!("{} has {name}", response.url()))
        .to_str()
        .unwrap()
}

/// The asset addresses the page names (`/dashboard/…?v=…`).
fn asset_addresses(page: &str) -> Vec<String> {
    page.split('"')
        .filter(|part| part.starts_with("/dashboard/"))
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn the_page_and_its_assets_are_served_without_the_token_with_strict_headers() {
    let app = spawn_app().await;
    let page = get(&app, "/dashboard", None).await;
    assert_eq!(page.status(), 200);
    assert_eq!(header(&page, "content-type"), "text/html; charset=utf-8");
    assert_eq!(header(&page, "cache-control"), "no-cache");
    let policy = header(&page, "content-security-policy").to_owned();
    for directive in [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "connect-src 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(policy.contains(directive), "{policy}");
    }
    assert_eq!(header(&page, "x-content-type-options"), "nosniff");
    assert_eq!(header(&page, "referrer-policy"), "no-referrer");
    // Inside the admin listener's trace stage like every other route.
    assert_eq!(header(&page, "x-trace-id").len(), 32);
    let body = page.text().await.unwrap();
    assert!(body.starts_with("<!doctype html>"), "{body}");

    let addresses = asset_addresses(&body);
    // The page, its styles, and its two scripts (the live rules panel has its own).
    assert_eq!(addresses.len(), 3, "{addresses:?}");
    for address in &addresses {
        let asset = get(&app, address, None).await;
        assert_eq!(asset.status(), 200, "{address}");
        let expected_type = if address.starts_with("/dashboard/app.js?v=")
            || address.starts_with("/dashboard/rules.js?v=")
        {
            "text/javascript; charset=utf-8"
        } else {
            assert!(address.starts_with("/dashboard/app.css?v="), "{address}");
            "text/css; charset=utf-8"
        };
        assert_eq!(header(&asset, "content-type"), expected_type, "{address}");
        assert_eq!(
            header(&asset, "cache-control"),
            "max-age=31536000, immutable"
        );
        assert_eq!(header(&asset, "x-content-type-options"), "nosniff");
        assert_eq!(header(&asset, "content-security-policy"), policy);
        assert!(!asset.text().await.unwrap().is_empty());
    }
    // The same script without its version is revalidated: no cache keeps it for good.
    let unversioned = get(&app, "/dashboard/app.js", None).await;
    assert_eq!(header(&unversioned, "cache-control"), "no-cache");

    // Only GET (and HEAD); nothing else lives under /dashboard.
    let posted = app
        .client
        .post(format!("{}/dashboard", app.admin_url))
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status(), 405);
    assert_eq!(get(&app, "/dashboard/other.js", None).await.status(), 404);
    app.stop().await;
}

#[tokio::test]
async fn the_figures_the_page_shows_need_the_token() {
    let app = spawn_app().await;
    for path in ["/admin/v1/status", "/admin/v1/slow-requests"] {
        assert_eq!(get(&app, path, None).await.status(), 401, "{path}");
        assert_eq!(
            get(&app, path, Some("not-the-token")).await.status(),
            401,
            "{path}"
        );
        assert_eq!(
            get(&app, path, Some(&app.admin_token)).await.status(),
            200,
            "{path}"
        );
    }
    let unknown = "/admin/v1/slow-requests/0123456789abcdef0123456789abcdef";
    assert_eq!(get(&app, unknown, None).await.status(), 401);
    assert_eq!(
        get(&app, unknown, Some(&app.admin_token)).await.status(),
        404
    );

    // What the page reads from the status, each figure the issue names.
    let status: Value = get(&app, "/admin/v1/status", Some(&app.admin_token))
        .await
        .json()
        .await
        .unwrap();
    assert!(status["shed_level"].is_string(), "{status}");
    assert!(status["protection"]["shedding"]["load"].is_number());
    let dependencies: Vec<&str> = status["protection"]["dependencies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|dependency| {
            assert!(dependency["breaker"]["state"].is_string(), "{dependency}");
            assert!(dependency["bulkhead"]["max"].is_number(), "{dependency}");
            dependency["name"].as_str().unwrap()
        })
        .collect();
    assert_eq!(dependencies, ["mysql", "redis", "coupons", "extras"]);
    for part in ["product", "rate", "coupons", "extras"] {
        let cache = &status["caches"][part];
        assert!(
            cache["hits"].is_number() && cache["l2_hits"].is_number(),
            "{part}: {cache}"
        );
    }
    assert_eq!(status["events_connection"], "in_process");
    for counter in ["published", "processed", "failed", "dead_lettered"] {
        assert_eq!(status["event_counts"][counter], 0, "{counter}");
    }
    assert!(status["consistency"]["windows"].is_array());
    app.stop().await;
}
