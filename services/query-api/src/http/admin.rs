//! The admin listener: health and `/metrics` without a token; under `/admin/v1`, with
//! `Authorization: Bearer`, status (shed level, breakers, bulkheads, quotas, caches and the
//! thresholds behind them), a shed-level override for drills, event publishing, key inspection
//! and warm-up. Served on its own address (`admin.listen`). The token check, and the throttling
//! of peers that keep failing it, are [`super::admin_auth`]'s.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Extension, Json, Router};
use rebate_cache::{L2Entry, PartView};
use rebate_domain::{ItemId, ItemKey, Timestamp};
use rebate_events::{EventId, EventKind, InvalidationEvent, Rejection};
use rebate_resilience::ShedLevel;
use rebate_telemetry::TraceId;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::time::Instant;

use super::admin_auth::{AdminAuth, require_token};
use super::error::ApiError;
use super::extract::{ApiJson, ApiPath};
use super::items::{BatchRequest, parse_key};
use crate::event_bus::EventBus;
use crate::lifecycle::Phase;
use crate::pings::Pings;
use crate::state::AppState;

/// The admin listener's routes; `openapi` is the document `GET /openapi.json` answers with
/// (rendered by [`super::openapi`], which describes these routes and so is handed in).
pub fn router(state: AppState, auth: AdminAuth, openapi: axum::body::Bytes) -> Router {
    // Everything under /admin/v1 — its unknown paths and methods included — is behind the
    // token: a stranger learns nothing from a 404 or a 405 about which routes exist.
    let protected = Router::new()
        .route("/status", get(status))
        .route("/shedding", put(force_shedding))
        .route("/events", post(publish_event))
        .route("/items/{platform}/{item_id}", get(inspect_item))
        .route("/warm", post(warm))
        .route("/warm-jobs/{job_id}", get(warm_job_progress))
        .route("/hot-keys", get(hot_keys))
        .merge(super::slow_requests::routes())
        .merge(super::rules::routes())
        .fallback(|| async { ApiError::RouteNotFound })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(axum::middleware::from_fn_with_state(
            auth.clone(),
            require_token,
        ));
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readiness))
        .route("/metrics", get(metrics))
        .merge(
            Router::new()
                .route("/openapi.json", get(openapi_json))
                .with_state(openapi),
        )
        .merge(super::dashboard::routes())
        .nest("/admin/v1", protected)
        .fallback(|| async { ApiError::RouteNotFound })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(axum::middleware::from_fn_with_state(
            Arc::new(super::edge::Gate {
                limits: Arc::clone(&state.limits.edge),
                protection: None,
                timeout: state.limits.admin_request_timeout,
            }),
            super::edge::gate,
        ))
        // Merged after the gate above, so that it runs under a gate of its own.
        .merge(warm_job_submission(&state, auth))
        .layer(axum::middleware::from_fn(super::middleware::trace_requests))
        .with_state(state)
}

/// `POST /admin/v1/warm-jobs`, behind the token, under a gate whose body limit is
/// `warm_jobs.body_limit_bytes`: a job of 200,000 keys is ~9 MiB of JSON, where every other
/// route keeps `http.body_limit_bytes` (64 KiB). The same limit is axum's for the extractor.
fn warm_job_submission(state: &AppState, auth: AdminAuth) -> Router<AppState> {
    let limit = state.limits.warm_job_body_limit_bytes;
    let limits = super::edge::EdgeLimits {
        body_limit_bytes: limit,
        ..state.limits.edge.as_ref().clone()
    };
    Router::new()
        .route("/admin/v1/warm-jobs", post(submit_warm_job))
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(axum::extract::DefaultBodyLimit::max(limit))
        .layer(axum::middleware::from_fn_with_state(auth, require_token))
        .layer(axum::middleware::from_fn_with_state(
            Arc::new(super::edge::Gate {
                limits: Arc::new(limits),
                protection: None,
                timeout: state.limits.admin_request_timeout,
            }),
            super::edge::gate,
        ))
}

