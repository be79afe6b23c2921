//! The one HTTP error type. Every failure a client can see is a variant here, and this is the only
//! place that turns failures into status codes. Bodies are `{"error":{"code","message"},
//! "trace_id"}`; the trace id is added by the trace middleware, which renders [`ErrorBody`].

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use rebate_domain::ErrorCode;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400: the platform segment is not a known platform.
    #[error("{0}")]
    InvalidPlatform(String),
    /// 400: the item id is not 1–20 digits.
    #[error("{0}")]
    InvalidItemId(String),
    /// 400: the body is not the JSON this endpoint takes.
    #[error("{0}")]
    InvalidBody(String),
    /// 400: a batch names no item or too many.
    #[error("a batch must name between 1 and {max} items; it named {got}")]
    InvalidBatchSize { got: usize, max: usize },
    /// 400: the `x-client-id` header is malformed.
    #[error("{0}")]
    InvalidClientId(String),
    /// 400: the `x-request-class` header is not `page`, `list` or `prefetch`.
    #[error("{0}")]
    InvalidRequestClass(String),
    /// 400: a query string or path parameter of an admin route is malformed.
    #[error("{0}")]
    InvalidQuery(String),
    /// 404: no slow request with this trace id is in this instance's log.
    #[error(
        "no slow, failed or degraded request with this trace id is in this instance's log (it may \
         have been fast, served by another instance, or pushed out by newer ones)"
    )]
    NotRecorded,
    /// 404: no warm job with this id (never submitted, or expired).
    #[error(
        "no warm job with this id (never submitted, or finished more than warm_jobs.job_ttl_secs ago)"
    )]
    JobNotFound,
    /// 503: the warm job queue is full, or Redis failed while queueing or reading a job.
    #[error("{0}")]
    WarmJobsUnavailable(String),
    /// 404: unknown or delisted item.
    #[error("{0}")]
    ItemNotFound(&'static str),
    /// 404: no such route.
    #[error("no such route; see README for the API")]
    RouteNotFound,
    /// 405.
    #[error("method not allowed on this route")]
    MethodNotAllowed,
    /// 401: admin routes without the right bearer token.
    #[error("missing or wrong bearer token")]
    Unauthorized {
        /// Whether an `Authorization` header was sent (the challenge then says `invalid_token`).
        token_offered: bool,
    },
    /// 413: body over the configured limit.
    #[error("request body is larger than {limit} bytes")]
    PayloadTooLarge { limit: usize },
    /// 415.
    #[error("expected a body with Content-Type: application/json")]
    UnsupportedMediaType,
    /// 503: the product source is down and nothing stale is cached.
    #[error("the catalogue is temporarily unavailable; retry later")]
    Unavailable,
    /// 503: shedding load (cache-only) and nothing cached for the item.
    #[error("the service is overloaded; retry after {retry_after_secs} s")]
    Overloaded { retry_after_secs: u32 },
    /// 429: this client is over its request limit.
    #[error("too many requests from this client; retry after {retry_after_secs} s")]
    RateLimited { retry_after_secs: u32 },
    /// 503: the request ran past its hard timeout.
    #[error("the request took too long; retry later")]
    Timeout,
    /// 503: an operator's event could not be handed to the event broker.
    #[error("the event broker is unreachable; the event was not published, retry later")]
    BrokerUnavailable,
    /// 408: the body did not arrive within the body read timeout (the connection is closed).
    #[error("the request body did not arrive within {timeout_ms} ms")]
    RequestTimeout { timeout_ms: u64 },
    /// 414: the request target is over the configured limit.
    #[error("the request target is longer than {limit} bytes")]
    UriTooLong { limit: usize },
    /// 431: the headers are over the configured size or count.
    #[error("{0}")]
    HeadersTooLarge(String),
    /// 400: an HTTP/1.1 request without `Host`, a request with two, or one that is not a host
    /// and port (RFC 9112 §3.2).
    #[error("{0}")]
    InvalidHost(&'static str),
    /// 400: `Transfer-Encoding` applies `chunked` more than once, or a coding this service does
    /// not decode (only `chunked` is).
    #[error("{0}")]
    InvalidTransferEncoding(&'static str),
    /// 415: a body with a `Content-Encoding` other than `identity`; answered with
    /// `Accept-Encoding: identity` (RFC 9110 §15.5.16).
    #[error(
        "the API takes plain JSON: a request body with a Content-Encoding other than identity \
         is not accepted; send it uncompressed"
    )]
    UnsupportedContentEncoding,
    /// 400: a rule set (or its request) is wrong; `field` names the key at fault.
    #[error("{field}: {reason}")]
    InvalidRule { field: String, reason: String },
    /// 404: no rule set of this version.
    #[error("no rule set version {0}")]
    RuleSetNotFound(u64),
    /// 409: the rule set is not in a state that allows the change.
    #[error("{0}")]
    RuleConflict(String),
    /// 500: a bug. The cause is logged, never sent.
    #[error("internal error")]
    Internal,
}

