//! The HTTP edge: routes, handlers, and the one place errors become responses.
//!
//! The single-item and batch routes of an endpoint share one handler each, generic over the
//! endpoint's body type ([`ItemBody`]), so a batch element is built exactly as a single answer is.

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use rebate_domain::{ItemKey, KeyError, Timestamp};
use serde::Serialize;
use serde_json::json;

use crate::batch::{BatchError, BatchRequest, BatchResponse, MAX_BODY_BYTES};
use crate::catalog::{self, CouponsResponse, ExtrasResponse};
use crate::endpoint::{Endpoint, PerEndpoint, UnknownEndpoint};
use crate::fault::{Fault, FaultError};
use crate::state::{Call, CounterSnapshot, Refusal, SimState};

/// The simulator's routes: data endpoints (single and batch), control routes under `/_sim`, and
/// `/healthz`. Request bodies over [`MAX_BODY_BYTES`] are refused with 413.
pub fn router(state: SimState) -> Router {
    Router::new()
        .route(
            "/v1/coupons/{platform}/{item_id}",
            get(answer_one::<CouponsResponse>),
        )
        .route("/v1/coupons:batch", post(answer_batch::<CouponsResponse>))
        .route(
            "/v1/extras/{platform}/{item_id}",
            get(answer_one::<ExtrasResponse>),
        )
        .route("/v1/extras:batch", post(answer_batch::<ExtrasResponse>))
        .route("/_sim/faults", get(list_faults).delete(reset_faults))
        .route(
            "/_sim/faults/{endpoint}",
            get(get_fault).put(put_fault).delete(reset_fault),
        )
        .route("/_sim/counters", get(list_counters).delete(reset_counters))
        .route("/healthz", get(healthz))
        .fallback(route_not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// Every non-200 answer of the simulator, each variant documenting its status. Rendered as
/// `{"error":{"code":…,"message":…}}`, the same shape the real APIs are assumed to use.
#[derive(Debug, thiserror::Error)]
enum SimError {
    /// 400 `invalid_item`: the platform or item id is not valid.
    #[error(transparent)]
    InvalidItem(#[from] KeyError),
    /// 400 `invalid_item`: the path could not be decoded at all (e.g. bad percent-encoding).
    #[error("{0}")]
    InvalidPath(String),
    /// 400 `invalid_body`: the body is not JSON, or not a fault or batch request (the message
    /// names the field).
    #[error("{0}")]
    InvalidBody(String),
    /// A well-formed batch body that cannot be served: 400 `invalid_body` for an empty list,
    /// 400 `too_many_items` over the batch size limit, 400 `invalid_item` for an invalid key (the
    /// message names its index, `items[k]`).
    #[error(transparent)]
    InvalidBatch(#[from] BatchError),
    /// 413 `payload_too_large`: the body is over [`MAX_BODY_BYTES`].
    #[error("the request body is over {MAX_BODY_BYTES} bytes")]
    PayloadTooLarge,
    /// 415 `unsupported_media_type`: the body was not sent as `application/json`.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// 400 `invalid_fault`: well-formed JSON with a value out of range.
    #[error(transparent)]
    InvalidFault(#[from] FaultError),
    /// 404 `unknown_endpoint`.
    #[error(transparent)]
    UnknownEndpoint(#[from] UnknownEndpoint),
    /// 404 `route_not_found`.
    #[error("no such route")]
    RouteNotFound,
    /// 405 `method_not_allowed`.
    #[error("the route exists but not for this method")]
    MethodNotAllowed,
    /// 500 `injected_error`: the `error_rate` fault fired.
    #[error("injected error")]
    InjectedError,
    /// 429 `rate_limited` with `Retry-After: 1`: the `rate_limited` fault is on.
    #[error("rate limited; retry after 1 s")]
    RateLimited,
    /// 503 `outage`: the `outage` fault is on.
    #[error("the upstream API is down")]
    Outage,
    /// 503 `shutting_down`: a hung or delayed call released by shutdown.
    #[error("the simulator is shutting down")]
    ShuttingDown,
}

impl SimError {
    fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            SimError::InvalidItem(_) | SimError::InvalidPath(_) => {
                (StatusCode::BAD_REQUEST, "invalid_item")
            }
            SimError::InvalidBody(_) | SimError::InvalidBatch(BatchError::Empty) => {
                (StatusCode::BAD_REQUEST, "invalid_body")
            }
            SimError::InvalidBatch(BatchError::TooManyItems { .. }) => {
                (StatusCode::BAD_REQUEST, "too_many_items")
            }
            SimError::InvalidBatch(BatchError::InvalidItem { .. }) => {
                (StatusCode::BAD_REQUEST, "invalid_item")
            }
            SimError::PayloadTooLarge => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            SimError::UnsupportedMediaType(_) => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
            }
            SimError::InvalidFault(_) => (StatusCode::BAD_REQUEST, "invalid_fault"),
            SimError::UnknownEndpoint(_) => (StatusCode::NOT_FOUND, "unknown_endpoint"),
            SimError::RouteNotFound => (StatusCode::NOT_FOUND, "route_not_found"),
            SimError::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            SimError::InjectedError => (StatusCode::INTERNAL_SERVER_ERROR, "injected_error"),
            SimError::RateLimited => (StatusCode::TOO_MANY_REQUESTS, "rate_limited"),
            SimError::Outage => (StatusCode::SERVICE_UNAVAILABLE, "outage"),
            SimError::ShuttingDown => (StatusCode::SERVICE_UNAVAILABLE, "shutting_down"),
        }
    }
}

impl IntoResponse for SimError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        let body = json!({ "error": { "code": code, "message": self.to_string() } });
        let mut response = (status, Json(body)).into_response();
        if matches!(self, SimError::RateLimited) {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

impl From<Refusal> for SimError {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::Outage => SimError::Outage,
            Refusal::RateLimited => SimError::RateLimited,
            Refusal::InjectedError => SimError::InjectedError,
            Refusal::Released => SimError::ShuttingDown,
        }
    }
}

impl From<JsonRejection> for SimError {
    fn from(rejection: JsonRejection) -> Self {
        // axum's text names the JSON path of a bad value, e.g. "… target type: hang_rate: …".
        match rejection {
            JsonRejection::MissingJsonContentType(_) => {
                SimError::UnsupportedMediaType(rejection.body_text())
            }
            // Over `DefaultBodyLimit`: axum reports it as a body it failed to buffer.
            _ if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => SimError::PayloadTooLarge,
            _ => SimError::InvalidBody(rejection.body_text()),
        }
    }
}

type ItemPath = Result<Path<(String, String)>, PathRejection>;

fn parse_item(path: ItemPath) -> Result<ItemKey, SimError> {
    let Path((platform, item_id)) =
        path.map_err(|rejection| SimError::InvalidPath(rejection.body_text()))?;
    Ok(ItemKey::parse(&platform, &item_id)?)
}

fn parse_endpoint(path: Result<Path<String>, PathRejection>) -> Result<Endpoint, SimError> {
    let Path(name) = path.map_err(|rejection| SimError::InvalidPath(rejection.body_text()))?;
    Ok(name.parse()?)
}

/// The body a data endpoint answers for one key: the one place it is built, for the single route
/// and for every element of the batch route alike.
trait ItemBody: Serialize + Send + 'static {
    /// Whose faults and counters a call for this body goes through.
    const ENDPOINT: Endpoint;

    /// The body for `key` as of `now` (one `now` for a whole batch).
    fn build(state: &SimState, key: ItemKey, now: Timestamp) -> Self;
}

impl ItemBody for CouponsResponse {
    const ENDPOINT: Endpoint = Endpoint::Coupons;

    fn build(state: &SimState, key: ItemKey, now: Timestamp) -> Self {
        let version = state.coupon_version(key);
        CouponsResponse {
            platform: key.platform,
            item_id: key.item_id,
            version,
            coupons: catalog::coupons(key, version, now),
        }
    }
}

impl ItemBody for ExtrasResponse {
    const ENDPOINT: Endpoint = Endpoint::Extras;

    fn build(_state: &SimState, key: ItemKey, _now: Timestamp) -> Self {
        ExtrasResponse {
            platform: key.platform,
            item_id: key.item_id,
            extras: catalog::extras(key),
        }
    }
}

/// `GET /v1/{endpoint}/{platform}/{item_id}`: parse the key, one fault draw, one body.
async fn answer_one<Answer: ItemBody>(
    State(state): State<SimState>,
    path: ItemPath,
) -> Result<Json<Answer>, SimError> {
    let key = parse_item(path)?;
    state.apply_fault(Answer::ENDPOINT, Call::Single).await?;
    Ok(Json(Answer::build(&state, key, Timestamp::now())))
}

/// `POST /v1/{endpoint}:batch`: parse every key (nothing is counted if one is invalid), one fault
/// draw for the whole batch, then one body per key in request order.
async fn answer_batch<Answer: ItemBody>(
    State(state): State<SimState>,
    request: Result<Json<BatchRequest>, JsonRejection>,
) -> Result<Json<BatchResponse<Answer>>, SimError> {
    let Json(request) = request?;
    let keys = request.parse(state.max_batch_items())?;
    let call = Call::Batch { items: keys.len() };
    state.apply_fault(Answer::ENDPOINT, call).await?;
    let now = Timestamp::now();
    let items = keys
        .into_iter()
        .map(|key| Answer::build(&state, key, now))
        .collect();
    Ok(Json(BatchResponse { items }))
}

async fn list_faults(State(state): State<SimState>) -> Json<PerEndpoint<Fault>> {
    Json(state.faults())
}

async fn reset_faults(State(state): State<SimState>) -> Json<PerEndpoint<Fault>> {
    state.reset_faults();
    Json(state.faults())
}

async fn get_fault(
    State(state): State<SimState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<Fault>, SimError> {
    let endpoint = parse_endpoint(path)?;
    Ok(Json(state.fault(endpoint)))
}

async fn put_fault(
    State(state): State<SimState>,
    path: Result<Path<String>, PathRejection>,
    body: Result<Json<Fault>, JsonRejection>,
) -> Result<Json<Fault>, SimError> {
    let endpoint = parse_endpoint(path)?;
    let Json(fault) = body?;
    state.set_fault(endpoint, fault)?;
    Ok(Json(state.fault(endpoint)))
}

async fn reset_fault(
    State(state): State<SimState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<Fault>, SimError> {
    let endpoint = parse_endpoint(path)?;
    state.reset_fault(endpoint);
    Ok(Json(state.fault(endpoint)))
}

async fn list_counters(State(state): State<SimState>) -> Json<PerEndpoint<CounterSnapshot>> {
    Json(state.all_counters())
}

async fn reset_counters(State(state): State<SimState>) -> Json<PerEndpoint<CounterSnapshot>> {
    state.reset_counters();
    Json(state.all_counters())
}

async fn healthz() -> &'static str {
    "ok"
}

async fn route_not_found() -> SimError {
    SimError::RouteNotFound
}

async fn method_not_allowed() -> SimError {
    SimError::MethodNotAllowed
}