/// How long the readiness probe waits for the store's and Redis's pings. A hung MySQL must not
/// hang the probe (load balancers give up after a second or two and count that as unready for
/// the wrong reason); an answer slower than this is "down" as far as serving is concerned.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// What one look at the dependencies found, for `/readyz` and `/admin/v1/status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
struct Readiness {
    /// Whether a load balancer should send this instance traffic.
    ready: bool,
    phase: Phase,
    /// `ok` or `down` (unreachable, failing, slower than [`PROBE_TIMEOUT`], or migrations missing).
    store: &'static str,
    /// `ok`, `down` or `disabled`.
    redis: &'static str,
    /// `connected` or `disconnected` (always connected for the in-process bus).
    events: &'static str,
    /// What is down but does not stop this instance from answering: `store` (answering from
    /// cache), `redis`, `events`.
    degraded: Vec<&'static str>,
    /// After a broker reconnect: `replayed` (the events missed were waiting and are applied) or
    /// `dropped_l1` (they may be lost, so L1 was dropped). Absent before any reconnect.
    #[serde(skip_serializing_if = "Option::is_none")]
    events_catch_up: Option<&'static str>,
    /// With change capture on: who reads, the last resync, the last failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    change_capture: Option<Value>,
}

/// The dependency probes' raw results.
#[derive(Debug, Clone, Copy)]
struct Probes {
    phase: Phase,
    store_ok: bool,
    /// Products held in L1: with the store down, these are what queries are answered from.
    cached_products: u64,
    redis: Option<bool>,
    events_connected: bool,
    events_catch_up: Option<rebate_amqp_bus::CatchUpOutcome>,
}

impl Readiness {
    /// Ready means "send me traffic": serving (not starting, not draining) and able to answer
    /// queries — the store answers, or L1 holds products to answer from. Redis and the broker
    /// never make an instance unready: every request still gets an answer without them (L2 is
    /// skipped; invalidation falls back to the L1 TTL), and since an outage of either hits the
    /// whole fleet at once, failing readiness on them would take every instance out together.
    fn assess(probes: Probes) -> Self {
        let can_answer = probes.store_ok || probes.cached_products > 0;
        let ready = probes.phase == Phase::Serving && can_answer;
        let redis = match probes.redis {
            None => "disabled",
            Some(true) => "ok",
            Some(false) => "down",
        };
        let mut degraded = Vec::new();
        if !probes.store_ok {
            degraded.push("store");
        }
        if probes.redis == Some(false) {
            degraded.push("redis");
        }
        if !probes.events_connected {
            degraded.push("events");
        }
        Self {
            ready,
            phase: probes.phase,
            store: if probes.store_ok { "ok" } else { "down" },
            redis,
            events: if probes.events_connected {
                "connected"
            } else {
                "disconnected"
            },
            degraded,
            events_catch_up: probes
                .events_catch_up
                .map(rebate_amqp_bus::CatchUpOutcome::as_str),
            change_capture: None,
        }
    }

    /// Pings the store and Redis now.
    async fn probe(state: &AppState) -> Self {
        let pings = take_pings(state).await;
        state.recent_pings.record(pings);
        Self::from_pings(state, pings)
    }

    fn from_pings(state: &AppState, pings: Pings) -> Self {
        let mut readiness = Self::assess(Probes {
            phase: state.lifecycle.phase(),
            store_ok: pings.store_ok,
            cached_products: state.engine.parts().product.stats().entries,
            redis: pings.redis,
            events_connected: state.events.is_ready(),
            events_catch_up: state.events.last_catch_up(),
        });
        readiness.change_capture = state.change_capture.as_ref().map(|capture| {
            let status = capture.status();
            json!({
                "role": status.role,
                "reader": status.reader,
                "resyncs_applied": status.resyncs_applied,
                "last_resync": status.last_resync,
                "error": status.error,
            })
        });
        readiness
    }
}

/// Pings the store and Redis concurrently, each bounded by [`PROBE_TIMEOUT`].
async fn take_pings(state: &AppState) -> Pings {
    let store = async {
        matches!(
            tokio::time::timeout(PROBE_TIMEOUT, state.store.ping()).await,
            Ok(Ok(()))
        )
    };
    let redis = async {
        match &state.tier {
            None => None,
            Some(tier) => Some(matches!(
                tokio::time::timeout(PROBE_TIMEOUT, rebate_cache::SharedTier::ping(tier.as_ref()))
                    .await,
                Ok(Ok(()))
            )),
        }
    };
    let (store_ok, redis) = tokio::join!(store, redis);
    Pings { store_ok, redis }
}

