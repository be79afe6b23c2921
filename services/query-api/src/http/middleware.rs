//! Request-scoped middleware: trace ids, spans and timelines, the slow-request log, request
//! metrics, and the hard request timeout.

use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rebate_domain::Timestamp;
use rebate_resilience::{RateConfig, RequestClass, Ticker, TokenBucket};
use rebate_telemetry::{Timeline, TraceId};
use serde::Serialize;
use tokio::time::Instant;
use tracing::Instrument;

use super::error::{ApiError, ErrorBody};
use super::protect::SHED_LEVEL_HEADER;
use crate::metrics::{Answered, Metrics, Route};
use crate::slow::{SlowLog, SlowReason, SlowRequest};

/// Every response carries the request's trace id in this header.
pub const TRACE_ID_HEADER: HeaderName = HeaderName::from_static("x-trace-id");
const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

#[derive(Serialize)]
struct ErrorEnvelope<'a> {
    error: ErrorJson<'a>,
    trace_id: TraceId,
}

#[derive(Serialize)]
struct ErrorJson<'a> {
    code: rebate_domain::ErrorCode,
    message: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    field: Option<&'a str>,
}

/// What the API's trace layer needs beyond the trace id: where slow requests are recorded.
#[derive(Debug)]
pub struct RequestObserver {
    /// Every request's latency by route, final status and answers (`/metrics`).
    pub metrics: Arc<Metrics>,
    pub slow_log: Arc<SlowLog>,
    /// A request at least this slow is recorded.
    pub slow_after: Duration,
    pub instance: Arc<str>,
    /// How many of those records also become a log line.
    pub lines: LineBudget,
}

/// At most `per_sec` "slow request" log lines a second (bursts of as many): when a dependency
/// fails, every answer is degraded, and one warn line per request would make the log the
/// bottleneck at tens of thousands of requests a second. Every request is still recorded in the
/// slow-request log; a line that follows suppressed ones says how many were left out.
#[derive(Debug)]
pub struct LineBudget {
    bucket: Option<TokenBucket>,
    ticker: Arc<dyn Ticker>,
    suppressed: AtomicU64,
}

