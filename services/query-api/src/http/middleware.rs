//! Request-scoped middleware: trace ids and the hard request timeout.

use std::any::Any;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rebate_telemetry::TraceId;
use serde::Serialize;
use tokio::time::Instant;
use tracing::Instrument;

use super::error::{ApiError, ErrorBody};
use crate::startup::HttpLimits;

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
}

/// Outermost layer: picks the trace id (an incoming W3C `traceparent`, else a new one), runs the
/// request inside a span carrying it, sets `x-trace-id`, and renders error bodies with it.
pub async fn trace_requests(mut request: Request, next: Next) -> Response {
    let trace_id = request
        .headers()
        .get(TRACEPARENT)
        .and_then(|value| value.to_str().ok())
        .and_then(TraceId::from_traceparent)
        .unwrap_or_else(TraceId::generate);
    request.extensions_mut().insert(trace_id);
    let span = tracing::info_span!(
        "request",
        %trace_id,
        method = %request.method(),
        path = %request.uri().path(),
    );
    let started = Instant::now();
    let mut response = next.run(request).instrument(span.clone()).await;

    if let Some(error) = response.extensions_mut().remove::<ErrorBody>() {
        let body = ErrorEnvelope {
            error: ErrorJson {
                code: error.code,
                message: &error.message,
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
    if let Ok(value) = HeaderValue::from_str(&trace_id.to_hex()) {
        response.headers_mut().insert(TRACE_ID_HEADER, value);
    }
    let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
    let status = response.status().as_u16();
    if response.status().is_server_error() {
        tracing::warn!(parent: &span, status, elapsed_ms, "request failed");
    } else {
        tracing::debug!(parent: &span, status, elapsed_ms, "request done");
    }
    response
}

/// A safety net above the per-request deadline the engine honours: whatever happens below, the
/// client gets an answer within `request_timeout`.
pub async fn request_timeout(
    State(limits): State<Arc<HttpLimits>>,
    request: Request,
    next: Next,
) -> Response {
    match tokio::time::timeout(limits.request_timeout, next.run(request)).await {
        Ok(response) => response,
        Err(_elapsed) => {
            tracing::warn!(
                timeout_ms = limits.request_timeout.as_millis() as u64,
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