/// Readiness for the status page from [`RecentPings`], and how long ago its pings were taken.
async fn recent_readiness(state: &AppState) -> (Readiness, Duration) {
    let (pings, age) = state
        .recent_pings
        .look(|| {
            let state = state.clone();
            async move { take_pings(&state).await }
        })
        .await;
    (Readiness::from_pings(state, pings), age)
}

/// Liveness: the process answers.
#[utoipa::path(get, path = "/healthz", tag = "admin", operation_id = "healthz",
    responses((status = 200, description = "The process answers: `ok`.", body = String,
        content_type = "text/plain")))]
pub(super) async fn healthz() -> &'static str {
    "ok"
}

/// The OpenAPI document of both listeners, rendered once at start. Served without the token: it
/// is the committed `docs/openapi.json`, describes shapes and never data, and tools fetch it as
/// they fetch `/metrics`.
#[utoipa::path(get, path = "/openapi.json", tag = "admin", operation_id = "openapi",
    responses((status = 200, description = "This document (`docs/openapi.json`).",
        body = Object, content_type = "application/json")))]
pub(super) async fn openapi_json(State(document): State<axum::body::Bytes>) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], document).into_response()
}

/// 200 while this instance should get traffic, else 503; the body says what is down either way.
#[utoipa::path(get, path = "/readyz", tag = "admin", operation_id = "readyz",
    responses(
        (status = 200, description = "Serving, and the store answers or L1 holds products.",
            body = super::schemas::Readiness),
        (status = 503, description = "Starting, draining, or the store down with nothing cached. \
            Same body.", body = super::schemas::Readiness),
    ))]
pub(super) async fn readiness(State(state): State<AppState>) -> Response {
    let readiness = Readiness::probe(&state).await;
    let status = if readiness.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(readiness)).into_response()
}

/// Prometheus scrapes without a token: the numbers say how the service fares, never what it
/// holds.
#[utoipa::path(get, path = "/metrics", tag = "admin", operation_id = "metrics",
    responses((status = 200, description = "The Prometheus metrics (OpenMetrics text).",
        body = String, content_type = "application/openmetrics-text")))]
pub(super) async fn metrics(State(state): State<AppState>) -> Result<Response, ApiError> {
    let text = state.metrics.encode().map_err(|_| {
        tracing::error!("cannot encode the metrics");
        ApiError::Internal
    })?;
    Ok(([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response())
}

/// Everything an operator needs to see why the service answers the way it does right now,
/// including what readiness sees (`ready`, `phase`, `store`, `redis`, `events`, `degraded`) and,
/// on RabbitMQ, the connection's state and last error.
#[utoipa::path(get, path = "/admin/v1/status", tag = "admin", operation_id = "status",
    responses((status = 200, description = "The status page.", body = super::schemas::Status)))]
pub(super) async fn status(State(state): State<AppState>) -> Json<Value> {
    let (readiness, pinged_ago) = recent_readiness(&state).await;
    Json(json!({
        "shed_level": state.protection.level(),
        "protection": state.protection.status(),
        "caches": state.engine.parts().views().map(|_, part| part.stats()),
        "rendered_quotes": state.engine.rendered_stats(),
        "cache_only_loads": state.engine.cache_only_loads(),
        "bloom": state.engine.item_filter().map(|filter| filter.stats()),
        "store_loads_max_in_flight": state.load_limiter.max_in_flight(),
        "upstream_batches": state.upstreams.batch_stats(),
        "connections": state.connections.snapshot(),
        "memory": crate::memory::MemoryStats::read(),
        "consistency": state.consistency.report(),
        "event_counts": state.events.stats(),
        "warm_jobs": state.warm_jobs.stats(),
        "change_capture": state.change_capture.as_ref().map(|capture| capture.status()),
        "ready": readiness.ready,
        "phase": readiness.phase,
        "store": readiness.store,
        "redis": readiness.redis,
        "events": readiness.events,
        "degraded": readiness.degraded,
        "pinged_ms_ago": u64::try_from(pinged_ago.as_millis()).unwrap_or(u64::MAX),
        "events_connection": match &state.events {
            EventBus::Amqp { bus, .. } => json!(bus.status()),
            EventBus::InProcess(_) => json!("in_process"),
        },
    }))
}

