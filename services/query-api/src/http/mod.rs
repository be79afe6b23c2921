//! The REST edge: routes, the one error type, and the middleware every request passes.
//!
//! Order of the layers, outermost first: trace id and request metrics in one layer (sets
//! `x-trace-id`, renders error bodies; latency by route and final status, answers by outcome),
//! panic catcher, then
//! one layer for the stages every request passes in order ([`edge::gate`]: head caps (431, 414,
//! 413 on a declared length), per-client limit (429), body read (408, 413: the whole body arrives
//! before the request counts as load), load-shedding admission (stamps the shed level), request
//! timeout), body limit; then the routes. Connection-level bounds (header
//! and idle timeouts, connection caps) are the server loop's, in [`crate::server`].

pub mod admin;
pub mod edge;
mod error;
mod extract;
pub mod items;
pub mod middleware;
pub mod protect;
pub mod routes;
mod slow_requests;

use axum::Router;
use axum::extract::DefaultBodyLimit;

pub use error::{ApiError, ErrorBody};
pub use middleware::TRACE_ID_HEADER;

use crate::state::AppState;

/// The public API: the routes inside the [`edge::Edge`] stages.
pub fn router(state: AppState) -> edge::Edge {
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
    edge::Edge::new(routes, state, gate)
}