impl LineBudget {
    /// `per_sec` 0 writes no line at all (the slow-request log still records).
    pub fn new(per_sec: u32, ticker: Arc<dyn Ticker>) -> Self {
        Self {
            bucket: (per_sec > 0).then(|| {
                TokenBucket::new(RateConfig {
                    per_second: f64::from(per_sec),
                    burst: per_sec,
                })
            }),
            ticker,
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(lines suppressed since the last one)` when this line may be written.
    pub fn take(&self) -> Option<u64> {
        let allowed = self
            .bucket
            .as_ref()
            .is_some_and(|bucket| bucket.try_acquire_at(self.ticker.now_nanos()).is_ok());
        if allowed {
            Some(self.suppressed.swap(0, Ordering::Relaxed))
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// Outermost layer of the admin listener: the trace stage the public listener runs, without the
/// metrics and the slow-request log.
pub async fn trace_requests(request: Request, next: Next) -> Response {
    traced(request, None, |request| next.run(request)).await
}

/// The outermost stage of every request: picks the trace id (an incoming W3C `traceparent`, else
/// a new one) and makes it the exported trace's id too, runs `run` inside a [`Timeline`] (and a
/// `request` span when spans are exported), sets `x-trace-id` and renders error bodies with it.
/// With an `observer` (the API's), it also records the latency by route template, final status
/// (429s, 503s and timeouts of the stages below included) and answers in the metrics and — when
/// the request was slow, failed or degraded — records it in the slow-request log and writes its
/// one log line. This is the one place a failed request is logged.
pub(super) async fn traced<Run, Answer>(
    mut request: Request,
    observer: Option<&RequestObserver>,
    run: Run,
) -> Response
where
    Run: FnOnce(Request) -> Answer,
    Answer: Future<Output = Response>,
{
    let route = observer.map(|_| Route::of(request.uri().path()));
    let trace = Traced::begin(&request, route);
    request.extensions_mut().insert(trace.trace_id);
    let response = Arc::clone(&trace.timeline)
        .scope(run(request))
        .instrument(trace.span.clone())
        .await;
    trace.finish(response, observer)
}

/// The trace stage's state between the request's head and its response: [`traced`] in two
/// halves, for callers that answer without a future (the edge's hot path) as well.
pub(super) struct Traced {
    pub(super) trace_id: TraceId,
    /// Its 32 hex digits, formatted once (the header, and a body that carries them).
    pub(super) trace_hex: [u8; 32],
    /// `Span::none()` unless spans are exported.
    pub(super) span: tracing::Span,
    pub(super) timeline: Arc<Timeline>,
    method: axum::http::Method,
    uri: axum::http::Uri,
    /// The route template, for the metrics (only with an observer).
    route: Option<Route>,
    started: Instant,
}

impl Traced {
    /// The trace id, span and timeline of `request`; its `route` when its latency will be
    /// recorded in the metrics.
    pub(super) fn begin(request: &Request, route: Option<Route>) -> Self {
        let traceparent = request
            .headers()
            .get(TRACEPARENT)
            .and_then(|value| value.to_str().ok());
        let trace_id = traceparent
            .and_then(TraceId::from_traceparent)
            .unwrap_or_else(TraceId::generate);
        let method = request.method().clone();
        // A clone of the target shares its bytes; the path is copied only for the slow-request
        // log.
        let uri = request.uri().clone();
        // The `request` span exists for the exported trace only. Log lines need none: every
        // line written under the request's timeline names its trace id
        // (`rebate_telemetry::lines`), and a span per request — registry slot, filter
        // bookkeeping, its fields formatted whether or not a line is written, an enter and exit
        // on every poll — was a tenth of a cached request's work.
        let span = if rebate_telemetry::otel::is_active() {
            let span = tracing::info_span!(
                "request",
                method = method.as_str(),
                path = uri.path(),
                status = tracing::field::Empty,
                degraded = tracing::field::Empty,
                shed_level = tracing::field::Empty,
                class = tracing::field::Empty,
                latency_ms = tracing::field::Empty,
                "otel.status_code" = tracing::field::Empty,
            );
            let parent = traceparent.and_then(TraceId::parent_of_traceparent);
            rebate_telemetry::otel::link_to_trace(&span, trace_id, parent);
            span
        } else {
            tracing::Span::none()
        };
        let timeline = Timeline::new(trace_id);
        Self {
            trace_id,
            trace_hex: trace_id.hex_digits(),
            span,
            started: timeline.started(),
            timeline,
            method,
            uri,
            route,
        }
    }

    /// The response as the client gets it, the class and answers read from its extensions
    /// (where the stages below put them).
    pub(super) fn finish(self, response: Response, observer: Option<&RequestObserver>) -> Response {
        let class = response.extensions().get::<RequestClass>().copied();
        let answered = response.extensions().get::<Answered>().copied();
        self.finish_with(response, observer, class, answered)
    }

    /// [`Traced::finish`] with the request's class and answers given.
    pub(super) fn finish_with(
        self,
        mut response: Response,
        observer: Option<&RequestObserver>,
        class: Option<RequestClass>,
        answered: Option<Answered>,
    ) -> Response {
        let Traced {
            trace_id,
            trace_hex,
            span,
            timeline,
            method,
            uri,
            route,
            started,
        } = self;
        let latency = started.elapsed();
        if let (Some(observer), Some(route)) = (observer, route) {
            // Before the error body is rendered: the status and answers are the stages' below.
            observer.metrics.record_request(
                &route,
                class,
                response.status().as_u16(),
                answered,
                latency,
            );
        }

        if let Some(error) = response.extensions_mut().remove::<ErrorBody>() {
            let body = ErrorEnvelope {
                error: ErrorJson {
                    code: error.code,
                    message: &error.message,
                    field: error.field.as_deref(),
                },
                trace_id,
            };
            match serde_json::to_vec(&body) {
                Ok(bytes) => {
                    let (mut parts, _) = response.into_parts();
                    parts.headers.insert(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/json"),
                    );
                    parts.headers.remove(header::CONTENT_LENGTH);
                    response = Response::from_parts(parts, axum::body::Body::from(bytes));
                }
                Err(serialize_error) => {
                    tracing::error!(parent: &span, %serialize_error, "cannot render an error body");
                }
            }
        }
        if let Ok(value) = HeaderValue::from_bytes(&trace_hex) {
            response.headers_mut().insert(TRACE_ID_HEADER, value);
        }

        let latency_ms = (latency.as_secs_f64() * 1e6).round() / 1e3;
        let status = response.status().as_u16();
        let degraded = answered.is_some_and(|answered| answered.degraded > 0);
        // The outcome on the span is for the exported trace (the lines below name their fields).
        if !span.is_none() {
            span.record("status", status);
            span.record("degraded", degraded);
            span.record("shed_level", shed_level_of(&response));
            if let Some(class) = class {
                span.record("class", class.as_str());
            }
            span.record("latency_ms", latency_ms);
            if response.status().is_server_error() {
                span.record("otel.status_code", "error");
            }
        }

        let mut reasons = Vec::new();
        if let Some(observer) = observer {
            if latency >= observer.slow_after {
                reasons.push(SlowReason::Slow);
            }
            if response.status().is_server_error() {
                reasons.push(SlowReason::Failed);
            }
            if degraded {
                reasons.push(SlowReason::Degraded);
            }
        }
        match observer {
            Some(observer) if !reasons.is_empty() => {
                let shed_level = shed_level_of(&response);
                let stages = timeline.stages();
                if let Some(suppressed) = observer.lines.take() {
                    let summary = stages
                        .iter()
                        .map(|stage| {
                            format!(
                                "{} {} {} {}ms",
                                stage.kind, stage.name, stage.outcome, stage.elapsed_ms
                            )
                        })
                        .collect::<Vec<_>>()
                        .join("; ");
                    tracing::warn!(
                        parent: &span,
                        %trace_id,
                        method = %method,
                        path = %uri.path(),
                        status,
                        latency_ms,
                        shed_level,
                        class = class.map(RequestClass::as_str),
                        reasons = ?reasons,
                        stages = %summary,
                        suppressed_since_last_line = suppressed,
                        "slow request"
                    );
                }
                observer.slow_log.push(SlowRequest {
                    trace_id,
                    instance: Arc::clone(&observer.instance),
                    at: Timestamp::now(),
                    method: method.to_string(),
                    path: uri.path().to_owned(),
                    status,
                    latency_ms,
                    shed_level,
                    class,
                    reasons,
                    stages,
                });
            }
            _ if response.status().is_server_error() => {
                let shed_level = shed_level_of(&response);
                tracing::warn!(
                    parent: &span,
                    %trace_id,
                    method = %method,
                    path = %uri.path(),
                    status,
                    latency_ms,
                    shed_level,
                    class = class.map(RequestClass::as_str),
                    "request failed"
                );
            }
            _ => {
                tracing::debug!(
                    parent: &span,
                    method = %method,
                    path = %uri.path(),
                    status,
                    latency_ms,
                    "request done"
                );
            }
        }
        response
    }
}

/// The level a response was served at (`x-shed-level`; 0 when not shedding). Read only for the
/// requests that are logged or exported.
fn shed_level_of(response: &Response) -> u8 {
    response
        .headers()
        .get(SHED_LEVEL_HEADER)
        .and_then(|value| value.to_str().ok()?.parse::<u8>().ok())
        .unwrap_or(0)
}

/// A safety net above the per-request deadline the engine honours: whatever happens below, the
/// client gets an answer within the listener's hard `timeout`.
pub async fn with_timeout(timeout: Duration, answer: impl Future<Output = Response>) -> Response {
    match tokio::time::timeout(timeout, answer).await {
        Ok(response) => response,
        Err(_elapsed) => {
            // Logged once, with the trace id, by the trace layer (a 503).
            tracing::debug!(
                timeout_ms = timeout.as_millis() as u64,
                "request hit the hard timeout"
            );
            ApiError::Timeout.into_response()
        }
    }
}

/// A panic in a handler becomes a plain 500; the panic message is logged, never sent.
pub fn panic_response(panic: Box<dyn Any + Send + 'static>) -> Response {
    let message = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("non-string panic payload");
    tracing::error!(panic = message, "handler panicked");
    ApiError::Internal.into_response()
}

#[cfg(test)]
mod tests {
    use axum::Router;
    use axum::body::Body;
    use axum::http::StatusCode;
    use axum::routing::get;
    use rebate_resilience::ManualTicker;
    use tower::ServiceExt;

    use super::*;
    use crate::metrics::sample;

    #[test]
    fn log_lines_are_budgeted_and_the_next_line_counts_the_suppressed() {
        let ticker = Arc::new(ManualTicker::new());
        let lines = LineBudget::new(2, Arc::clone(&ticker) as Arc<dyn Ticker>);
        assert_eq!(lines.take(), Some(0));
        assert_eq!(lines.take(), Some(0));
        for _ in 0..5 {
            assert_eq!(lines.take(), None);
        }
        ticker.advance(Duration::from_millis(500));
        assert_eq!(lines.take(), Some(5), "one token back after half a second");
        assert_eq!(lines.take(), None);
    }

    #[test]
    fn a_zero_budget_writes_no_line() {
        let lines = LineBudget::new(0, Arc::new(ManualTicker::new()));
        assert_eq!(lines.take(), None);
    }

    #[tokio::test]
    async fn requests_are_labelled_by_route_template_never_the_raw_path() {
        let metrics = Arc::new(Metrics::new());
        let router = Router::new()
            .route(
                super::super::routes::ITEM_ROUTE,
                get(
                    |axum::extract::Path((_, id)): axum::extract::Path<(String, u32)>| async move {
                        if id == 404 {
                            return StatusCode::NOT_FOUND.into_response();
                        }
                        let mut response = "ok".into_response();
                        response.extensions_mut().insert(Answered {
                            degraded: 1,
                            ..Answered::default()
                        });
                        response
                    },
                ),
            )
            .fallback(|| async { StatusCode::NOT_FOUND });
        let observer = RequestObserver {
            metrics: Arc::clone(&metrics),
            slow_log: Arc::new(SlowLog::new(16)),
            slow_after: Duration::from_secs(60),
            instance: Arc::from("test"),
            lines: LineBudget::new(0, Arc::new(ManualTicker::new())),
        };
        for path in [
            "/api/v1/items/taobao/1/rebate",
            "/api/v1/items/taobao/2/rebate",
            "/api/v1/items/taobao/404/rebate",
            "/nowhere",
        ] {
            let request = Request::get(path).body(Body::empty()).unwrap();
            traced(request, Some(&observer), |request| async {
                router.clone().oneshot(request).await.unwrap()
            })
            .await;
        }

        let text = metrics.encode().unwrap();
        let series = |route: &str, status: u16, degraded: bool| {
            format!(
                r#"rebate_http_request_duration_seconds_count{{route="{route}",class="other",status="{status}",degraded="{degraded}"}}"#
            )
        };
        let item = super::super::routes::ITEM_ROUTE;
        assert_eq!(sample(&text, &series(item, 200, true)), Some("2"));
        assert_eq!(sample(&text, &series(item, 404, false)), Some("1"));
        assert_eq!(sample(&text, &series("other", 404, false)), Some("1"));
        assert!(!text.contains("/items/taobao/1"), "{text}");
        // The 404 on the item route is a correct answer (an unknown item); the unknown path
        // answered no item.
        assert_eq!(
            sample(&text, r#"rebate_answers_total{outcome="not_found"}"#),
            Some("1")
        );
        assert_eq!(
            sample(&text, r#"rebate_answers_total{outcome="failed"}"#),
            Some("0")
        );
        assert_eq!(
            sample(&text, r#"rebate_answers_total{outcome="degraded"}"#),
            Some("2")
        );
    }
}
