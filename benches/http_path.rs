//! A whole API request in process — every middleware layer (trace id, span and timeline, client
//! limit, shed admission, timeout), the handler, a four-part quote from L1 and its JSON — without
//! the network. Measured with tracing as configured by default (logs at info, no export), then
//! with OTLP export on and a zero sample ratio: every span recorded, the fast request dropped by
//! the tail sampler (the collector address is never reached).
//!
//! Run: `cargo bench -p rebate-benches --bench http_path`.

use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use criterion::{Criterion, criterion_group, criterion_main};
use query_api::{Application, Settings};
use tower::ServiceExt;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime")
}

async fn application(directory: &tempfile::TempDir) -> Application {
    let mut settings = Settings::defaults().expect("defaults");
    settings.http.listen = "127.0.0.1:0".parse().unwrap();
    settings.admin.listen = "127.0.0.1:0".parse().unwrap();
    settings.admin.token_file = directory.path().join("admin-token");
    settings.store.sqlite.path = directory.path().join("catalogue.sqlite");
    settings.warmup.enabled = false;
    settings.bloom.enabled = false;
    // One client sends everything here; its bucket would run dry.
    settings.resilience.client_limit.enabled = false;
    Application::build(settings).await.expect("application")
}

fn request() -> Request<Body> {
    Request::get("/api/v1/items/taobao/100001/rebate")
        .header("host", "localhost")
        .body(Body::empty())
        .unwrap()
}

fn whole_request(criterion: &mut Criterion) {
    let runtime = runtime();
    let directory = tempfile::tempdir().unwrap();
    let app = runtime.block_on(application(&directory));
    let router = query_api::http::router(app.state().clone());
    let send = |router: query_api::http::service::Edge| async move {
        let response = router.oneshot(request()).await.unwrap();
        assert_eq!(response.status(), 200);
        axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap()
    };
    // Warm L1 with all four parts.
    runtime.block_on(send(router.clone()));

    let mut group = criterion.benchmark_group("http");
    group.bench_function("GET quote from L1, tracing off", |bench| {
        bench.to_async(&runtime).iter(|| send(router.clone()))
    });
    let telemetry = runtime.block_on(async {
        rebate_telemetry::init(
            rebate_telemetry::LogFormat::Json,
            "info",
            Some(&rebate_telemetry::OtlpConfig {
                endpoint: "http://127.0.0.1:9".to_owned(),
                service_name: "bench".to_owned(),
                instance: "bench".to_owned(),
                sample_ratio: 0.0,
                slow: Duration::from_secs(1),
                max_queue: 4096,
                export_timeout: Duration::from_millis(100),
            }),
        )
        .expect("the benchmark installs the only subscriber")
    });
    group.bench_function("GET quote from L1, OTLP on, sampled out", |bench| {
        bench.to_async(&runtime).iter(|| send(router.clone()))
    });
    group.finish();
    drop(telemetry);
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = whole_request
}
criterion_main!(benches);