/// `{"level": "cache_only"}` pins the shed level (drills, emergencies); `{"level": null}` returns
/// to the measured level.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "an object with a `level`")]
pub(super) struct ShedOverride {
    /// Required, `null` included: `{}` is refused rather than read as "release the pin".
    #[serde(deserialize_with = "Option::deserialize")]
    level: Option<LevelName>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(
    rename_all = "snake_case",
    expecting = "one of `normal`, `drop_extras`, `short_timeouts`, `cache_only` or null"
)]
enum LevelName {
    Normal,
    DropExtras,
    ShortTimeouts,
    CacheOnly,
}

impl From<LevelName> for ShedLevel {
    fn from(name: LevelName) -> Self {
        match name {
            LevelName::Normal => ShedLevel::Normal,
            LevelName::DropExtras => ShedLevel::DropExtras,
            LevelName::ShortTimeouts => ShedLevel::ShortTimeouts,
            LevelName::CacheOnly => ShedLevel::CacheOnly,
        }
    }
}

#[utoipa::path(put, path = "/admin/v1/shedding", tag = "admin", operation_id = "force_shedding",
    request_body(content = super::schemas::ShedOverride, content_type = "application/json"),
    responses(
        (status = 200, description = "The override is in place.", body = super::schemas::ShedAnswer),
        (status = 400, description = "`invalid_body`: not this JSON, or shedding is disabled \
            (`resilience.shedding.enabled = false`).", body = super::schemas::ErrorEnvelope),
        (status = 415, description = "`invalid_body`: not sent as `application/json`.",
            body = super::schemas::ErrorEnvelope),
    ))]
pub(super) async fn force_shedding(
    State(state): State<AppState>,
    Extension(trace_id): Extension<TraceId>,
    ApiJson(request): ApiJson<ShedOverride>,
) -> Result<Response, ApiError> {
    let Some(shedder) = &state.protection.shedder else {
        return Err(ApiError::InvalidBody(
            "load shedding is disabled (resilience.shedding.enabled = false)".to_owned(),
        ));
    };
    let level = request.level.map(ShedLevel::from);
    shedder.force(level);
    // A lower level may let waiting requests in.
    state.protection.notify_waiters();
    tracing::warn!(forced = ?level, "shed level override changed by an operator");
    Ok(Json(json!({"shedding": shedder.snapshot(), "trace_id": trace_id})).into_response())
}

/// An operator's event; `event_id` and `occurred_at` are filled in when absent.
#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "an object with `kind`, `platform`, `item_ids` and `version`"
)]
pub(super) struct EventRequest {
    #[serde(deserialize_with = "operator_kind")]
    kind: EventKind,
    platform: String,
    item_ids: Vec<String>,
    #[serde(deserialize_with = "whole_number")]
    version: u64,
    #[serde(default)]
    event_id: Option<String>,
}

/// A kind an operator may publish: any but `rules_changed`, which only the service announces
/// (a rule set is changed through the service, which tells every instance itself). Refused as
/// soon as `kind` is read, so the answer names `kind` whatever else the body lacks.
fn operator_kind<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<EventKind, D::Error> {
    let kind = EventKind::deserialize(deserializer)?;
    if !kind.names_items() {
        return Err(serde::de::Error::custom(format_args!(
            "`{kind}` is announced by the service itself when a rule set changes; operators \
             cannot publish it"
        )));
    }
    Ok(kind)
}

/// A non-negative whole number written as an integer or with a zero fraction (`411.0`): JSON
/// has one number type, and JSON Schema's `integer` (the document's) takes both spellings.
fn whole_number<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    let number = serde_json::Number::deserialize(deserializer)?;
    if let Some(whole) = number.as_u64() {
        return Ok(whole);
    }
    match number.as_f64() {
        // Exact up to 2^53, the largest version an event may carry.
        Some(float) if float.fract() == 0.0 && (0.0..=9_007_199_254_740_992.0).contains(&float) =>
        {
            #[expect(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                reason = "a whole, non-negative float of at most 2^53 converts exactly"
            )]
            Ok(float as u64)
        }
        _ => Err(serde::de::Error::invalid_value(
            serde::de::Unexpected::Other(&number.to_string()),
            &"a non-negative whole number",
        )),
    }
}

