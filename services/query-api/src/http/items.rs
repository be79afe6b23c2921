//! `GET /api/v1/items/{platform}/{item_id}/rebate` and `POST /api/v1/items:batch`.

use std::collections::HashSet;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use rebate_domain::{ItemKey, KeyError, Timestamp};
use rebate_engine::{DegradeReason, QueryError, Quote, QuoteAnswer, RenderedQuote, ShedLevel};
use rebate_telemetry::TraceId;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::error::{ApiError, ErrorBody};
use super::extract::{ApiJson, ApiPath};
use super::routes::{BATCH_ROUTE, ITEM_ROUTE};
use super::{encoding, validators};
use crate::metrics::Answered;
use crate::state::AppState;

pub fn router() -> Router<AppState> {
    Router::new()
        .route(ITEM_ROUTE, get(item_rebate))
        .route(BATCH_ROUTE, post(batch_rebate))
}

/// A quote with the request's trace id, the success body of the single-item route.
#[derive(Serialize)]
struct QuoteBody<'a> {
    #[serde(flatten)]
    quote: &'a Quote,
    trace_id: TraceId,
}

#[utoipa::path(get, path = "/api/v1/items/{platform}/{item_id}/rebate", tag = "public",
    operation_id = "item_rebate",
    params(
        ("platform" = super::schemas::Platform, Path, example = "taobao",
            description = "`taobao`, `jd` or `pdd`."),
        ("item_id" = String, Path, pattern = "^[0-9]{1,20}$", example = "100001",
            description = "1–20 ASCII digits (the demo catalogue: 100001–110000)."),
        ("x-client-id" = Option<String>, Header, pattern = "^[A-Za-z0-9._:-]{1,64}$",
            description = "Who the client is, for the per-client limit (else its address)."),
        ("x-request-class" = Option<super::schemas::RequestClass>, Header,
            description = "Lowers the request's class for load shedding (never raises it)."),
        ("traceparent" = Option<String>, Header,
            description = "W3C trace context: a valid one gives the answer its trace id; any \
                other value is ignored."),
        ("if-none-match" = Option<String>, Header,
            description = "Tags of answers held: an unchanged answer is `304`."),
    ),
    responses(
        (status = 200, description = "The quote: live, or degraded part by part.",
            body = super::schemas::QuoteBody),
        (status = 304, description = "Not modified: `If-None-Match` names this answer's tag."),
        (status = 400, description = "`invalid_platform`, `invalid_item_id`, `invalid_query` \
            (a segment that is not percent-encoded UTF-8), `invalid_client_id` or \
            `invalid_request_class`.", body = super::schemas::ErrorEnvelope),
        (status = 404, description = "`item_not_found`: unknown or delisted.",
            body = super::schemas::ErrorEnvelope),
    ))]
pub(super) async fn item_rebate(
    State(state): State<AppState>,
    Extension(trace_id): Extension<TraceId>,
    Extension(level): Extension<ShedLevel>,
    headers: HeaderMap,
    ApiPath((platform, item_id)): ApiPath<(String, String)>,
) -> Result<Response, ApiError> {
    quote_item(&state, trace_id, level, &headers, &platform, &item_id).await
}

/// The single-item route without the router, for the edge's fast path: a `GET` on a path that
/// [`super::routes::item_segments`] splits (no percent-encoding to decode) is answered here,
/// exactly as the routed handler answers it; any other request is handed back for the router.
pub(super) async fn item_rebate_direct(
    state: &AppState,
    request: Request,
) -> Result<Response, Request> {
    let (parts, body) = request.into_parts();
    let segments = (parts.method == Method::GET)
        .then(|| super::routes::item_segments(parts.uri.path()))
        .flatten();
    let Some((platform, item_id)) = segments else {
        return Err(Request::from_parts(parts, body));
    };
    drop(body);
    let (Some(&trace_id), Some(&level)) = (
        parts.extensions.get::<TraceId>(),
        parts.extensions.get::<ShedLevel>(),
    ) else {
        tracing::error!("the edge ran the item route without a trace id or shed level");
        return Ok(ApiError::Internal.into_response());
    };
    Ok(
        quote_item(state, trace_id, level, &parts.headers, platform, item_id)
            .await
            .into_response(),
    )
}

async fn quote_item(
    state: &AppState,
    trace_id: TraceId,
    level: ShedLevel,
    headers: &HeaderMap,
    platform: &str,
    item_id: &str,
) -> Result<Response, ApiError> {
    let key = parse_key(platform, item_id)?;
    if let Some((mut response, answered)) =
        quote_rendered(state, &trace_id.hex_digits(), key, headers)
    {
        response.extensions_mut().insert(answered);
        return Ok(response);
    }
    let accept = headers.get(header::ACCEPT_ENCODING).cloned();
    quote_assembled(state, trace_id, level, key, accept).await
}

