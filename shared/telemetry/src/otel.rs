//! OpenTelemetry export over OTLP/HTTP (protobuf), keeping traces by their tail.
//!
//! Every span is recorded (the sampler is always-on) and held per trace until the trace's local
//! root — the `request` span — ends. Then the whole trace is kept when the request was slow
//! (at least `slow`), failed (`status` ≥ 500 or an error status) or degraded, and otherwise kept
//! with probability `sample_ratio` (decided on the trace id, so every instance that sees the trace
//! decides alike). Kept spans go to the SDK's batch processor: a bounded queue drained by its own
//! thread, so exporting never blocks a request; when the queue is full spans are dropped and
//! counted by the SDK. Spans that end after their root (a load that outlived its request) follow
//! the root's decision.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use opentelemetry::trace::{
    SpanContext, SpanId, Status, TraceContextExt, TraceFlags, TraceState, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracerProvider, Span, SpanData,
    SpanProcessor,
};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::{TelemetryError, TraceId};

/// Where and how traces are exported.
#[derive(Debug, Clone)]
pub struct OtlpConfig {
    /// The collector's OTLP/HTTP base URL, e.g. `http://otel-collector:4318`; traces go to
    /// `{endpoint}/v1/traces`.
    pub endpoint: String,
    pub service_name: String,
    /// `service.instance.id`: which instance served the trace.
    pub instance: String,
    /// Share of fast, successful, complete traces that are kept too.
    pub sample_ratio: f64,
    /// A request at least this slow is always kept.
    pub slow: Duration,
    /// Spans waiting for export; beyond it new spans are dropped.
    pub max_queue: usize,
    pub export_timeout: Duration,
}

static ACTIVE: AtomicBool = AtomicBool::new(false);

/// True once an OTLP pipeline is installed in this process.
pub fn is_active() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

/// Builds the tracer provider. `runtime` runs the HTTP calls of the exporter, whose batch thread
/// has no runtime of its own.
pub fn provider(
    settings: &OtlpConfig,
    runtime: tokio::runtime::Handle,
) -> Result<SdkTracerProvider, TelemetryError> {
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(settings.export_timeout)
        .build()
        .map_err(|error| TelemetryError::Otlp(error.to_string()))?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(TokioHttpClient { client, runtime })
        .with_endpoint(format!(
            "{}/v1/traces",
            settings.endpoint.trim_end_matches('/')
        ))
        .with_timeout(settings.export_timeout)
        .build()
        .map_err(|error| TelemetryError::Otlp(error.to_string()))?;
    let batch = BatchSpanProcessor::builder(exporter)
        .with_batch_config(
            BatchConfigBuilder::default()
                .with_max_queue_size(settings.max_queue)
                .with_scheduled_delay(Duration::from_millis(500))
                .build(),
        )
        .build();
    let tail = TailSampler::new(batch, settings.slow, settings.sample_ratio);
    let resource = Resource::builder()
        .with_service_name(settings.service_name.clone())
        .with_attribute(KeyValue::new(
            "service.instance.id",
            settings.instance.clone(),
        ))
        .build();
    Ok(SdkTracerProvider::builder()
        .with_sampler(Sampler::AlwaysOn)
        .with_span_processor(tail)
        .with_resource(resource)
        .build())
}

pub(crate) fn mark_active() {
    ACTIVE.store(true, Ordering::Relaxed);
}

/// A tracer from `provider` for the tracing layer.
pub fn tracer(provider: &SdkTracerProvider) -> opentelemetry_sdk::trace::SdkTracer {
    provider.tracer("rebate-query")
}

/// Makes `span` part of trace `trace_id`: its parent becomes the caller's span (`parent`, from
/// `traceparent`) or, for a new trace, a synthetic remote parent carrying our id, so that the
/// trace id the client sees is the one exported. A no-op without an OTLP pipeline.
pub fn link_to_trace(span: &tracing::Span, trace_id: TraceId, parent: Option<[u8; 8]>) {
    if !is_active() {
        return;
    }
    let parent = parent.unwrap_or_else(|| {
        loop {
            let id: [u8; 8] = rand::random();
            if id != [0; 8] {
                break id;
            }
        }
    });
    let context = SpanContext::new(
        opentelemetry::trace::TraceId::from_bytes(trace_id.to_bytes()),
        SpanId::from_bytes(parent),
        TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    );
    let _ = span.set_parent(Context::new().with_remote_span_context(context));
}