#[utoipa::path(post, path = "/admin/v1/events", tag = "admin", operation_id = "publish_event",
    request_body(content = super::schemas::EventRequest, content_type = "application/json"),
    responses(
        (status = 202, description = "Handed to the event bus.", body = super::schemas::EventAnswer),
        (status = 400, description = "`invalid_body`, `invalid_platform` or `invalid_item_id`: \
            not a valid event.", body = super::schemas::ErrorEnvelope),
        (status = 415, description = "`invalid_body`: not sent as `application/json`.",
            body = super::schemas::ErrorEnvelope),
    ))]
pub(super) async fn publish_event(
    State(state): State<AppState>,
    Extension(trace_id): Extension<TraceId>,
    ApiJson(request): ApiJson<EventRequest>,
) -> Result<Response, ApiError> {
    let platform = request
        .platform
        .parse()
        .map_err(|error: rebate_domain::KeyError| ApiError::InvalidPlatform(error.to_string()))?;
    let item_ids = request
        .item_ids
        .iter()
        .enumerate()
        .map(|(index, id)| {
            ItemId::parse(id)
                .map_err(|error| ApiError::InvalidItemId(format!("item_ids[{index}]: {error}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let event_id = match request.event_id {
        Some(id) => EventId::parse(&id).map_err(invalid_event)?,
        None => EventId::generate(),
    };
    let event = InvalidationEvent::new(
        event_id,
        request.kind,
        platform,
        item_ids,
        request.version,
        Timestamp::now(),
    )
    .map_err(invalid_event)?;
    state
        .events
        .publisher()
        .publish(&event)
        .await
        .map_err(|error| {
            tracing::warn!(%error, "event publish failed");
            // The broker, not the catalogue, is what failed: say so.
            ApiError::BrokerUnavailable
        })?;
    tracing::info!(
        event_id = event.event_id().as_str(),
        kind = event.kind().as_str(),
        "event published by an operator"
    );
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"event_id": event.event_id().as_str(), "trace_id": trace_id})),
    )
        .into_response())
}

fn invalid_event(rejection: Rejection) -> ApiError {
    ApiError::InvalidBody(rejection.to_string())
}

/// What L1 and L2 hold for one part of one item.
async fn part_view(part: &dyn PartView, key: ItemKey) -> Value {
    let l2 = match part.shared_tier() {
        None => json!(null),
        Some(_) => match part.l2_entry(key).await {
            Ok(L2Entry::Present(entry)) => json!(entry),
            Ok(L2Entry::Absent) => json!("absent"),
            Ok(L2Entry::Undecodable) => json!({"error": "undecodable entry"}),
            Err(error) => json!({"error": error.to_string()}),
        },
    };
    json!({"l1": part.l1_entry(&key), "l2": l2})
}

/// What L1, L2 and the store hold for one item.
#[utoipa::path(get, path = "/admin/v1/items/{platform}/{item_id}", tag = "admin",
    operation_id = "inspect_item",
    params(
        ("platform" = super::schemas::Platform, Path, description = "`taobao`, `jd` or `pdd`."),
        ("item_id" = String, Path, pattern = "^[0-9]{1,20}$",
            description = "1–20 ASCII digits."),
    ),
    responses(
        (status = 200, description = "What each tier and the store hold (nothing, for an \
            unknown item).", body = super::schemas::Inspection),
        (status = 400, description = "`invalid_platform`, `invalid_item_id` or `invalid_query` \
            (a segment that is not percent-encoded UTF-8).", body = super::schemas::ErrorEnvelope),
    ))]
