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
use crate::protection::Protection;

/// The caps, resolved once from `[http]`.
#[derive(Debug, Clone)]
pub struct EdgeLimits {
    pub max_header_bytes: usize,
    pub max_headers: usize,
    pub max_uri_bytes: usize,
    pub body_limit_bytes: usize,
    pub body_read_timeout: Duration,
}

/// The stages between the head and the handler, run as one middleware (each `from_fn` layer
/// clones the stack beneath it and boxes it per request; one layer pays that once): the head's
/// caps (431, 414, 413 on a declared length), the per-client limit (429), the body read (408,
/// 413), the load shedder's admission (stamps the shed level; 503 when refused) and the hard
/// timeout, in that order. The admin listener runs it without `protection`: no client limit and
/// no admission.
#[derive(Debug, Clone)]
pub struct Gate {
    pub limits: Arc<EdgeLimits>,
    /// The per-client limit and the shedder; `None` on the admin listener.
    pub protection: Option<Arc<Protection>>,
    /// The listener's hard timeout (see [`super::middleware::with_timeout`]).
    pub timeout: Duration,
}

/// The gate as a layer (the admin listener's).
pub async fn gate(State(gate): State<Arc<Gate>>, request: Request, next: Next) -> Response {
    gate.run(request, |request| next.run(request)).await
}

impl Gate {
    /// Passes `request` through the stages, then to `handle`.
    pub async fn run<Handle, Answer>(&self, request: Request, handle: Handle) -> Response
    where
        Handle: FnOnce(Request) -> Answer,
        Answer: Future<Output = Response>,
    {
        if let Some(error) = head_error(&self.limits, &request) {
            return closing(error);
        }
        if let Some(protection) = &self.protection
            && let Err(refused) = super::protect::limit_client(
                protection,
                request.headers(),
                super::protect::peer_of(&request),
            )
            .await
        {
            return refused;
        }
        let request = match read_body(&self.limits, request).await {
            Ok(request) => request,
            Err(refused) => return refused,
        };
        let timeout = self.timeout;
        match &self.protection {
            Some(protection) => {
                super::protect::admit(protection, request, |request| {
                    super::middleware::with_timeout(timeout, handle(request))
                })
                .await
            }
            None => super::middleware::with_timeout(timeout, handle(request)).await,
        }
    }
}

pub(super) fn head_error(limits: &EdgeLimits, request: &Request) -> Option<ApiError> {
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

/// Reads the whole body (within the limit and the body timeout) into the request, or the
/// refusal. Requests without a body pass straight through.
async fn read_body(limits: &EdgeLimits, request: Request) -> Result<Request, Response> {
    if request.body().is_end_stream() {
        return Ok(request);
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
            return Err(closing(if error.is::<LengthLimitError>() {
                ApiError::PayloadTooLarge {
                    limit: limits.body_limit_bytes,
                }
            } else {
                ApiError::InvalidBody("the request body could not be read".to_owned())
            }));
        }
        Err(_elapsed) => {
            return Err(closing(ApiError::RequestTimeout {
                timeout_ms: limits.body_read_timeout.as_millis() as u64,
            }));
        }
    };
    Ok(Request::from_parts(parts, Body::from(bytes)))
}

/// The error's response, telling the client this connection ends with it.
fn closing(error: ApiError) -> Response {
    let mut response = error.into_response();
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}
