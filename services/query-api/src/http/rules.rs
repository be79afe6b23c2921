//! `/admin/v1/rules`: live rule sets (`crate::rules`). The active version and what each
//! instance runs, the history with diffs, one version, a new version (a dry run with
//! `?dry_run=true`), and promote, abort and rollback.

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;

use super::error::ApiError;
use super::extract::{ApiJson, ApiPath};
use crate::rules::manager::{NewRules, RulesError};
use crate::state::AppState;

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/rules", get(overview).post(create))
        .route("/rules/history", get(history))
        .route("/rules/{version}", get(version))
        .route("/rules/{version}/promote", post(promote))
        .route("/rules/{version}/abort", post(abort))
        .route("/rules/{version}/rollback", post(rollback))
}

impl From<RulesError> for ApiError {
    fn from(error: RulesError) -> Self {
        match error {
            RulesError::Invalid(error) => ApiError::InvalidRule {
                field: error.field,
                reason: error.reason,
            },
            RulesError::NotFound(version) => ApiError::RuleSetNotFound(version),
            RulesError::Conflict(message) => ApiError::RuleConflict(message),
            RulesError::Store(error) => {
                tracing::warn!(%error, "rule store unavailable");
                ApiError::Unavailable
            }
        }
    }
}

async fn overview(State(state): State<AppState>) -> Result<Response, ApiError> {
    Ok(Json(state.rules.overview().await?).into_response())
}

/// `?dry_run=true|false` and nothing else.
fn dry_run(query: Option<&str>) -> Result<bool, ApiError> {
    let mut dry_run = false;
    for pair in query.unwrap_or("").split('&').filter(|pair| !pair.is_empty()) {
        match pair.split_once('=') {
            Some(("dry_run", "true")) => dry_run = true,
            Some(("dry_run", "false")) => dry_run = false,
            Some(("dry_run", other)) => {
                return Err(ApiError::InvalidQuery(format!(
                    "dry_run must be true or false, got {other:?}"
                )));
            }
            _ => {
                return Err(ApiError::InvalidQuery(format!(
                    "unknown query parameter {pair:?}; this route takes dry_run"
                )));
            }
        }
    }
    Ok(dry_run)
}

async fn create(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
    ApiJson(request): ApiJson<NewRules>,
) -> Result<Response, ApiError> {
    let dry_run = dry_run(query.as_deref())?;
    let created = state.rules.create(request, dry_run).await?;
    let status = if dry_run {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, Json(created)).into_response())
}

/// `?limit=N&before=V`.
fn history_query(query: Option<&str>) -> Result<(u32, Option<u64>), ApiError> {
    let mut limit = 50;
    let mut before = None;
    for pair in query.unwrap_or("").split('&').filter(|pair| !pair.is_empty()) {
        match pair.split_once('=') {
            Some(("limit", value)) => {
                limit = value
                    .parse::<u32>()
                    .ok()
                    .filter(|limit| (1..=200).contains(limit))
                    .ok_or_else(|| {
                        ApiError::InvalidQuery(format!("limit must be 1 to 200, got {value:?}"))
                    })?;
            }
            Some(("before", value)) => {
                before = Some(value.parse::<u64>().map_err(|_| {
                    ApiError::InvalidQuery(format!("before must be a version, got {value:?}"))
                })?);
            }
            _ => {
                return Err(ApiError::InvalidQuery(format!(
                    "unknown query parameter {pair:?}; this route takes limit and before"
                )));
            }
        }
    }
    Ok((limit, before))
}

async fn history(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let (limit, before) = history_query(query.as_deref())?;
    Ok(Json(state.rules.history(limit, before).await?).into_response())
}

async fn version(
    State(state): State<AppState>,
    ApiPath(version): ApiPath<u64>,
) -> Result<Response, ApiError> {
    Ok(Json(state.rules.version(version).await?).into_response())
}

/// The optional body of promote, abort and rollback.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Decision {
    #[serde(default)]
    author: Option<String>,
    #[serde(default)]
    reason: Option<String>,
}

impl Decision {
    fn author(&self) -> Result<String, ApiError> {
        match self.author.as_deref().map(str::trim) {
            None => Ok("operator".to_owned()),
            Some(author) if !author.is_empty() && author.chars().count() <= 128 => {
                Ok(author.to_owned())
            }
            Some(_) => Err(ApiError::InvalidRule {
                field: "author".to_owned(),
                reason: "must be 1 to 128 characters".to_owned(),
            }),
        }
    }
}

/// An empty body is the default decision; anything else must be its JSON object.
fn decision(body: &[u8]) -> Result<Decision, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Decision::default());
    }
    if body.trim_ascii_start().first() != Some(&b'{') {
        return Err(ApiError::InvalidBody(
            "the body must be a JSON object (or empty)".to_owned(),
        ));
    }
    serde_json::from_slice(body).map_err(|error| ApiError::InvalidBody(error.to_string()))
}

async fn promote(
    State(state): State<AppState>,
    ApiPath(version): ApiPath<u64>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let decision = decision(&body)?;
    let author = decision.author()?;
    Ok(Json(state.rules.promote(version, &author).await?).into_response())
}

async fn abort(
    State(state): State<AppState>,
    ApiPath(version): ApiPath<u64>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let decision = decision(&body)?;
    let author = decision.author()?;
    Ok(Json(state.rules.abort(version, &author).await?).into_response())
}

async fn rollback(
    State(state): State<AppState>,
    ApiPath(version): ApiPath<u64>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let decision = decision(&body)?;
    let author = decision.author()?;
    let created = state
        .rules
        .rollback(version, &author, decision.reason.as_deref())
        .await?;
    Ok((StatusCode::CREATED, Json(created)).into_response())
}
