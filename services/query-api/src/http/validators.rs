//! Validators and freshness for quote answers: a strong `ETag` over the answer without its trace
//! id, `If-None-Match` → `304 Not Modified` with no body, and a `Cache-Control` that says how long
//! the answer stays what the service would answer.
//!
//! The tag is the same for every answer of the same quote — on the hot path (precomputed with
//! the kept rendering), on the general path (hashed from the body) and on any instance — and
//! changes when anything in the quote does: a rate changed by an event, a coupon gone, a part
//! degraded or recovered. `If-None-Match` is honoured on the batch route as on the single one:
//! the batch is a read (`POST` only because its keys are a body), and a list page polling it is
//! what the tag is for.

use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use rebate_domain::Timestamp;

/// The trace id member that ends every quote and batch body: `,"trace_id":"` + 32 hex + `"}`.
const TRACE_MEMBER_LEN: usize = 13 + 32 + 2;

/// The longest `max-age` given to a kept rendering (its parts' freshness is normally shorter).
pub(super) const MAX_AGE_CAP: Duration = Duration::from_secs(300);

/// For answers whose freshness is not known here (assembled, degraded, batches): a client may
/// keep them, but must ask again (cheaply, with `If-None-Match`) before using them.
pub(super) const REVALIDATE: HeaderValue = HeaderValue::from_static("private, no-cache");

/// The strong entity tag of a body that ends with its trace id member (see
/// [`rebate_engine::entity_tag`]): the bytes before that member are hashed.
pub(super) fn body_etag(body: &[u8]) -> HeaderValue {
    let members = match body.len().checked_sub(TRACE_MEMBER_LEN) {
        Some(end) if body[end..].starts_with(br#","trace_id":""#) => &body[..end],
        // Not the usual shape: the whole body but its last byte, still a function of it alone.
        _ => &body[..body.len().saturating_sub(1)],
    };
    rebate_engine::entity_tag(members)
}

/// `Cache-Control` for a kept rendering valid until `valid_until`: private (a shared cache would
/// serve it past an invalidation event and around the per-client limit), for the whole seconds
/// left, at most [`MAX_AGE_CAP`].
pub(super) fn fresh_for(valid_until: Timestamp, now: Timestamp) -> HeaderValue {
    let seconds = (valid_until.millis_since(now) / 1000).min(MAX_AGE_CAP.as_secs());
    static VALUES: std::sync::LazyLock<Vec<HeaderValue>> = std::sync::LazyLock::new(|| {
        (0..=MAX_AGE_CAP.as_secs())
            .map(|seconds| {
                HeaderValue::from_str(&format!("private, max-age={seconds}"))
                    .expect("ASCII digits are a valid header value")
            })
            .collect()
    });
    VALUES[usize::try_from(seconds).unwrap_or(0)].clone()
}

/// Adds the tag and the freshness to a `200` answer.
pub(super) fn stamp(response: &mut Response, etag: HeaderValue, cache_control: HeaderValue) {
    let headers = response.headers_mut();
    headers.insert(header::ETAG, etag);
    headers.insert(header::CACHE_CONTROL, cache_control);
}

/// Whether an `If-None-Match` value names `etag`: `*`, or a list of tags compared weakly (a
/// `W/` prefix is ignored), as RFC 9110 §13.1.2 asks for this header.
pub(super) fn none_match_names(if_none_match: &HeaderValue, etag: &HeaderValue) -> bool {
    let Ok(value) = if_none_match.to_str() else {
        return false;
    };
    let etag = etag.as_bytes();
    value.split(',').map(str::trim).any(|candidate| {
        candidate == "*" || candidate.strip_prefix("W/").unwrap_or(candidate).as_bytes() == etag
    })
}

/// `response` as a `304` when it is a `200` whose tag `if_none_match` names: the same headers
/// (tag, freshness, `Vary`, trace id) without the body or its content headers.
pub(super) fn conditional(if_none_match: Option<&HeaderValue>, response: Response) -> Response {
    let Some(if_none_match) = if_none_match else {
        return response;
    };
    let matched = response.status() == StatusCode::OK
        && response
            .headers()
            .get(header::ETAG)
            .is_some_and(|etag| none_match_names(if_none_match, etag));
    if !matched {
        return response;
    }
    let (mut parts, _body) = response.into_parts();
    parts.status = StatusCode::NOT_MODIFIED;
    parts.headers.remove(header::CONTENT_TYPE);
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::empty())
}

