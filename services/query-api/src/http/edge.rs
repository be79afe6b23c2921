//! The edge's bounds on a request before any work is done for it: the head's size and count
//! caps (431), the target's length (414), the framing HTTP/1.1 requires (400), a declared body
//! over the limit (413 at once, body unread), a compressed body (415), and the body itself, read
//! in full under its own timeout (408) before the request is admitted, so that a client
//! trickling a body is never counted as load nor its wait as the service's latency; a chunk
//! announcing more than the limit fails that read at once (413, see [`crate::chunked`]).
//!
//! Refusals that leave body bytes unread say `connection: close`: the connection cannot be
//! reused, and the client learns it from the response rather than from a reset.
//!
//! # HTTP/1.1 strictness, and what hyper answers first
//! - `Host` (RFC 9112 §3.2): an HTTP/1.1 request without one, any request with two, or one that
//!   is not `host[:port]` is `400 invalid_host`. HTTP/1.0 requests may leave it out.
//! - `Transfer-Encoding`: hyper frames a body as chunked when the last coding is `chunked`, and
//!   itself answers a bare 400 (no JSON, before the service runs) and closes when the last
//!   coding is anything else (`chunked, gzip`), or when an HTTP/1.0 request has the header.
//!   What reaches the edge with a coding other than one `chunked` (`chunked, chunked`,
//!   `gzip, chunked`) is `400 invalid_transfer_encoding`: `chunked` is the only coding decoded
//!   here. (RFC 9112 §6.1 suggests 501 for an unknown coding; a 5xx would count a client's
//!   mistake as the service's failure in the metrics and the slow-request log.)
//! - `Content-Encoding` other than `identity` on a request that has a body (a `Content-Length`
//!   above 0, or chunked) is `415 unsupported_content_encoding` with `Accept-Encoding: identity`:
//!   the API takes plain JSON and decodes nothing. On a request without a body the header
//!   describes nothing and is ignored: refusing it would break clients that send default
//!   headers on every request, and protect nothing.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, HttpBody};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Version, header};
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
/// checks (431, 414, 400 on `Host` and `Transfer-Encoding`, 413 on a declared length, 415 on a
/// compressed body), the per-client limit (429), the body read (408, 413), the load shedder's
/// admission (stamps the shed level; 503 when refused) and the hard timeout, in that order. The
/// admin listener runs it without `protection`: no client limit and no admission.
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
    if let Some(error) = host_error(request) {
        return Some(error);
    }
    if let Some(error) = transfer_encoding_error(headers) {
        return Some(error);
    }
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limits.body_limit_bytes as u64) {
        return Some(ApiError::PayloadTooLarge {
            limit: limits.body_limit_bytes,
        });
    }
    content_encoding_error(request)
}

/// RFC 9112 §3.2: an HTTP/1.1 request carries one `Host`; no request carries two, or one that
/// is not `host[:port]`.
fn host_error(request: &Request) -> Option<ApiError> {
    let mut hosts = request.headers().get_all(header::HOST).iter();
    let problem = match (hosts.next(), hosts.next()) {
        (None, _) if request.version() == Version::HTTP_11 => {
            "an HTTP/1.1 request must have a Host header (RFC 9112 §3.2)"
        }
        (Some(_), Some(_)) => "a request must have at most one Host header (RFC 9112 §3.2)",
        (Some(host), None) if !is_host_and_port(host.as_bytes()) => {
            "the Host header must be host[:port] (RFC 9112 §3.2)"
        }
        _ => return None,
    };
    Some(ApiError::InvalidHost(problem))
}