/// The `traceparent` header for a call made from the current span: its trace and span ids when
/// exporting, else our trace id with a fresh span id, so upstream logs can be matched to ours.
pub fn outgoing_traceparent(trace_id: Option<TraceId>) -> Option<String> {
    if is_active() {
        let context = tracing::Span::current().context();
        let span = context.span();
        let span_context = span.span_context();
        if span_context.is_valid() {
            return Some(format!(
                "00-{}-{}-01",
                span_context.trace_id(),
                span_context.span_id()
            ));
        }
    }
    let trace_id = trace_id?;
    let span_id: u64 = rand::random::<u64>() | 1;
    Some(format!("00-{trace_id}-{span_id:016x}-01"))
}

/// The reqwest client of the service, driven on its tokio runtime: the SDK's batch thread
/// awaits the join handle.
#[derive(Debug)]
struct TokioHttpClient {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl HttpClient for TokioHttpClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (parts, body) = request.into_parts();
        let mut outgoing = self.client.request(parts.method, parts.uri.to_string());
        for (name, value) in &parts.headers {
            outgoing = outgoing.header(name, value);
        }
        let outgoing = outgoing.body(body);
        let response = self
            .runtime
            .spawn(async move {
                let response = outgoing.send().await?;
                let status = response.status();
                let headers = response.headers().clone();
                let body = response.bytes().await?;
                Ok::<_, reqwest::Error>((status, headers, body))
            })
            .await??;
        let (status, headers, body) = response;
        let mut answer = Response::builder().status(status);
        for (name, value) in &headers {
            answer = answer.header(name, value);
        }
        Ok(answer.body(body)?)
    }
}

/// Holds each trace's spans until its root ends, then passes all or none of them on.
#[derive(Debug)]
struct TailSampler {
    next: BatchSpanProcessor,
    slow: Duration,
    /// Traces whose id (low 64 bits) falls below this are kept when fast and healthy.
    keep_below: u64,
    pending: moka::sync::Cache<opentelemetry::trace::TraceId, Arc<Mutex<Vec<SpanData>>>>,
    decided: moka::sync::Cache<opentelemetry::trace::TraceId, bool>,
}

/// Spans held for one trace at most; a runaway trace loses its later spans, not memory.
const MAX_SPANS_PER_TRACE: usize = 256;

impl TailSampler {
    fn new(next: BatchSpanProcessor, slow: Duration, ratio: f64) -> Self {
        Self {
            next,
            slow,
            keep_below: (ratio.clamp(0.0, 1.0) * u64::MAX as f64) as u64,
            pending: moka::sync::Cache::builder()
                .max_capacity(10_000)
                .time_to_live(Duration::from_secs(60))
                .build(),
            decided: moka::sync::Cache::builder()
                .max_capacity(10_000)
                .time_to_live(Duration::from_secs(60))
                .build(),
        }
    }

    fn keep(&self, root: &SpanData) -> bool {
        let duration = root
            .end_time
            .duration_since(root.start_time)
            .unwrap_or_default();
        if duration >= self.slow || matches!(root.status, Status::Error { .. }) {
            return true;
        }
        let flagged = root
            .attributes
            .iter()
            .any(|attribute| match attribute.key.as_str() {
                "degraded" => attribute.value.as_str() == "true",
                "status" => attribute
                    .value
                    .as_str()
                    .parse::<u16>()
                    .is_ok_and(|status| status >= 500),
                _ => false,
            });
        if flagged {
            return true;
        }
        let bytes = root.span_context.trace_id().to_bytes();
        let low = u64::from_be_bytes(bytes[8..].try_into().expect("8 bytes"));
        low < self.keep_below
    }
}

impl SpanProcessor for TailSampler {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        let trace = span.span_context.trace_id();
        let is_root = span.parent_span_is_remote || span.parent_span_id == SpanId::INVALID;
        if is_root {
            let keep = self.keep(&span);
            self.decided.insert(trace, keep);
            let held = self.pending.remove(&trace);
            if keep {
                if let Some(held) = held {
                    let spans =
                        std::mem::take(&mut *held.lock().unwrap_or_else(PoisonError::into_inner));
                    for held_span in spans {
                        self.next.on_end(held_span);
                    }
                }
                self.next.on_end(span);
            }
            return;
        }
        if let Some(keep) = self.decided.get(&trace) {
            if keep {
                self.next.on_end(span);
            }
            return;
        }
        let held = self.pending.get_with(trace, Default::default);
        let mut spans = held.lock().unwrap_or_else(PoisonError::into_inner);
        if spans.len() < MAX_SPANS_PER_TRACE {
            spans.push(span);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.next.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.next.shutdown_with_timeout(timeout)
    }
}