/// The request's `If-None-Match`, if any (kept across the stages, which consume the request).
pub(super) fn if_none_match(headers: &HeaderMap) -> Option<HeaderValue> {
    headers.get(header::IF_NONE_MATCH).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACE_A: &[u8] = br#","trace_id":"4bf92f3577b34da6a3ce929d0e0e4736"}"#;
    const TRACE_B: &[u8] = br#","trace_id":"00000000000000000000000000000001"}"#;

    fn body(members: &[u8], trace: &[u8]) -> Vec<u8> {
        [members, trace].concat()
    }

    #[test]
    fn the_tag_ignores_the_trace_id_and_follows_everything_else() {
        let a = body(br#"{"rebate":{"rate_bps":850}"#, TRACE_A);
        let b = body(br#"{"rebate":{"rate_bps":850}"#, TRACE_B);
        let changed = body(br#"{"rebate":{"rate_bps":851}"#, TRACE_A);
        assert_eq!(body_etag(&a), body_etag(&b));
        assert_ne!(body_etag(&a), body_etag(&changed));
        let tag = body_etag(&a);
        let text = tag.to_str().unwrap();
        assert_eq!(text.len(), 34);
        assert!(text.starts_with('"') && text.ends_with('"'));
        // The engine's tag of the same members (what a kept rendering precomputes).
        assert_eq!(
            tag,
            rebate_engine::entity_tag(br#"{"rebate":{"rate_bps":850}"#)
        );
    }

    #[test]
    fn if_none_match_is_compared_weakly_and_star_matches() {
        let tag = HeaderValue::from_static("\"abc\"");
        for matching in ["\"abc\"", "W/\"abc\"", "\"x\", \"abc\"", "*"] {
            assert!(
                none_match_names(&HeaderValue::from_static(matching), &tag),
                "{matching}"
            );
        }
        for other in ["\"abd\"", "abc", "\"abc", ""] {
            assert!(
                !none_match_names(&HeaderValue::from_static(other), &tag),
                "{other}"
            );
        }
    }

    #[test]
    fn a_named_tag_turns_a_200_into_a_bodiless_304_with_its_headers() {
        let mut response = Response::new(Body::from("{}"));
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        stamp(&mut response, HeaderValue::from_static("\"t\""), REVALIDATE);
        let response = conditional(Some(&HeaderValue::from_static("\"t\"")), response);
        assert_eq!(response.status(), StatusCode::NOT_MODIFIED);
        assert_eq!(response.headers()[header::ETAG], "\"t\"");
        assert_eq!(
            response.headers()[header::CACHE_CONTROL],
            "private, no-cache"
        );
        assert!(response.headers().get(header::CONTENT_TYPE).is_none());
        let other = Response::new(Body::from("{}"));
        assert_eq!(
            conditional(Some(&HeaderValue::from_static("*")), other).status(),
            StatusCode::OK,
            "no tag, no 304"
        );
    }

    #[test]
    fn max_age_is_the_whole_seconds_left_capped() {
        let now = Timestamp::from_millis(1_000_000);
        assert_eq!(
            fresh_for(Timestamp::from_millis(1_059_999), now),
            "private, max-age=59"
        );
        assert_eq!(
            fresh_for(Timestamp::from_millis(999_000), now),
            "private, max-age=0"
        );
        assert_eq!(
            fresh_for(Timestamp::from_millis(1_000_000 + 3_600_000), now),
            "private, max-age=300"
        );
    }
}
