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

#[utoipa::path(get, path = "/admin/v1/rules", tag = "admin", operation_id = "rules_overview",
    summary = "The live rules now: the active version, a canary under way, the scheduled \
        versions, what each live instance runs, and the values in force on this instance.",
    description = "A rule set is a document of live keys (those marked live in \
        docs/CONFIGURATION.md) over the config file. Every instance applies the version meant \
        for it (the active one, or a canary it is part of) in one swap, on the service's own \
        announcement of a change and every `rules.poll_interval_ms`. `effective` is what this \
        instance runs: every live key, the file's values where no version sets them.",
    responses(
        (status = 200, description = "The rules in force and under way.",
            body = super::schemas::RulesOverview),
    ))]
pub(super) async fn overview(State(state): State<AppState>) -> Result<Response, ApiError> {
    Ok(Json(state.rules.overview().await?).into_response())
}

/// `?dry_run=true|false` and nothing else.
fn dry_run(query: Option<&str>) -> Result<bool, ApiError> {
    let mut dry_run = false;
    for pair in query
        .unwrap_or("")
        .split('&')
        .filter(|pair| !pair.is_empty())
    {
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

#[utoipa::path(post, path = "/admin/v1/rules", tag = "admin", operation_id = "create_rule_set",
    summary = "A new rule set version: active at once, a canary, or scheduled. With \
        `?dry_run=true` it is checked and its changes shown, and nothing is stored.",
    description = "The document sets live keys only (the live column of \
        docs/CONFIGURATION.md), under the config file's section names; a key set to `null` \
        keeps the file's value. Each value is checked by the file's own validation and may not \
        exceed its ceiling in the file's `[rules.ceilings]`.\n\n\
        Without `rollout` or `schedule` the version becomes active on the whole fleet. With \
        `rollout` it runs on the chosen instances and is judged automatically on the \
        `rules.canary` margins, against the other instances over the same seconds (or, with \
        none, the canary instances' own figures before the change): a broken margin rolls it \
        back at once, a clean window promotes it; an operator may decide first (promote, \
        abort). With `schedule` it opens and closes by itself: active from `from` until \
        `until`, then the version active before comes back.\n\n\
        Only the service announces a change to the fleet (a `rules_changed` event; every \
        instance also polls the store): operators cannot publish that event.",
    params(("dry_run" = Option<bool>, Query,
        description = "`true`: check the request and answer what it would change (200), \
            storing nothing. The only parameter.")),
    request_body(content = super::schemas::NewRules, content_type = "application/json",
        example = json!({"document": {"resilience": {"coupons": {"quota_per_sec": 30}}},
            "author": "alice", "reason": "the coupon provider raised our quota",
            "rollout": {"canary": 1, "observe_secs": 300}})),
    responses(
        (status = 201, description = "Stored, `active`, `canary` or `scheduled`; every \
            instance converges on it.", body = super::schemas::CreatedRuleSet),
        (status = 200, description = "A dry run: what it would be and change; `version` is \
            null and nothing is stored.", body = super::schemas::CreatedRuleSet),
        (status = 400, description = "`invalid_rule`: a key that is not live, a value the \
            file would refuse or above its ceiling, or a wrong author, reason, rollout or \
            schedule; `error.field` names it. `invalid_body`: not this JSON. `invalid_query`: a \
            parameter other than `dry_run=true|false`.", body = super::schemas::ErrorEnvelope),
        (status = 409, description = "`rule_conflict`: a canary is under way; promote or \
            abort it first.", body = super::schemas::ErrorEnvelope),
        (status = 415, description = "`invalid_body`: not sent as `application/json`.",
            body = super::schemas::ErrorEnvelope),
    ))]
pub(super) async fn create(
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
    for pair in query
        .unwrap_or("")
        .split('&')
        .filter(|pair| !pair.is_empty())
    {
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

#[utoipa::path(get, path = "/admin/v1/rules/history", tag = "admin",
    operation_id = "rules_history",
    summary = "Every version, newest first, each with its diff against the version before it.",
    params(
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 200,
            description = "How many versions to list (default 50)."),
        ("before" = Option<u64>, Query, maximum = 18446744073709551615_u64,
            description = "Only versions below this one: a page's last version gives the next \
                page."),
    ),
    responses(
        (status = 200, description = "The versions, newest first.",
            body = [super::schemas::RuleVersion]),
        (status = 400, description = "`invalid_query`: a parameter other than `limit` (1–200) \
            and `before` (a version).", body = super::schemas::ErrorEnvelope),
    ))]
pub(super) async fn history(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let (limit, before) = history_query(query.as_deref())?;
    Ok(Json(state.rules.history(limit, before).await?).into_response())
}