/// `key`'s answer from its kept rendering when one is valid now, without a future: the edge's
/// hot path answers with this alone. The answers go beside the response, not in it.
pub(super) fn quote_rendered(
    state: &AppState,
    trace_hex: &[u8; 32],
    key: ItemKey,
    headers: &HeaderMap,
) -> Option<(Response, Answered)> {
    let (rendered, now) = state.engine.answer_rendered(key)?;
    if let Some(hot_keys) = &state.hot_keys {
        hot_keys.record(key);
    }
    // Only complete quotes are kept rendered.
    let accept = || headers.get(header::ACCEPT_ENCODING);
    Some(rendered_response(state, &rendered, trace_hex, now, accept))
}

/// A kept rendering's answer: its body with the trace id, its precomputed tag, and fresh for
/// what is left of its validity.
fn rendered_response<'a>(
    state: &AppState,
    rendered: &RenderedQuote,
    trace_hex: &[u8; 32],
    now: Timestamp,
    accept: impl FnOnce() -> Option<&'a HeaderValue>,
) -> (Response, Answered) {
    let response = tagged_response(
        state,
        accept,
        with_trace_id(rendered, trace_hex),
        rendered.etag().clone(),
        validators::fresh_for(rendered.valid_until(), now),
    );
    (response, answered(false))
}

/// A quote's or a batch's `200`: the body (compressed when it is large and `accept`, the
/// request's `Accept-Encoding`, takes a coding), its tag and its freshness. `accept` is asked
/// only for a body large enough to compress.
fn tagged_response<'a>(
    state: &AppState,
    accept: impl FnOnce() -> Option<&'a HeaderValue>,
    body: Vec<u8>,
    mut etag: HeaderValue,
    cache_control: HeaderValue,
) -> Response {
    let compression = state
        .limits
        .compression
        .filter(|compression| compression.applies_to(body.len()));
    let Some(compression) = compression else {
        let mut response = json_response(body);
        validators::stamp(&mut response, etag, cache_control);
        return response;
    };
    let (body, coding) = match compression.compress(accept(), &body) {
        Some((coding, compressed)) => (compressed, Some(coding)),
        None => (body, None),
    };
    let mut response = json_response(body);
    encoding::mark(response.headers_mut(), coding, &mut etag);
    validators::stamp(&mut response, etag, cache_control);
    response
}