/// `uri-host [ ":" port ]` (RFC 9110 §7.2, RFC 3986 §3.2.2): an IP literal in brackets or a
/// registered name (IPv4 addresses are names here), then an optional port of digits. Empty is
/// valid: the value a client sends when the target has no authority.
fn is_host_and_port(value: &[u8]) -> bool {
    let (host, port) = match value.strip_prefix(b"[") {
        Some(literal) => {
            let Some(close) = literal.iter().position(|&byte| byte == b']') else {
                return false;
            };
            let address = &literal[..close];
            let valid = !address.is_empty()
                && address
                    .iter()
                    .all(|&byte| is_name_byte(byte) || byte == b':' || byte == b'%');
            if !valid {
                return false;
            }
            match &literal[close + 1..] {
                [] => return true,
                [b':', port @ ..] => (&b""[..], port),
                _ => return false,
            }
        }
        None => match value.iter().position(|&byte| byte == b':') {
            Some(colon) => (&value[..colon], &value[colon + 1..]),
            None => (value, &b""[..]),
        },
    };
    host.iter().all(|&byte| is_name_byte(byte) || byte == b'%')
        && port.iter().all(u8::is_ascii_digit)
}

/// A byte of a registered name, percent signs aside: unreserved or a sub-delimiter.
fn is_name_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=".contains(&byte)
}

/// The codings of a `Transfer-Encoding` (every line's list, in order) must be `chunked`, once.
/// hyper has already refused (with a bare 400) a list whose last coding is not `chunked`.
fn transfer_encoding_error(headers: &HeaderMap) -> Option<ApiError> {
    let mut lines = headers.get_all(header::TRANSFER_ENCODING).iter().peekable();
    lines.peek()?;
    let mut chunked = 0;
    for line in lines {
        let Ok(line) = line.to_str() else {
            return Some(ApiError::InvalidTransferEncoding(
                "the Transfer-Encoding header is not a list of codings",
            ));
        };
        for coding in line
            .split(',')
            .map(str::trim)
            .filter(|coding| !coding.is_empty())
        {
            if !coding.eq_ignore_ascii_case("chunked") {
                return Some(ApiError::InvalidTransferEncoding(
                    "the only transfer coding accepted is chunked; send the body chunked, or \
                     with a Content-Length",
                ));
            }
            chunked += 1;
        }
    }
    match chunked {
        1 => None,
        0 => Some(ApiError::InvalidTransferEncoding(
            "the Transfer-Encoding header names no coding",
        )),
        _ => Some(ApiError::InvalidTransferEncoding(
            "Transfer-Encoding applies chunked more than once; apply it once",
        )),
    }
}