#[utoipa::path(get, path = "/admin/v1/rules/{version}", tag = "admin", operation_id = "rule_set",
    summary = "One version, with its diff against the version before it.",
    params(("version" = u64, Path, maximum = 18446744073709551615_u64, description = "The version.")),
    responses(
        (status = 200, description = "The version.", body = super::schemas::RuleVersion),
        (status = 400, description = "`invalid_query`: not a version (a whole number).",
            body = super::schemas::ErrorEnvelope),
        (status = 404, description = "`rule_set_not_found`: no such version.",
            body = super::schemas::ErrorEnvelope),
    ))]
pub(super) async fn version(
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

#[utoipa::path(post, path = "/admin/v1/rules/{version}/promote", tag = "admin",
    operation_id = "promote_rule_set",
    summary = "Promotes a canary before its verdict: it becomes active on the whole fleet.",
    description = "The verdict names the operator and keeps the figures so far. The body is \
        optional: `{\"author\"}` (default `operator`).",
    params(("version" = u64, Path, maximum = 18446744073709551615_u64, description = "The canary's version.")),
    request_body(content = Option<super::schemas::RuleDecision>, content_type = "application/json"),
    responses(
        (status = 200, description = "The version, now `active`.",
            body = super::schemas::RuleVersion),
        (status = 400, description = "`invalid_query`: the version is not a whole number. \
            `invalid_body`: a body that is neither empty nor this JSON object. `invalid_rule` \
            (`error.field` `author`): an empty or overlong author.",
            body = super::schemas::ErrorEnvelope),
        (status = 404, description = "`rule_set_not_found`: no such version.",
            body = super::schemas::ErrorEnvelope),
        (status = 409, description = "`rule_conflict`: the version is not a canary (or no \
            longer: its verdict came first).", body = super::schemas::ErrorEnvelope),
    ))]
pub(super) async fn promote(
    State(state): State<AppState>,
    ApiPath(version): ApiPath<u64>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let decision = decision(&body)?;
    let author = decision.author()?;
    Ok(Json(state.rules.promote(version, &author).await?).into_response())
}

#[utoipa::path(post, path = "/admin/v1/rules/{version}/abort", tag = "admin",
    operation_id = "abort_rule_set",
    summary = "Stops a canary, scheduled or staged version before it becomes active; the fleet \
        keeps (or returns to) the active version.",
    description = "A canary's verdict names the operator and keeps the figures so far. The \
        body is optional: `{\"author\"}` (default `operator`).",
    params(("version" = u64, Path, maximum = 18446744073709551615_u64, description = "The version to stop.")),
    request_body(content = Option<super::schemas::RuleDecision>, content_type = "application/json"),
    responses(
        (status = 200, description = "The version, now `aborted`.",
            body = super::schemas::RuleVersion),
        (status = 400, description = "`invalid_query`: the version is not a whole number. \
            `invalid_body`: a body that is neither empty nor this JSON object. `invalid_rule` \
            (`error.field` `author`): an empty or overlong author.",
            body = super::schemas::ErrorEnvelope),
        (status = 404, description = "`rule_set_not_found`: no such version.",
            body = super::schemas::ErrorEnvelope),
        (status = 409, description = "`rule_conflict`: the version is not canary, scheduled or \
            staged (or no longer).", body = super::schemas::ErrorEnvelope),
    ))]
pub(super) async fn abort(
    State(state): State<AppState>,
    ApiPath(version): ApiPath<u64>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let decision = decision(&body)?;
    let author = decision.author()?;
    Ok(Json(state.rules.abort(version, &author).await?).into_response())
}

#[utoipa::path(post, path = "/admin/v1/rules/{version}/rollback", tag = "admin",
    operation_id = "roll_back_to_rule_set",
    summary = "Makes a version's document active again, as a new version; the version active \
        until then is marked `rolled_back`.",
    description = "The document is checked again under the file as it is now. The body is \
        optional: `{\"author\", \"reason\"}` (default `operator`; the reason is added to \
        `rollback to version N`).",
    params(("version" = u64, Path, maximum = 18446744073709551615_u64, description = "The version whose document comes back.")),
    request_body(content = Option<super::schemas::RuleDecision>, content_type = "application/json"),
    responses(
        (status = 201, description = "The new version, `active`.",
            body = super::schemas::CreatedRuleSet),
        (status = 400, description = "`invalid_query`: the version is not a whole number. \
            `invalid_body`: a body that is neither empty nor this JSON object. `invalid_rule` \
            (`error.field` `author`): an empty or overlong author, or a \
            document the file now refuses.",
            body = super::schemas::ErrorEnvelope),
        (status = 404, description = "`rule_set_not_found`: no such version.",
            body = super::schemas::ErrorEnvelope),
        (status = 409, description = "`rule_conflict`: the version is already active.",
            body = super::schemas::ErrorEnvelope),
    ))]
pub(super) async fn rollback(
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
