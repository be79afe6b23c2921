//! The small error vocabulary shared with clients. Clients branch on these codes (back off, fall
//! back, give up), so a code is never renamed once published.

use serde::{Deserialize, Serialize};

/// An error's code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The platform segment is not one of taobao, jd, pdd.
    InvalidPlatform,
    /// The item id is not 1–20 ASCII digits.
    InvalidItemId,
    /// The request body is not the JSON the endpoint expects.
    InvalidBody,
    /// A batch must name 1 to 50 items.
    InvalidBatchSize,
    /// The item does not exist or is no longer on sale.
    ItemNotFound,
    /// No such route.
    RouteNotFound,
    /// The route exists but not for this method.
    MethodNotAllowed,
    /// An admin route without the right bearer token.
    Unauthorized,
    /// The request body exceeds the configured limit.
    PayloadTooLarge,
    /// A dependency needed for a minimal answer is down and nothing stale is cached.
    Unavailable,
    /// The request ran past its deadline.
    Timeout,
    /// The service is shedding load and had nothing cached for this item; retry after the
    /// `Retry-After` delay.
    Overloaded,
    /// This client sent more requests than its limit; retry after the `Retry-After` delay.
    RateLimited,
    /// An admin route's query string or path parameter is malformed.
    InvalidQuery,
    /// The slow-request log holds no request with this trace id.
    NotRecorded,
    /// No warm job with this id (never submitted, or its progress expired).
    JobNotFound,
    /// The `x-client-id` header is not 1–64 characters of letters, digits, `.`, `_`, `:`, `-`.
    InvalidClientId,
    /// The `x-request-class` header is not `page`, `list` or `prefetch`.
    InvalidRequestClass,
    /// The request body did not arrive within the body read timeout.
    RequestTimeout,
    /// The request target (path and query) is longer than the configured limit.
    UriTooLong,
    /// The request headers are larger, or more numerous, than the configured limits.
    HeadersTooLarge,
    /// An HTTP/1.1 request without a `Host` header, or a request with two, or with one that is
    /// not a host and port (RFC 9112 §3.2).
    InvalidHost,
    /// `Transfer-Encoding` applies `chunked` more than once, or a coding other than `chunked`.
    InvalidTransferEncoding,
    /// A request body with a `Content-Encoding` other than `identity`: the API takes plain
    /// JSON.
    UnsupportedContentEncoding,
    /// This listener, or this peer address, holds as many connections as it is allowed.
    TooManyConnections,
    /// A live rule set, or a request about one, is wrong; the error's `field` names the key.
    InvalidRule,
    /// No rule set of this version.
    RuleSetNotFound,
    /// The rule set is not in a state that allows the change (a canary already under way, a
    /// version already active, …).
    RuleConflict,
    /// A bug; details are only in the logs.
    Internal,
}

impl ErrorCode {
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidPlatform => "invalid_platform",
            ErrorCode::InvalidRule => "invalid_rule",
            ErrorCode::RuleSetNotFound => "rule_set_not_found",
            ErrorCode::RuleConflict => "rule_conflict",
            ErrorCode::InvalidItemId => "invalid_item_id",
            ErrorCode::InvalidBody => "invalid_body",
            ErrorCode::InvalidBatchSize => "invalid_batch_size",
            ErrorCode::ItemNotFound => "item_not_found",
            ErrorCode::RouteNotFound => "route_not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Timeout => "timeout",
            ErrorCode::Overloaded => "overloaded",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::InvalidClientId => "invalid_client_id",
            ErrorCode::InvalidRequestClass => "invalid_request_class",
            ErrorCode::InvalidQuery => "invalid_query",
            ErrorCode::NotRecorded => "not_recorded",
            ErrorCode::JobNotFound => "job_not_found",
            ErrorCode::RequestTimeout => "request_timeout",
            ErrorCode::UriTooLong => "uri_too_long",
            ErrorCode::HeadersTooLarge => "headers_too_large",
            ErrorCode::InvalidHost => "invalid_host",
            ErrorCode::InvalidTransferEncoding => "invalid_transfer_encoding",
            ErrorCode::UnsupportedContentEncoding => "unsupported_content_encoding",
            ErrorCode::TooManyConnections => "too_many_connections",
            ErrorCode::Internal => "internal",
        }
    }
}