/// The kept JSON with the trace id (its hex digits) appended: one copy.
fn with_trace_id(rendered: &RenderedQuote, trace_hex: &[u8; 32]) -> Vec<u8> {
    let mut member = [0u8; 45];
    member[..12].copy_from_slice(br#""trace_id":""#);
    member[12..44].copy_from_slice(trace_hex);
    member[44] = b'"';
    rendered.with_members(&member)
}

/// `key`'s answer assembled by the engine (its kept rendering missed), with its answers in the
/// response's extensions.
pub(super) async fn quote_assembled(
    state: &AppState,
    trace_id: TraceId,
    level: ShedLevel,
    key: ItemKey,
    accept: Option<HeaderValue>,
) -> Result<Response, ApiError> {
    let deadline = Instant::now() + state.limits.live.request_deadline();
    // Boxed: assembling is a large future, and this one is inside every request's.
    let answer = Box::pin(state.engine.answer(key, deadline, level))
        .await
        .map_err(|error| query_error(state, error))?;
    if let Some(hot_keys) = &state.hot_keys {
        hot_keys.record(key);
    }
    let (mut response, answered) = match &answer {
        QuoteAnswer::Rendered(rendered) => rendered_response(
            state,
            rendered,
            &trace_id.hex_digits(),
            state.engine.now(),
            || accept.as_ref(),
        ),
        QuoteAnswer::Assembled(quote) => {
            let body = serde_json::to_vec(&QuoteBody { quote, trace_id }).map_err(|error| {
                tracing::error!(%error, "cannot render a quote");
                ApiError::Internal
            })?;
            let etag = validators::body_etag(&body);
            // Not kept (degraded, or renderings off): how long it stays as it is is unknown
            // here, so it is to be revalidated.
            let response = tagged_response(
                state,
                || accept.as_ref(),
                body,
                etag,
                validators::REVALIDATE,
            );
            (response, answered(quote.degraded))
        }
    };
    response.extensions_mut().insert(answered);
    Ok(response)
}

/// A JSON body's response. Built directly: axum's `(headers, Vec<u8>)` sets a content type and
/// then replaces it.
fn json_response(body: Vec<u8>) -> Response {
    let mut response = Response::new(Body::from(body));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// What one quote answered.
fn answered(degraded: bool) -> Answered {
    Answered {
        complete: u32::from(!degraded),
        degraded: u32::from(degraded),
        ..Answered::default()
    }
}

pub(super) fn parse_key(platform: &str, item_id: &str) -> Result<ItemKey, ApiError> {
    ItemKey::parse(platform, item_id).map_err(|error| match error {
        KeyError::UnknownPlatform(_) => ApiError::InvalidPlatform(error.to_string()),
        KeyError::EmptyItemId | KeyError::ItemIdTooLong(_) | KeyError::ItemIdNotDigits => {
            ApiError::InvalidItemId(error.to_string())
        }
    })
}

fn query_error(state: &AppState, error: QueryError) -> ApiError {
    match error {
        QueryError::NotFound { delisted: false } => ApiError::ItemNotFound("no such item"),
        QueryError::NotFound { delisted: true } => {
            ApiError::ItemNotFound("the item is no longer on sale")
        }
        QueryError::Unavailable {
            reason: DegradeReason::Shed,
        } => ApiError::Overloaded {
            retry_after_secs: state.protection.shed_retry_after(),
        },
        QueryError::Unavailable { reason } => {
            // The trace layer logs the 503 once, with the trace id and the stages behind it.
            tracing::debug!(
                reason = reason.as_str(),
                "product source unavailable, nothing stale"
            );
            ApiError::Unavailable
        }
    }
}

/// `{"items": [{"platform": …, "item_id": …}, …]}`: the batch route's body, and the admin warm
/// route's.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "an object with an `items` list")]
pub struct BatchRequest {
    pub items: Vec<BatchKey>,
}

impl BatchRequest {
    /// Refuses an empty batch or one over `max` keys.
    pub fn check_size(&self, max: usize) -> Result<(), ApiError> {
        if self.items.is_empty() || self.items.len() > max {
            return Err(ApiError::InvalidBatchSize {
                got: self.items.len(),
                max,
            });
        }
        Ok(())
    }
}

/// Kept as raw strings so that one bad key is reported on its own line instead of failing the
/// whole batch.
#[derive(Debug, Deserialize, PartialEq, Eq, Hash)]
#[serde(
    deny_unknown_fields,
    expecting = "an object with `platform` and `item_id` strings"
)]
pub struct BatchKey {
    pub platform: String,
    pub item_id: String,
}

#[derive(Serialize)]
struct BatchBody {
    results: Vec<BatchResult>,
    trace_id: TraceId,
}

#[derive(Serialize)]
struct BatchResult {
    platform: String,
    item_id: String,
    /// The HTTP status this item would have had on its own.
    status: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    quote: Option<QuoteAnswer>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<BatchError>,
}

impl BatchResult {
    /// About how many bytes this result serialises to: a kept rendering's length plus the
    /// result's own members, or a typical quote's or error's.
    fn size_hint(&self) -> usize {
        let own = 64 + self.platform.len() + self.item_id.len();
        own + match &self.quote {
            Some(QuoteAnswer::Rendered(rendered)) => rendered.json().get().len(),
            Some(QuoteAnswer::Assembled(_)) => 1024,
            None => 160,
        }
    }
}

#[derive(Serialize)]
struct BatchError {
    code: rebate_domain::ErrorCode,
    message: String,
    /// For `overloaded` items: when asking again may help.
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after_secs: Option<u32>,
}

impl From<&ApiError> for BatchError {
    fn from(error: &ApiError) -> Self {
        let ErrorBody { code, message, .. } = error.body();
        Self {
            code,
            message,
            retry_after_secs: error.retry_after_secs(),
        }
    }
}

/// Answers each distinct key once, in the order of first appearance, all in parallel under one
/// deadline. Per-item failures are per-item statuses; the batch itself is 200.
#[utoipa::path(post, path = "/api/v1/items:batch", tag = "public", operation_id = "batch_rebate",
    params(
        ("x-client-id" = Option<String>, Header, pattern = "^[A-Za-z0-9._:-]{1,64}$",
            description = "Who the client is, for the per-client limit (else its address)."),
        ("x-request-class" = Option<super::schemas::RequestClass>, Header,
            description = "Lowers the request's class for load shedding (never raises it)."),
        ("traceparent" = Option<String>, Header,
            description = "W3C trace context: a valid one gives the answer its trace id; any \
                other value is ignored."),
        ("if-none-match" = Option<String>, Header,
            description = "Tags of answers held: an unchanged answer is `304`."),
    ),
    request_body(content = super::schemas::BatchRequest, content_type = "application/json",
        example = json!({"items": [{"platform": "taobao", "item_id": "100001"},
            {"platform": "jd", "item_id": "abc"}, {"platform": "pdd", "item_id": "101123"}]})),
    responses(
        (status = 200, description = "Each distinct key once, in order of first appearance, \
            with the status it would have had on its own.", body = super::schemas::BatchBody),
        (status = 304, description = "Not modified: `If-None-Match` names this answer's tag."),
        (status = 400, description = "`invalid_body` (not this JSON, unknown fields), \
            `invalid_batch_size` (0 or over `http.max_batch_items` keys), `invalid_client_id` \
            or `invalid_request_class`.", body = super::schemas::ErrorEnvelope),
        (status = 415, description = "`invalid_body`: not sent as `application/json`.",
            body = super::schemas::ErrorEnvelope),
    ))]