/// A body must not be content-coded (see the module docs for why a request without a body may
/// carry the header).
fn content_encoding_error(request: &Request) -> Option<ApiError> {
    let mut lines = request
        .headers()
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .peekable();
    lines.peek()?;
    if request.body().is_end_stream() {
        return None;
    }
    let identity = |line: &HeaderValue| {
        line.to_str().is_ok_and(|line| {
            line.split(',')
                .map(str::trim)
                .all(|coding| coding.is_empty() || coding.eq_ignore_ascii_case("identity"))
        })
    };
    if lines.all(identity) {
        None
    } else {
        Some(ApiError::UnsupportedContentEncoding)
    }
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
            // Over the limit: the data itself, or a chunk that announced more.
            let too_large =
                error.is::<LengthLimitError>() || crate::chunked::is_chunk_too_large(&*error);
            return Err(closing(if too_large {
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

#[cfg(test)]
mod tests {
    use axum::body::Body;

    use super::*;

    fn limits() -> EdgeLimits {
        EdgeLimits {
            max_header_bytes: 8192,
            max_headers: 64,
            max_uri_bytes: 2048,
            body_limit_bytes: 65_536,
            body_read_timeout: Duration::from_secs(5),
        }
    }

    /// A request of `version` with `headers` and, when `body` is given, that body.
    fn request(version: Version, headers: &[(&str, &str)], body: Option<&str>) -> Request {
        let mut builder = Request::post("/api/v1/items:batch").version(version);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let body = body.map_or_else(Body::empty, |body| Body::from(body.to_owned()));
        builder.body(body).unwrap()
    }

    /// The error code of `request`'s head check, if any.
    fn refusal(request: &Request) -> Option<&'static str> {
        head_error(&limits(), request).map(|error| error.code().as_str())
    }

    #[test]
    fn host_is_required_once_in_http_1_1_and_must_be_a_host_and_port() {
        let v11 = Version::HTTP_11;
        assert_eq!(refusal(&request(v11, &[], None)), Some("invalid_host"));
        assert_eq!(refusal(&request(Version::HTTP_10, &[], None)), None);
        let twice = [("host", "a"), ("host", "a")];
        assert_eq!(refusal(&request(v11, &twice, None)), Some("invalid_host"));
        assert_eq!(
            refusal(&request(Version::HTTP_10, &twice, None)),
            Some("invalid_host"),
            "two are refused whatever the version"
        );
        for valid in [
            "",
            "x",
            "rebate.example.com",
            "127.0.0.1:8080",
            "[::1]",
            "[::1]:8080",
            "[fe80::1%25eth0]:80",
            "under_score.example:",
            "xn--bcher-kva.example",
        ] {
            let headers = [("host", valid)];
            assert_eq!(refusal(&request(v11, &headers, None)), None, "{valid:?}");
        }
        for invalid in [
            "user@example.com",
            "example.com/path",
            "a b",
            "example.com:80:80",
            "example.com:http",
            "[::1",
            "[]",
            "[::1]x",
            "example.com?",
        ] {
            let headers = [("host", invalid)];
            assert_eq!(
                refusal(&request(v11, &headers, None)),
                Some("invalid_host"),
                "{invalid:?}"
            );
        }
    }

    #[test]
    fn transfer_encoding_must_be_chunked_once() {
        let with = |lines: &[&str]| {
            let mut headers = vec![("host", "x")];
            headers.extend(lines.iter().map(|line| ("transfer-encoding", *line)));
            refusal(&request(Version::HTTP_11, &headers, Some("0\r\n\r\n")))
        };
        assert_eq!(with(&[]), None);
        assert_eq!(with(&["chunked"]), None);
        assert_eq!(with(&["Chunked"]), None);
        assert_eq!(
            with(&[" , chunked"]),
            None,
            "empty list elements count for nothing"
        );
        for refused in [
            &["chunked, chunked"][..],
            &["chunked", "chunked"],
            &["gzip, chunked"],
            &["gzip", "chunked"],
            &["chunked, gzip"],
            &[""],
            &["chunked;q=1"],
        ] {
            assert_eq!(
                with(refused),
                Some("invalid_transfer_encoding"),
                "{refused:?}"
            );
        }
    }

    #[test]
    fn a_body_must_not_be_content_coded_and_the_header_alone_is_harmless() {
        let with = |value: &str, body: Option<&str>| {
            let headers = [("host", "x"), ("content-encoding", value)];
            refusal(&request(Version::HTTP_11, &headers, body))
        };
        let body = Some("{}");
        for refused in ["gzip", "br", "identity, gzip", "x-gzip"] {
            assert_eq!(
                with(refused, body),
                Some("unsupported_content_encoding"),
                "{refused}"
            );
        }
        for accepted in ["identity", "IDENTITY", "", "identity, identity"] {
            assert_eq!(with(accepted, body), None, "{accepted:?}");
        }
        assert_eq!(with("gzip", None), None, "no body, nothing to decode");
    }

    #[test]
    fn the_415_says_plain_json_and_names_the_coding_it_takes() {
        let response = ApiError::UnsupportedContentEncoding.into_response();
        assert_eq!(response.status(), 415);
        assert_eq!(response.headers()[header::ACCEPT_ENCODING], "identity");
        let body = response
            .extensions()
            .get::<super::super::ErrorBody>()
            .unwrap();
        assert_eq!(body.code.as_str(), "unsupported_content_encoding");
        assert!(body.message.contains("plain JSON"), "{}", body.message);
    }

    #[test]
    fn a_chunk_too_large_is_found_inside_the_errors_that_wrap_it() {
        let io_error = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            crate::chunked::ChunkTooLarge,
        );
        let wrapped = axum::Error::new(io_error);
        assert!(crate::chunked::is_chunk_too_large(&wrapped));
        let other = axum::Error::new(std::io::Error::other("reset"));
        assert!(!crate::chunked::is_chunk_too_large(&other));
    }
}
