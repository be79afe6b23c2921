//! OTLP export against a test collector (OTLP/HTTP, protobuf) in this test: a slow request's
//! spans arrive under the trace id the client saw, with a span per dependency call; a fast,
//! complete request under a zero sample ratio is not exported. One test in its own binary (not in
//! the suite): the tracing subscriber and the exporter are process-wide.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message;
use rebate_telemetry::{LogFormat, OtlpConfig};
use rebate_tests::spawn_app_with;
use upstream_sim::Endpoint;

/// A received span: trace id (hex), name, and its string or integer attributes.
#[derive(Debug, Clone)]
struct Received {
    trace_id: String,
    name: String,
    attributes: Vec<(String, String)>,
}

type Inbox = Arc<Mutex<Vec<Received>>>;

async fn collect(State(inbox): State<Inbox>, body: Bytes) -> &'static str {
    let request = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
    let mut inbox = inbox.lock().unwrap();
    for resource in request.resource_spans {
        for scope in resource.scope_spans {
            for span in scope.spans {
                let trace_id = span
                    .trace_id
                    .iter()
                    .map(|byte| format!("{byte:02x}"))
                    .collect();
                let attributes = span
                    .attributes
                    .iter()
                    .filter_map(|attribute| {
                        let value = match attribute.value.as_ref()?.value.as_ref()? {
                            AnyValue::StringValue(text) => text.clone(),
                            AnyValue::IntValue(number) => number.to_string(),
                            AnyValue::BoolValue(flag) => flag.to_string(),
                            AnyValue::DoubleValue(number) => number.to_string(),
                            _ => return None,
                        };
                        Some((attribute.key.clone(), value))
                    })
                    .collect();
                inbox.push(Received {
                    trace_id,
                    name: span.name,
                    attributes,
                });
            }
        }
    }
    ""
}

fn spans_of(inbox: &Inbox, trace_id: &str) -> Vec<Received> {
    inbox
        .lock()
        .unwrap()
        .iter()
        .filter(|span| span.trace_id == trace_id)
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_requests_are_exported_under_the_clients_trace_id_and_fast_ones_are_not() {
    let inbox: Inbox = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let collector = format!("http://{}", listener.local_addr().unwrap());
    let router = Router::new()
        .route("/v1/traces", post(collect))
        .with_state(Arc::clone(&inbox));
    tokio::spawn(async move { axum::serve(listener, router).await });

    let telemetry = Arc::new(
        rebate_telemetry::init(
            LogFormat::Text,
            "warn",
            Some(&OtlpConfig {
                endpoint: collector,
                service_name: "rebate-query-test".to_owned(),
                instance: "otlp-test".to_owned(),
                sample_ratio: 0.0,
                slow: Duration::from_millis(300),
                max_queue: 4096,
                export_timeout: Duration::from_secs(2),
            }),
        )
        .expect("the test installs the only subscriber of this binary"),
    );
    let app = spawn_app_with(|settings| {
        settings.observability.slow_request_ms = 300;
    })
    .await;

    // Fast and complete: sampled out.
    let fast = app.get_item("jd", "100001").await;
    assert_eq!(fast.status(), 200);
    let fast_id = fast.headers()["x-trace-id"].to_str().unwrap().to_owned();

    // Slow (the coupon API takes 400 ms), under the client's own trace id.
    app.slow_upstream(Endpoint::Coupons, 400);
    let client_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let slow = app
        .client
        .get(app.item_url("jd", "100002"))
        .header(
            "traceparent",
            format!("00-{client_trace}-00f067aa0ba902b7-01"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(slow.status(), 200);
    assert_eq!(slow.headers()["x-trace-id"], client_trace);

    // Export is asynchronous: flush, then wait for the collector to have the trace.
    let mut spans = Vec::new();
    for _ in 0..50 {
        let flushing = Arc::clone(&telemetry);
        tokio::task::spawn_blocking(move || flushing.flush())
            .await
            .unwrap();
        spans = spans_of(&inbox, client_trace);
        if spans.iter().any(|span| span.name == "request") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let root = spans
        .iter()
        .find(|span| span.name == "request")
        .unwrap_or_else(|| panic!("no request span exported; got {spans:?}"));
    assert!(
        root.attributes
            .iter()
            .any(|(key, value)| key == "status" && value == "200"),
        "{root:?}"
    );
    let mut dependencies: Vec<String> = spans
        .iter()
        .filter(|span| span.name == "dependency")
        .filter_map(|span| {
            span.attributes
                .iter()
                .find(|(key, _)| key == "dependency")
                .map(|(_, value)| value.clone())
        })
        .collect();
    dependencies.sort();
    // Product and rate from the store, coupons and extras from their APIs: one span per call.
    assert_eq!(
        dependencies,
        ["coupons", "extras", "mysql", "mysql"],
        "{spans:?}"
    );
    assert!(
        spans_of(&inbox, &fast_id).is_empty(),
        "the fast request was exported"
    );

    app.stop().await;
    tokio::task::spawn_blocking(move || {
        if let Ok(telemetry) = Arc::try_unwrap(telemetry) {
            telemetry.shutdown();
        }
    })
    .await
    .unwrap();
}
