//! `GET /admin/v1/slow-requests` (newest first, `?limit=N`) and
//! `GET /admin/v1/slow-requests/{trace_id}`: the in-process slow-request log.

use axum::extract::{RawQuery, State};
use axum::routing::get;
use axum::{Json, Router};
use rebate_telemetry::TraceId;
use serde_json::{Value, json};

use super::error::ApiError;
use super::extract::ApiPath;
use crate::state::AppState;

const DEFAULT_LIMIT: usize = 50;

/// The routes, relative to `/admin/v1` (where the admin router nests them).
pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/slow-requests", get(recent))
        .route("/slow-requests/{trace_id}", get(by_trace_id))
}

#[utoipa::path(get, path = "/admin/v1/slow-requests", tag = "admin",
    operation_id = "slow_requests",
    params(("limit" = Option<u32>, Query, minimum = 1, maximum = 256,
        description = "How many to list, at most `observability.slow_log_size` (256; default \
            50); the only parameter.")),
    responses(
        (status = 200, description = "The newest recorded requests first.",
            body = super::schemas::SlowRequests),
        (status = 400, description = "`invalid_query`: a parameter other than `limit=N`, \
            1 ≤ N ≤ the log's size.", body = super::schemas::ErrorEnvelope),
    ))]
pub(super) async fn recent(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, ApiError> {
    let capacity = state.slow_log.capacity();
    let limit = match query.as_deref().filter(|query| !query.is_empty()) {
        None => DEFAULT_LIMIT.min(capacity),
        Some(query) => parse_limit(query, capacity)?,
    };
    Ok(Json(json!({
        "capacity": capacity,
        "recorded": state.slow_log.len(),
        "requests": state.slow_log.recent(limit),
    })))
}

/// `limit=N` with 1 ≤ N ≤ `capacity`; nothing else is accepted.
pub(super) fn parse_limit(query: &str, capacity: usize) -> Result<usize, ApiError> {
    let invalid = || {
        ApiError::InvalidQuery(format!(
            "the only parameter is limit, a whole number from 1 to {capacity}"
        ))
    };
    let value = query.strip_prefix("limit=").ok_or_else(invalid)?;
    let limit: usize = value.parse().map_err(|_| invalid())?;
    if !(1..=capacity).contains(&limit) {
        return Err(invalid());
    }
    Ok(limit)
}

#[utoipa::path(get, path = "/admin/v1/slow-requests/{trace_id}", tag = "admin",
    operation_id = "slow_request",
    params(("trace_id" = String, Path, pattern = "^(?!0{32}$)[0-9a-f]{32}$",
        description = "A trace id (`x-trace-id`): 32 lowercase hex digits, not all zero.")),
    responses(
        (status = 200, description = "The recorded request and its stages.",
            body = super::schemas::SlowRequest),
        (status = 400, description = "`invalid_query`: not a trace id.",
            body = super::schemas::ErrorEnvelope),
        (status = 404, description = "`not_recorded`: not in this instance's log (fast, served \
            elsewhere, or pushed out).", body = super::schemas::ErrorEnvelope),
    ))]
pub(super) async fn by_trace_id(
    State(state): State<AppState>,
    ApiPath(trace_id): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    let trace_id: TraceId =
        trace_id
            .parse()
            .map_err(|error: rebate_telemetry::InvalidTraceId| {
                ApiError::InvalidQuery(format!("{error}: {trace_id:?}"))
            })?;
    let request = state.slow_log.find(trace_id).ok_or(ApiError::NotRecorded)?;
    Ok(Json(json!(request)))
}