/// The client-facing part of an error, handed to the trace middleware in the response's
/// extensions so that the body can carry the trace id.
#[derive(Debug, Clone)]
pub struct ErrorBody {
    pub code: ErrorCode,
    pub message: String,
    /// The key at fault, for errors about one (`invalid_rule`).
    pub field: Option<String>,
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::InvalidPlatform(_)
            | ApiError::InvalidItemId(_)
            | ApiError::InvalidBody(_)
            | ApiError::InvalidBatchSize { .. }
            | ApiError::InvalidClientId(_)
            | ApiError::InvalidRequestClass(_)
            | ApiError::InvalidQuery(_)
            | ApiError::InvalidRule { .. }
            | ApiError::InvalidHost(_)
            | ApiError::InvalidTransferEncoding(_) => StatusCode::BAD_REQUEST,
            ApiError::ItemNotFound(_)
            | ApiError::RouteNotFound
            | ApiError::NotRecorded
            | ApiError::JobNotFound
            | ApiError::RuleSetNotFound(_) => StatusCode::NOT_FOUND,
            ApiError::RuleConflict(_) => StatusCode::CONFLICT,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Unauthorized { .. } => StatusCode::UNAUTHORIZED,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType | ApiError::UnsupportedContentEncoding => {
                StatusCode::UNSUPPORTED_MEDIA_TYPE
            }
            ApiError::Unavailable
            | ApiError::BrokerUnavailable
            | ApiError::WarmJobsUnavailable(_)
            | ApiError::Timeout
            | ApiError::Overloaded { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::RequestTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            ApiError::UriTooLong { .. } => StatusCode::URI_TOO_LONG,
            ApiError::HeadersTooLarge(_) => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ApiError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn code(&self) -> ErrorCode {
        match self {
            ApiError::InvalidPlatform(_) => ErrorCode::InvalidPlatform,
            ApiError::InvalidItemId(_) => ErrorCode::InvalidItemId,
            ApiError::InvalidBody(_) | ApiError::UnsupportedMediaType => ErrorCode::InvalidBody,
            ApiError::InvalidBatchSize { .. } => ErrorCode::InvalidBatchSize,
            ApiError::ItemNotFound(_) => ErrorCode::ItemNotFound,
            ApiError::RouteNotFound => ErrorCode::RouteNotFound,
            ApiError::MethodNotAllowed => ErrorCode::MethodNotAllowed,
            ApiError::Unauthorized { .. } => ErrorCode::Unauthorized,
            ApiError::PayloadTooLarge { .. } => ErrorCode::PayloadTooLarge,
            ApiError::Unavailable
            | ApiError::BrokerUnavailable
            | ApiError::WarmJobsUnavailable(_) => ErrorCode::Unavailable,
            ApiError::RequestTimeout { .. } => ErrorCode::RequestTimeout,
            ApiError::UriTooLong { .. } => ErrorCode::UriTooLong,
            ApiError::HeadersTooLarge(_) => ErrorCode::HeadersTooLarge,
            ApiError::InvalidHost(_) => ErrorCode::InvalidHost,
            ApiError::InvalidTransferEncoding(_) => ErrorCode::InvalidTransferEncoding,
            ApiError::UnsupportedContentEncoding => ErrorCode::UnsupportedContentEncoding,
            ApiError::Overloaded { .. } => ErrorCode::Overloaded,
            ApiError::RateLimited { .. } => ErrorCode::RateLimited,
            ApiError::InvalidClientId(_) => ErrorCode::InvalidClientId,
            ApiError::InvalidRequestClass(_) => ErrorCode::InvalidRequestClass,
            ApiError::InvalidQuery(_) => ErrorCode::InvalidQuery,
            ApiError::NotRecorded => ErrorCode::NotRecorded,
            ApiError::JobNotFound => ErrorCode::JobNotFound,
            ApiError::Timeout => ErrorCode::Timeout,
            ApiError::InvalidRule { .. } => ErrorCode::InvalidRule,
            ApiError::RuleSetNotFound(_) => ErrorCode::RuleSetNotFound,
            ApiError::RuleConflict(_) => ErrorCode::RuleConflict,
            ApiError::Internal => ErrorCode::Internal,
        }
    }

    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            code: self.code(),
            message: self.to_string(),
            field: match self {
                ApiError::InvalidRule { field, .. } => Some(field.clone()),
                _ => None,
            },
        }
    }

    /// Seconds a client should wait before retrying, for the statuses where retrying helps.
    pub fn retry_after_secs(&self) -> Option<u32> {
        match self {
            ApiError::Unavailable
            | ApiError::BrokerUnavailable
            | ApiError::WarmJobsUnavailable(_)
            | ApiError::Timeout => Some(1),
            ApiError::Overloaded { retry_after_secs }
            | ApiError::RateLimited { retry_after_secs } => Some(*retry_after_secs),
            _ => None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = self.status().into_response();
        if let Some(seconds) = self.retry_after_secs() {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if let ApiError::UnsupportedContentEncoding = self {
            response.headers_mut().insert(
                header::ACCEPT_ENCODING,
                HeaderValue::from_static("identity"),
            );
        }
        if let ApiError::Unauthorized { token_offered } = self {
            // RFC 6750 §3: the challenge, and why a token that was sent is not accepted.
            let challenge = if token_offered {
                r#"Bearer realm="rebate-admin", error="invalid_token""#
            } else {
                r#"Bearer realm="rebate-admin""#
            };
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(challenge),
            );
        }
        response.extensions_mut().insert(self.body());
        response
    }
}