pub(super) async fn inspect_item(
    State(state): State<AppState>,
    Extension(trace_id): Extension<TraceId>,
    ApiPath((platform, item_id)): ApiPath<(String, String)>,
) -> Result<Response, ApiError> {
    let key = parse_key(&platform, &item_id)?;
    let mut views = serde_json::Map::new();
    for (kind, part) in state.engine.parts().views().iter() {
        views.insert(kind.as_str().to_owned(), part_view(*part, key).await);
    }
    let product_row = state.store.product(key).await;
    let rate_row = state.store.rate(key).await;
    let store = json!({
        "product": match product_row {
            Ok(row) => json!(row.map(|row| json!({"version": row.version, "status": row.value.status, "price_cents": row.value.price_cents}))),
            Err(error) => { tracing::warn!(%error, "inspect: store read failed"); json!({"error": "store read failed"}) }
        },
        "rate": match rate_row {
            Ok(row) => json!(row.map(|row| json!({"version": row.version, "rate_bps": row.value.rate_bps}))),
            Err(error) => { tracing::warn!(%error, "inspect: store read failed"); json!({"error": "store read failed"}) }
        },
    });
    let body = json!({
        "platform": key.platform,
        "item_id": key.item_id,
        "parts": views,
        "store": store,
        "trace_id": trace_id,
    });
    Ok(Json(body).into_response())
}

/// Loads the named items through the normal query path (filling L1 and L2).
#[utoipa::path(post, path = "/admin/v1/warm", tag = "admin", operation_id = "warm",
    request_body(content = super::schemas::WarmRequest, content_type = "application/json",
        example = json!({"items": [{"platform": "taobao", "item_id": "100001"}]})),
    responses(
        (status = 200, description = "Loaded.", body = super::schemas::WarmAnswer),
        (status = 400, description = "`invalid_body`, `invalid_batch_size`, `invalid_platform` \
            or `invalid_item_id`: the whole request is refused.", body = super::schemas::ErrorEnvelope),
        (status = 415, description = "`invalid_body`: not sent as `application/json`.",
            body = super::schemas::ErrorEnvelope),
    ))]
pub(super) async fn warm(
    State(state): State<AppState>,
    Extension(trace_id): Extension<TraceId>,
    ApiJson(request): ApiJson<BatchRequest>,
) -> Result<Response, ApiError> {
    request.check_size(state.limits.max_batch_items)?;
    let keys = request
        .items
        .iter()
        .map(|item| parse_key(&item.platform, &item.item_id))
        .collect::<Result<Vec<_>, _>>()?;
    let deadline = Instant::now() + state.limits.live.request_deadline();
    let results = state.engine.quote_many(&keys, deadline).await;
    let warmed = results.iter().filter(|result| result.is_ok()).count();
    Ok(
        Json(json!({"requested": keys.len(), "warmed": warmed, "trace_id": trace_id}))
            .into_response(),
    )
}

/// Queues a warm job for the fleet (every instance works through its chunks) or, without
/// Redis, for this instance. This route's body limit (413) is `warm_jobs.body_limit_bytes`
/// (16 MiB), not `http.body_limit_bytes`.
#[utoipa::path(post, path = "/admin/v1/warm-jobs", tag = "admin", operation_id = "submit_warm_job",
    request_body(content = super::schemas::WarmJobRequest, content_type = "application/json",
        example = json!({"items": [{"platform": "taobao", "item_id": "100001"},
            {"platform": "jd", "item_id": "100002"}]})),
    responses(
        (status = 202, description = "Queued; follow it at `GET /admin/v1/warm-jobs/{job_id}`.",
            body = super::schemas::WarmJobReceipt),
        (status = 400, description = "`invalid_body`, `invalid_batch_size` (0 or more than \
            `warm_jobs.max_keys` keys), `invalid_platform` or `invalid_item_id` (naming the \
            first bad key's index): the whole job is refused.",
            body = super::schemas::ErrorEnvelope),
        (status = 415, description = "`invalid_body`: not sent as `application/json`.",
            body = super::schemas::ErrorEnvelope),
        (status = 503, description = "`unavailable`: the queue is full \
            (`warm_jobs.max_queued_chunks`), or Redis failed.", body = super::schemas::ErrorEnvelope,
            headers(("retry-after" = u32, description = "Seconds before asking again."))),
    ))]
