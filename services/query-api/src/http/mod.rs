//! The REST edge: routes, the one error type, and the stages every request passes.
//!
//! The public listener serves [`service::Edge`]: one service around the router that runs, outermost
//! first, the trace stage (trace id, span and timeline; sets `x-trace-id`, renders error bodies;
//! latency by route and final status, answers by outcome; the slow-request log), the panic
//! catcher, then the [`edge::Gate`] stages in order (head checks (431, 414, 400 on `Host` and
//! `Transfer-Encoding`, 413 on a declared length, 415 on a compressed body), per-client limit
//! (429), body read (408, 413: the whole body arrives before the request counts as load; a chunk
//! announcing more than the limit is 413 at once), load-shedding admission (stamps the shed
//! level), request timeout), then the
//! routes (body limit); CORS (`cors`) answers an allowed origin's preflight before the gate and
//! adds its headers to every answer. The admin listener runs the same trace stage and gate as layers.
//! Connection-level bounds (header and idle timeouts, connection caps) are the server loop's, in
//! [`crate::server`].

pub mod admin;
pub mod admin_auth;
pub mod cors;
mod dashboard;
pub mod edge;
pub mod encoding;
mod error;
mod extract;
pub mod items;
pub mod middleware;
pub mod openapi;
pub mod protect;
pub mod routes;
mod rules;
pub mod schemas;
pub mod service;
mod slow_requests;
mod validators;

use axum::Router;
use axum::extract::DefaultBodyLimit;

pub use error::{ApiError, ErrorBody};
pub use middleware::TRACE_ID_HEADER;

use crate::state::AppState;

/// The admin listener: [`admin::router`] serving the OpenAPI document of both listeners.
pub fn admin_router(state: AppState, auth: admin_auth::AdminAuth) -> Router {
    admin::router(state, auth, openapi::render().into())
}

/// The public API: the routes inside the [`service::Edge`] stages.
pub fn router(state: AppState) -> service::Edge {
    let limits = std::sync::Arc::clone(&state.limits);
    let gate = edge::Gate {
        limits: std::sync::Arc::clone(&limits.edge),
        protection: Some(std::sync::Arc::clone(&state.protection)),
        timeout: limits.request_timeout,
    };
    let routes = Router::new()
        .merge(items::router())
        .fallback(|| async { ApiError::RouteNotFound })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(limits.body_limit_bytes))
        .with_state(state.clone());
    service::Edge::new(routes, state, gate)
}
