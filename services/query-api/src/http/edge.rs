//! The edge's bounds on a request before any work is done for it: the head's size and count
//! caps (431), the target's length (414), a declared body over the limit (413 at once, body
//! unread), and the body itself, read in full under its own timeout (408) before the request is
//! admitted, so that a client trickling a body is never counted as load nor its wait as the
//! service's latency.
//!
//! Refusals that leave body bytes unread say `connection: close`: the connection cannot be
//! reused, and the client learns it from the response rather than from a reset.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, HttpBody};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt, LengthLimitError, Limited};

use super::error::ApiError;

/// The caps, resolved once from `[http]`.
#[derive(Debug, Clone)]
pub struct EdgeLimits {
    pub max_header_bytes: usize,
    pub max_headers: usize,
    pub max_uri_bytes: usize,
    pub body_limit_bytes: usize,
    pub body_read_timeout: Duration,
}

/// Refuses a request whose head is over a cap, or whose declared body is, before reading on.
pub async fn check_head(
    State(limits): State<Arc<EdgeLimits>>,
    request: Request,
    next: Next,
) -> Response {
    match head_error(&limits, &request) {
        Some(error) => closing(error),
        None => next.run(request).await,
    }
}

fn head_error(limits: &EdgeLimits, request: &Request) -> Option<ApiError> {
    let target_bytes = request
        .uri()
        .path_and_query()
        .map_or(0, |target| target.as_str().len());
    if target_bytes > limits.max_uri_bytes {
        return Some(ApiError::UriTooLong {
            limit: limits.max_uri_bytes,
        });
    }
    let headers = request.headers();
    if headers.len() > limits.max_headers {
        return Some(ApiError::HeadersTooLarge(format!(
            "the request has {} headers; at most {} are accepted",
            headers.len(),
            limits.max_headers
        )));
    }
    // As on the wire: "name: value\r\n".
    let header_bytes: usize = headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    if header_bytes > limits.max_header_bytes {
        return Some(ApiError::HeadersTooLarge(format!(
            "the request headers take {header_bytes} bytes; at most {} are accepted",
            limits.max_header_bytes
        )));
    }
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limits.body_limit_bytes as u64) {
        return Some(ApiError::PayloadTooLarge {
            limit: limits.body_limit_bytes,
        });
    }
    None
}

/// Reads the whole body (within the limit and the body timeout) and hands the request on with
/// it in memory. Requests without a body pass straight through.
pub async fn buffer_body(
    State(limits): State<Arc<EdgeLimits>>,
    request: Request,
    next: Next,
) -> Response {
    if request.body().is_end_stream() {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let read = tokio::time::timeout(
        limits.body_read_timeout,
        Limited::new(body, limits.body_limit_bytes).collect(),
    )
    .await;
    let bytes = match read {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(error)) => {
            return closing(if error.is::<LengthLimitError>() {
                ApiError::PayloadTooLarge {
                    limit: limits.body_limit_bytes,
                }
            } else {
                ApiError::InvalidBody("the request body could not be read".to_owned())
            });
        }
        Err(_elapsed) => {
            return closing(ApiError::RequestTimeout {
                timeout_ms: limits.body_read_timeout.as_millis() as u64,
            });
        }
    };
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// The error's response, telling the client this connection ends with it.
fn closing(error: ApiError) -> Response {
    let mut response = error.into_response();
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}