pub(super) async fn submit_warm_job(
    State(state): State<AppState>,
    Extension(trace_id): Extension<TraceId>,
    ApiJson(request): ApiJson<BatchRequest>,
) -> Result<Response, ApiError> {
    request.check_size(state.warm_jobs.config().max_keys)?;
    let keys = request
        .items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            parse_key(&item.platform, &item.item_id).map_err(|error| match error {
                ApiError::InvalidPlatform(message) => {
                    ApiError::InvalidPlatform(format!("items[{index}]: {message}"))
                }
                ApiError::InvalidItemId(message) => {
                    ApiError::InvalidItemId(format!("items[{index}]: {message}"))
                }
                other => other,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    drop(request);
    let receipt = state
        .warm_jobs
        .submit(keys)
        .await
        .map_err(|error| ApiError::WarmJobsUnavailable(error.to_string()))?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({
            "job_id": receipt.job_id,
            "chunks": receipt.chunks,
            "keys": receipt.keys,
            "duplicates": receipt.duplicates,
            "trace_id": trace_id,
        })),
    )
        .into_response())
}

/// A warm job's progress, summed over every instance that worked on it.
#[utoipa::path(get, path = "/admin/v1/warm-jobs/{job_id}", tag = "admin",
    operation_id = "warm_job_progress",
    params(("job_id" = String, Path, pattern = "^[0-9a-f]{16}$",
        description = "The id `POST /admin/v1/warm-jobs` answered with.")),
    responses(
        (status = 200, description = "The job's counters.", body = super::schemas::WarmJobProgress),
        (status = 400, description = "`invalid_query`: not 16 lowercase hex digits.",
            body = super::schemas::ErrorEnvelope),
        (status = 404, description = "`job_not_found`: never submitted, or expired \
            (`warm_jobs.job_ttl_secs` after its last change).", body = super::schemas::ErrorEnvelope),
        (status = 503, description = "`unavailable`: Redis failed.",
            body = super::schemas::ErrorEnvelope,
            headers(("retry-after" = u32, description = "Seconds before asking again."))),
    ))]
pub(super) async fn warm_job_progress(
    State(state): State<AppState>,
    Extension(trace_id): Extension<TraceId>,
    ApiPath(job_id): ApiPath<String>,
) -> Result<Response, ApiError> {
    if !crate::warm_jobs::WarmJobs::is_job_id(&job_id) {
        return Err(ApiError::InvalidQuery(format!(
            "{:?} is not a warm job id (16 lowercase hex digits)",
            rebate_domain::text::truncate_chars(&job_id, 40)
        )));
    }
    let progress = state
        .warm_jobs
        .progress(&job_id)
        .await
        .map_err(|error| ApiError::WarmJobsUnavailable(error.to_string()))?
        .ok_or(ApiError::JobNotFound)?;
    let mut body = json!(progress);
    body["trace_id"] = json!(trace_id);
    Ok(Json(body).into_response())
}

/// The most keys `GET /admin/v1/hot-keys` lists.
const MAX_HOT_KEYS: usize = 1_000;

/// `GET /admin/v1/hot-keys?limit=N` (1–1000, default 100): the hottest items learned from
/// traffic, this instance's (each count with the most it may overestimate) and, with Redis, the
/// fleet's (the lists every instance published lately, summed).
#[utoipa::path(get, path = "/admin/v1/hot-keys", tag = "admin", operation_id = "hot_keys",
    params(("limit" = Option<u32>, Query, minimum = 1, maximum = 1000,
        description = "How many keys to list (default 100); the only parameter.")),
    responses(
        (status = 200, description = "The hottest items.", body = super::schemas::HotKeys),
        (status = 400, description = "`invalid_query`: a parameter other than `limit=N`, \
            1 ≤ N ≤ 1000.", body = super::schemas::ErrorEnvelope),
    ))]
