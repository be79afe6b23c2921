//! Instructions per hot request, deterministic: the whole API request in process (as
//! `http_path`), a kept rendering answering it, `HOT_REQUESTS` times (default 20,000) on a
//! current-thread runtime, inside `measured` alone. Run it under callgrind with collection on in
//! `measured` only; its total ÷ the count is the figure (docs/BENCHMARKS.md):
//!
//! ```sh
//! cargo bench -p rebate-benches --bench hot_instructions --no-run
//! valgrind --tool=callgrind --collect-atstart=no --toggle-collect='*hot_instructions*measured*' \
//!   target/release/deps/hot_instructions-*[!.d]
//! ```

use axum::body::Body;
use axum::http::Request;
use query_api::{Application, Settings};
use tower::ServiceExt;

fn request() -> Request<Body> {
    Request::get("/api/v1/items/taobao/100001/rebate")
        .header("host", "localhost")
        .body(Body::empty())
        .unwrap()
}

async fn send(router: query_api::http::service::Edge) {
    let response = router.oneshot(request()).await.unwrap();
    assert_eq!(response.status(), 200);
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    assert!(!body.is_empty());
}

#[inline(never)]
fn measured(
    runtime: &tokio::runtime::Runtime,
    router: &query_api::http::service::Edge,
    count: u64,
) {
    runtime.block_on(async {
        for _ in 0..count {
            send(router.clone()).await;
        }
    });
}

fn main() {
    let count: u64 = std::env::var("HOT_REQUESTS")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(20_000);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let directory = tempfile::tempdir().unwrap();
    let app = runtime.block_on(async {
        let mut settings = Settings::load(None).expect("settings");
        settings.http.listen = "127.0.0.1:0".parse().unwrap();
        settings.admin.listen = "127.0.0.1:0".parse().unwrap();
        settings.admin.token_file = directory.path().join("admin-token");
        settings.store.sqlite.path = directory.path().join("catalogue.sqlite");
        settings.warmup.enabled = false;
        settings.bloom.enabled = false;
        settings.resilience.client_limit.enabled = false;
        Application::build(settings).await.expect("application")
    });
    let router = query_api::http::router(app.state().clone());
    // Warm the parts and the kept rendering.
    measured_warm(&runtime, &router);
    measured(&runtime, &router, count);
}

fn measured_warm(runtime: &tokio::runtime::Runtime, router: &query_api::http::service::Edge) {
    runtime.block_on(async {
        for _ in 0..100 {
            send(router.clone()).await;
        }
    });
}