pub(super) async fn batch_rebate(
    State(state): State<AppState>,
    Extension(trace_id): Extension<TraceId>,
    Extension(level): Extension<ShedLevel>,
    headers: HeaderMap,
    ApiJson(request): ApiJson<BatchRequest>,
) -> Result<Response, ApiError> {
    request.check_size(state.limits.max_batch_items)?;
    let mut seen = HashSet::with_capacity(request.items.len());
    let distinct: Vec<BatchKey> = request
        .items
        .into_iter()
        .filter(|key| seen.insert((key.platform.clone(), key.item_id.clone())))
        .collect();

    // Bad keys are answered on their own line; the valid ones are quoted together, so that what
    // L1 lacks is read from L2 in one round trip.
    let parsed: Vec<Result<ItemKey, ApiError>> = distinct
        .iter()
        .map(|raw| parse_key(&raw.platform, &raw.item_id))
        .collect();
    let valid: Vec<ItemKey> = parsed
        .iter()
        .filter_map(|key| key.as_ref().ok().copied())
        .collect();
    let deadline = Instant::now() + state.limits.live.request_deadline();
    let mut quotes = state
        .engine
        .answer_many(&valid, deadline, level)
        .await
        .into_iter();
    let answers = parsed.into_iter().map(|key| {
        let key = key?;
        let answer = quotes
            .next()
            .expect("quote_many answers every key it is given, in order")
            .map_err(|error| query_error(&state, error))?;
        if let Some(hot_keys) = &state.hot_keys {
            hot_keys.record(key);
        }
        Ok(answer)
    });

    let answers: Vec<Result<QuoteAnswer, ApiError>> = answers.collect();
    // Shedding with nothing cached for any item: the batch as a whole is overloaded, so that
    // clients see one 503 with one Retry-After rather than a 200 full of refusals.
    if answers
        .iter()
        .all(|answer| matches!(answer, Err(ApiError::Overloaded { .. })))
    {
        return Err(ApiError::Overloaded {
            retry_after_secs: state.protection.shed_retry_after(),
        });
    }
    let results = distinct
        .into_iter()
        .zip(answers)
        .map(|(raw, answer)| match answer {
            Ok(quote) => BatchResult {
                platform: raw.platform,
                item_id: raw.item_id,
                status: 200,
                quote: Some(quote),
                error: None,
            },
            Err(error) => BatchResult {
                platform: raw.platform,
                item_id: raw.item_id,
                status: error.status().as_u16(),
                quote: None,
                error: Some(BatchError::from(&error)),
            },
        })
        .collect();
    let results: Vec<BatchResult> = results;
    let mut answered = Answered::default();
    for result in &results {
        match (&result.quote, &result.error) {
            (Some(quote), _) if quote.degraded() => answered.degraded += 1,
            (Some(_), _) => answered.complete += 1,
            (None, Some(error)) if error.code == rebate_domain::ErrorCode::ItemNotFound => {
                answered.not_found += 1;
            }
            (None, Some(error))
                if matches!(
                    error.code,
                    rebate_domain::ErrorCode::InvalidPlatform
                        | rebate_domain::ErrorCode::InvalidItemId
                ) =>
            {
                answered.invalid += 1;
            }
            (None, _) => answered.failed += 1,
        }
    }
    // Serialised into a buffer sized for the answer: axum's `Json` starts at 128 bytes and
    // doubles, and a 50-item answer (~34 KB) was reallocated and copied nine times — a sixth of
    // the batch route's instructions.
    let capacity = 64 + results.iter().map(BatchResult::size_hint).sum::<usize>();
    let mut body = Vec::with_capacity(capacity);
    serde_json::to_writer(&mut body, &BatchBody { results, trace_id }).map_err(|error| {
        tracing::error!(%error, "cannot render a batch answer");
        ApiError::Internal
    })?;
    let etag = validators::body_etag(&body);
    let mut response = tagged_response(
        &state,
        || headers.get(header::ACCEPT_ENCODING),
        body,
        etag,
        validators::REVALIDATE,
    );
    response.extensions_mut().insert(answered);
    Ok(response)
}