pub(super) async fn hot_keys(
    State(state): State<AppState>,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, ApiError> {
    let limit = match query.as_deref().filter(|query| !query.is_empty()) {
        None => 100,
        Some(query) => super::slow_requests::parse_limit(query, MAX_HOT_KEYS)?,
    };
    let Some(hot_keys) = &state.hot_keys else {
        return Ok(Json(json!({"enabled": false})));
    };
    let fleet = match hot_keys.fleet_top(limit).await {
        None => Value::Null,
        Some(Ok(fleet)) => json!(fleet),
        Some(Err(error)) => {
            tracing::warn!(%error, "the fleet's hot keys could not be read");
            json!({"unavailable": "the fleet's list could not be read from Redis"})
        }
    };
    Ok(Json(json!({
        "enabled": true,
        "half_life_secs": hot_keys.half_life().as_secs(),
        "instance": hot_keys.local_top(limit),
        "fleet": fleet,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn healthy() -> Probes {
        Probes {
            phase: Phase::Serving,
            store_ok: true,
            cached_products: 0,
            redis: Some(true),
            events_connected: true,
            events_catch_up: None,
        }
    }

    #[test]
    fn an_event_version_may_be_written_with_a_zero_fraction_but_must_be_whole() {
        let version = |text: &str| {
            serde_json::from_str::<EventRequest>(&format!(
                r#"{{"kind":"rate_changed","platform":"jd","item_ids":["1"],"version":{text}}}"#
            ))
            .map(|request| request.version)
        };
        assert_eq!(version("411").unwrap(), 411);
        assert_eq!(version("411.0").unwrap(), 411);
        assert_eq!(version("4.11e2").unwrap(), 411);
        for refused in ["411.5", "-1", "-1.0", "1e300", "\"7\"", "null"] {
            assert!(version(refused).is_err(), "{refused}");
        }
    }

    #[test]
    fn operators_cannot_publish_a_rules_announcement() {
        for body in [
            r#"{"kind":"rules_changed","version":3}"#,
            r#"{"kind":"rules_changed","platform":"jd","item_ids":["1"],"version":3}"#,
        ] {
            let rejection =
                axum::Json::<EventRequest>::from_bytes(body.as_bytes()).expect_err("refused");
            // What `ApiJson` answers as a 400 `invalid_body` with this text.
            assert!(
                matches!(
                    rejection,
                    axum::extract::rejection::JsonRejection::JsonDataError(_)
                ),
                "{body}"
            );
            let message = rejection.body_text();
            assert!(
                message.contains(
                    "kind: `rules_changed` is announced by the service itself when a rule set \
                     changes; operators cannot publish it"
                ),
                "{body}: {message}"
            );
        }
        let item_event = serde_json::from_str::<EventRequest>(
            r#"{"kind":"item_delisted","platform":"jd","item_ids":["1"],"version":3}"#,
        )
        .expect("an item kind is accepted");
        assert_eq!(item_event.kind, EventKind::ItemDelisted);
    }

    #[test]
    fn a_serving_instance_with_its_store_is_ready_and_not_degraded() {
        let readiness = Readiness::assess(healthy());
        assert!(readiness.ready);
        assert_eq!(
            serde_json::to_value(&readiness).expect("serializes"),
            json!({"ready": true, "phase": "serving", "store": "ok", "redis": "ok",
                   "events": "connected", "degraded": []})
        );
    }

    #[test]
    fn broker_and_redis_outages_degrade_but_never_make_it_unready() {
        let readiness = Readiness::assess(Probes {
            redis: Some(false),
            events_connected: false,
            ..healthy()
        });
        assert!(readiness.ready);
        assert_eq!(readiness.redis, "down");
        assert_eq!(readiness.events, "disconnected");
        assert_eq!(readiness.degraded, ["redis", "events"]);
        let without_redis = Readiness::assess(Probes {
            redis: None,
            ..healthy()
        });
        assert_eq!(without_redis.redis, "disabled");
        assert!(without_redis.degraded.is_empty());
    }

    #[test]
    fn a_store_outage_is_unready_only_with_nothing_cached() {
        let nothing_cached = Readiness::assess(Probes {
            store_ok: false,
            ..healthy()
        });
        assert!(!nothing_cached.ready);
        assert_eq!(nothing_cached.store, "down");
        assert_eq!(nothing_cached.degraded, ["store"]);
        let from_cache = Readiness::assess(Probes {
            store_ok: false,
            cached_products: 1_000,
            ..healthy()
        });
        assert!(from_cache.ready, "answers come from L1");
        assert_eq!(from_cache.degraded, ["store"]);
    }

    #[test]
    fn starting_and_draining_instances_are_unready_whatever_their_dependencies() {
        for phase in [Phase::Starting, Phase::Draining] {
            let readiness = Readiness::assess(Probes { phase, ..healthy() });
            assert!(!readiness.ready, "{phase:?}");
            assert!(readiness.degraded.is_empty());
        }
        assert_eq!(
            serde_json::to_value(Phase::Draining).expect("serializes"),
            json!("draining")
        );
    }
}
